"""Topic names as Pulsar spells them: persistent://tenant/namespace/name, T-partition-N."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidTopicName

_PART = re.compile(r"[-=:.\w]+", re.ASCII)
_PARTITION = re.compile(r"^(.*)-partition-(0|[1-9][0-9]{0,5})$")
PARTITION_SUFFIX = "-partition-"
MAX_NAME_LENGTH = 512


@dataclass(frozen=True, order=True)
class TopicName:
    tenant: str
    namespace: str
    local_name: str

    @classmethod
    def parse(cls, name: object) -> TopicName:
        """A full (persistent://t/ns/name) or short (name, or t/ns/name) topic name."""
        if not isinstance(name, str):
            raise InvalidTopicName(
                f"topic name must be a str, not {type(name).__name__} ({name!r})"
            )
        if not name or len(name) > MAX_NAME_LENGTH:
            raise InvalidTopicName(
                f"invalid topic name {name!r}: empty or longer than {MAX_NAME_LENGTH}"
            )
        rest = name
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain != "persistent":
                raise InvalidTopicName(
                    f"invalid topic name {name!r}: only persistent:// topics are supported"
                )
            parts = rest.split("/")
            if len(parts) != 3:
                raise InvalidTopicName(
                    f"invalid topic name {name!r}: expected persistent://tenant/namespace/name"
                )
        else:
            parts = rest.split("/")
            if len(parts) == 1:
                parts = ["public", "default", parts[0]]
            elif len(parts) != 3:
                raise InvalidTopicName(
                    f"invalid topic name {name!r}: expected name or tenant/namespace/name"
                )
        for part in parts:
            if not _PART.fullmatch(part):
                raise InvalidTopicName(
                    f"invalid topic name {name!r}: {part!r} may only hold letters, digits, "
                    "and - = : . _"
                )
        return cls(*parts)

    @property
    def full(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.local_name}"

    def __str__(self) -> str:
        return self.full

    @property
    def partition_index(self) -> int:
        """N for T-partition-N, else -1."""
        m = _PARTITION.match(self.local_name)
        return int(m.group(2)) if m else -1

    @property
    def base(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        m = _PARTITION.match(self.local_name)
        return TopicName(self.tenant, self.namespace, m.group(1)) if m else self

    def partition(self, index: int) -> TopicName:
        return TopicName(self.tenant, self.namespace, f"{self.local_name}{PARTITION_SUFFIX}{index}")
