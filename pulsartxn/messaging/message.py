"""MessageId and Message, as the Pulsar Python client shapes them (Message is native:
``_native/message.pyx``, its twin ``_native/reference/message.py``)."""

from __future__ import annotations

import struct
from functools import total_ordering

from .._native import Message
from ..errors import InvalidMessageId

_ID = struct.Struct("<2sQQiii")
_ID_MAGIC = b"M1"


@total_ordering
class MessageId:
    """Where a message is: ledger and entry, its index in a batched entry, and its partition.

    ``batch_index`` is -1 for an entry that holds one message; ``batch_size`` is the number of
    messages in the entry (what batch-index acknowledgement needs).
    """

    __slots__ = ("_ledger_id", "_entry_id", "_partition", "_batch_index", "_batch_size")

    def __init__(
        self,
        ledger_id: int,
        entry_id: int,
        partition: int = -1,
        batch_index: int = -1,
        batch_size: int = 0,
    ) -> None:
        self._ledger_id = ledger_id
        self._entry_id = entry_id
        self._partition = partition
        self._batch_index = batch_index
        self._batch_size = batch_size

    def ledger_id(self) -> int:
        return self._ledger_id

    def entry_id(self) -> int:
        return self._entry_id

    def partition(self) -> int:
        return self._partition

    def batch_index(self) -> int:
        return self._batch_index

    def batch_size(self) -> int:
        return self._batch_size

    def _key(self) -> tuple[int, int, int]:
        return (self._ledger_id, self._entry_id, self._batch_index)

    def __eq__(self, other):
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() == other._key() and self._partition == other._partition

    def __lt__(self, other):
        if not isinstance(other, MessageId):
            return NotImplemented
        return (self._key(), self._partition) < (other._key(), other._partition)

    def __hash__(self) -> int:
        return hash((self._key(), self._partition))

    def serialize(self) -> bytes:
        return _ID.pack(
            _ID_MAGIC,
            self._ledger_id,
            self._entry_id,
            self._partition,
            self._batch_index,
            self._batch_size,
        )

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"MessageId.deserialize takes bytes, not {type(data).__name__}")
        if len(data) != _ID.size or bytes(data[:2]) != _ID_MAGIC:
            raise InvalidMessageId(f"not a serialized MessageId: {bytes(data)[:32]!r}")
        _, ledger, entry, partition, batch_index, batch_size = _ID.unpack(bytes(data))
        return cls(ledger, entry, partition, batch_index, batch_size)

    def __repr__(self) -> str:
        return (
            f"MessageId(ledger_id={self._ledger_id}, entry_id={self._entry_id}, "
            f"partition={self._partition}, batch_index={self._batch_index})"
        )

    def __str__(self) -> str:
        return f"({self._ledger_id},{self._entry_id},{self._partition},{self._batch_index})"


__all__ = ["Message", "MessageId"]
