"""Topic names as Pulsar spells them: persistent://tenant/namespace/name, T-partition-N; and
the bounds that LMDB's keys set on them and on the names keyed under a partition."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidTopicName, excerpt

_PART = re.compile(r"[-=:.\w]+", re.ASCII)
_PARTITION = re.compile(r"^(.*)-partition-(0|[1-9][0-9]{0,5})$")
PARTITION_SUFFIX = "-partition-"
MAX_NAME_LENGTH = 512
# LMDB keys (and database names) are at most 511 bytes. A partition's full name names its
# ledger (`ledger/<name>`) and starts its keys; the longest key also holds a subscription's
# name: a pending ack, `<partition>\0<subscription>\0<txn id (16)><u32>`.
MAX_KEY_BYTES = 511
MAX_TOPIC_BYTES = 255  # a new topic's full name, with its partitions' suffix
MAX_STORED_TOPIC_BYTES = MAX_KEY_BYTES - len("ledger/")  # what an older broker could store
MAX_KEYED_NAME_BYTES = 200  # subscription and producer names
_KEY_OVERHEAD = 22


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
                f"topic name must be a str, not {type(name).__name__} ({excerpt(name)})"
            )
        if not name or len(name) > MAX_NAME_LENGTH:
            raise InvalidTopicName(
                f"invalid topic name {excerpt(name)}: empty or longer than {MAX_NAME_LENGTH}"
            )
        rest = name
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain != "persistent":
                raise InvalidTopicName(
                    f"invalid topic name {excerpt(name)}: only persistent:// topics are supported"
                )
            parts = rest.split("/")
            if len(parts) != 3:
                raise InvalidTopicName(
                    f"invalid topic name {excerpt(name)}: expected persistent://tenant/namespace/name"
                )
        else:
            parts = rest.split("/")
            if len(parts) == 1:
                parts = ["public", "default", parts[0]]
            elif len(parts) != 3:
                raise InvalidTopicName(
                    f"invalid topic name {excerpt(name)}: expected name or tenant/namespace/name"
                )
        for part in parts:
            if not _PART.fullmatch(part):
                raise InvalidTopicName(
                    f"invalid topic name {excerpt(name)}: {excerpt(part)} may only hold letters, "
                    "digits, and - = : . _"
                )
        topic = cls(*parts)
        if len(topic.full) > MAX_STORED_TOPIC_BYTES:
            raise InvalidTopicName(
                f"invalid topic name {excerpt(name)}: {len(topic.full)} bytes in full, over "
                f"{MAX_TOPIC_BYTES}"
            )
        return topic

    def check_new(self, partitions: int) -> None:
        """InvalidTopicName unless this topic's name, and its partitions' names, fit in the
        keys built on them (checked before a topic is created)."""
        longest = self.partition(partitions - 1).full if partitions else self.full
        if len(longest) > MAX_TOPIC_BYTES:
            what = f"with the suffix of partition {partitions - 1} " if partitions else ""
            raise InvalidTopicName(
                f"topic name {excerpt(self.full)} is {len(longest)} bytes in full {what}"
                f"(at most {MAX_TOPIC_BYTES})"
            )

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


def check_keyed_name(what: str, name: object, partitions=()) -> None:
    """ValueError unless `name` (a subscription or producer name) is text without NUL (it
    separates the parts of keys) that fits in the keys under each partition named."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise ValueError(f"{what} must be a non-empty str without NUL, not {excerpt(name)}")
    try:
        n = len(name.encode())
    except UnicodeEncodeError:
        raise ValueError(f"{what} {excerpt(name)} is not valid Unicode text") from None
    limit = MAX_KEYED_NAME_BYTES
    for partition in partitions:  # only a topic an older broker created can leave less
        limit = min(limit, MAX_KEY_BYTES - _KEY_OVERHEAD - len(partition))
    if n > limit:
        raise ValueError(f"{what} {excerpt(name)} is {n} bytes, over {limit}")
