"""Twin of ``_native/message.pyx``: a message's id and a received message."""

from __future__ import annotations

import array
import struct
from functools import total_ordering

from ...errors import InvalidMessageId
from ..checks import as_int

_ID = struct.Struct("<2sqqiii")  # signed: MessageId.earliest is (-1, -1)
_ID_MAGIC = b"M1"
_MAX = (1 << 63) - 1
_I64 = (-(1 << 63), _MAX)
_I32 = (-(1 << 31), (1 << 31) - 1)


def _field(value, what: str, bounds: tuple[int, int]) -> int:
    """A field of a MessageId: an int (bool refused: TypeError) within `bounds`, else
    InvalidMessageId; the same check and words as the native one's."""
    if type(value) is not int:
        value = as_int(value, what)
    if not bounds[0] <= value <= bounds[1]:
        raise InvalidMessageId(f"{what} must be in {bounds[0]}..{bounds[1]}, not {value}")
    return value


class _Position:
    """A class attribute naming a fixed position (MessageId.earliest, .latest): the owner's
    MessageId of these fields, made on first use (the class does not exist before)."""

    def __init__(self, ledger_id: int, entry_id: int) -> None:
        self._fields = (ledger_id, entry_id)
        self._value = None

    def __get__(self, obj, owner):
        if self._value is None:
            self._value = owner(*self._fields)
        return self._value


@total_ordering
class MessageId:
    """Where a message is: ledger and entry, its index in a batched entry, and its partition.

    ``batch_index`` is -1 for an entry that holds one message; ``batch_size`` is the number of
    messages in the entry (what batch-index acknowledgement needs). ``MessageId.earliest``
    and ``MessageId.latest`` are pulsar-client's: before the first message and after the last
    of any partition.
    """

    earliest = _Position(-1, -1)
    latest = _Position(_MAX, _MAX)

    __slots__ = ("_ledger_id", "_entry_id", "_partition", "_batch_index", "_batch_size")

    def __init__(
        self,
        ledger_id: int,
        entry_id: int,
        partition: int = -1,
        batch_index: int = -1,
        batch_size: int = 0,
    ) -> None:
        self._ledger_id = _field(ledger_id, "ledger_id", _I64)
        self._entry_id = _field(entry_id, "entry_id", _I64)
        self._partition = _field(partition, "partition", _I32)
        self._batch_index = _field(batch_index, "batch_index", _I32)
        self._batch_size = _field(batch_size, "batch_size", _I32)

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

    # A value: equal to the native MessageId of the same fields too.
    def __eq__(self, other):
        if not hasattr(other, "_batch_index") or not hasattr(other, "_ledger_id"):
            return NotImplemented
        return self._key() == other._key() and self._partition == other._partition

    def __lt__(self, other):
        if not hasattr(other, "_batch_index") or not hasattr(other, "_ledger_id"):
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
        if (ledger < 0 or entry < 0) and (ledger, entry) != (-1, -1):  # only earliest's
            raise InvalidMessageId(f"not a serialized MessageId: {bytes(data)[:32]!r}")
        return cls(ledger, entry, partition, batch_index, batch_size)

    def __repr__(self) -> str:
        return (
            f"MessageId(ledger_id={self._ledger_id}, entry_id={self._entry_id}, "
            f"partition={self._partition}, batch_index={self._batch_index})"
        )

    def __str__(self) -> str:
        return f"({self._ledger_id},{self._entry_id},{self._partition},{self._batch_index})"


class Message:
    """A received message. Its id may be given as the five fields of a MessageId (a tuple):
    the MessageId is then made when first asked for."""

    __slots__ = (
        "_data",
        "_properties",
        "_key",
        "_id",
        "_topic",
        "_publish_time",
        "_redelivery_count",
        "_txn",
        "_meta",
    )

    def __init__(
        self,
        data: bytes,
        properties: dict,
        key: str | None,
        message_id: MessageId | tuple,
        topic: str,
        publish_time: int,
        redelivery_count: int = 0,
        txn=None,
        event_timestamp: int = 0,
        ordering_key: str | None = None,
    ) -> None:
        self._data = data
        self._properties = properties
        self._key = key
        self._id = message_id
        self._topic = topic
        self._publish_time = publish_time
        self._redelivery_count = redelivery_count
        self._txn = txn
        has_meta = event_timestamp or ordering_key is not None
        self._meta = (event_timestamp, ordering_key) if has_meta else None

    def data(self) -> bytes:
        return self._data

    def value(self) -> bytes:
        return self._data

    def properties(self) -> dict:
        return dict(self._properties) if self._properties else {}

    def partition_key(self) -> str | None:
        return self._key

    def message_id(self) -> MessageId:
        mid = self._id
        if type(mid) is tuple:
            # Delivered with the id's fields: made on first use (most messages never are).
            mid = self._id = MessageId(*mid)
        return mid

    def topic_name(self) -> str:
        return self._topic

    def publish_timestamp(self) -> int:
        return self._publish_time

    def redelivery_count(self) -> int:
        return self._redelivery_count

    def event_timestamp(self) -> int:
        """The event time the producer set (ms since the epoch), 0 when none."""
        return self._meta[0] if self._meta is not None else 0

    def ordering_key(self) -> str | None:
        """The ordering key the producer set, None when none."""
        return self._meta[1] if self._meta is not None else None

    def __repr__(self) -> str:
        return f"Message(topic={self._topic!r}, id={self.message_id()!r}, {len(self._data)} bytes)"


def message_fields(msgs: list) -> tuple:
    """The fields of received messages as columns (a dispatch batch's): ``(ids, data,
    properties, keys, topics, publish times, redelivery counts, event times, ordering
    keys)``. The ids are their ``serialize()`` bytes end to end; the times and counts are
    arrays (int64, int32, int64); properties None when there are none."""
    ids = []
    for m in msgs:
        mid = m._id
        if type(mid) is tuple:
            mid = MessageId(*mid)
        ids.append(mid.serialize())
    metas = [m._meta or (0, None) for m in msgs]
    return (
        b"".join(ids),
        [m._data for m in msgs],
        [m._properties or None for m in msgs],
        [m._key for m in msgs],
        [m._topic for m in msgs],
        array.array("q", [m._publish_time for m in msgs]),
        array.array("i", [m._redelivery_count for m in msgs]),
        array.array("q", [meta[0] for meta in metas]),
        [meta[1] for meta in metas],
    )


def messages_from_fields(ids, data, props, keys, topics, pubs, reds, events, okeys) -> list:
    """Messages of columns as ``message_fields`` gives them (an id as its five fields, made
    into a MessageId when first asked for; properties None or a dict)."""
    return [
        Message(d, p, k, i, t, pub, r, None, e, o)
        for i, d, p, k, t, pub, r, e, o in zip(
            ids, data, props, keys, topics, pubs, reds, events, okeys
        )
    ]
