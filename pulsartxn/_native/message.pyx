# cython: language_level=3
"""A received message (API.md: ``Message``), native: the dispatch loop
(``dispatch.take_buffered``) fills its fields in C, where a Python class cost a call of its
``__init__`` per message. Its fields are declared in message.pxd, for dispatch to cimport.
The twin is ``reference/message.py``.
"""

from cpython cimport array
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, int64_t, uint32_t, uint64_t

import array as _array

import struct

from pulsartxn.errors import InvalidMessageId

from .checks import as_int

_ID = struct.Struct("<2sqqiii")  # signed: MessageId.earliest is (-1, -1)
_ID_MAGIC = b"M1"
cdef enum:
    _ID_SIZE = 30  # _ID.size
cdef array.array _I64_ARRAY = _array.array("q")
cdef array.array _I32_ARRAY = _array.array("i")
cdef int64_t _I64_MIN = -0x7FFFFFFFFFFFFFFF - 1
cdef int64_t _I64_MAX = 0x7FFFFFFFFFFFFFFF


cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object value, int *overflow)  # value: an int


cdef int64_t _checked(object value, str what, int64_t lo, int64_t hi) except? -1:
    """A field of a MessageId: an int-like (bool refused: TypeError) within lo..hi, else
    InvalidMessageId; the same check and words as the twin's."""
    cdef int overflow = 0
    cdef int64_t v
    value = as_int(value, what)
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow or v < lo or v > hi:
        raise InvalidMessageId(f"{what} must be in {lo}..{hi}, not {value}")
    return v


class _Position:
    """A class attribute naming a fixed position (MessageId.earliest, .latest): the owner's
    MessageId of these fields, made on first use (the class does not exist before)."""

    def __init__(self, ledger_id, entry_id):
        self._fields = (ledger_id, entry_id)
        self._value = None

    def __get__(self, obj, owner):
        if self._value is None:
            self._value = owner(*self._fields)
        return self._value


cdef class MessageId:
    """Where a message is: ledger and entry, its index in a batched entry, and its partition.

    ``batch_index`` is -1 for an entry that holds one message; ``batch_size`` is the number of
    messages in the entry (what batch-index acknowledgement needs). Ordered by (ledger, entry,
    batch index, partition), hashable, picklable. The twin is ``reference/message.py``.
    ``MessageId.earliest`` and ``MessageId.latest`` are pulsar-client's: before the first
    message and after the last of any partition.
    """

    earliest = _Position(-1, -1)
    latest = _Position(_I64_MAX, _I64_MAX)

    def __init__(self, ledger_id, entry_id, partition=-1, batch_index=-1, batch_size=0):
        cdef int64_t ledger, entry
        cdef int32_t part, index, size
        if (
            type(ledger_id) is int
            and type(entry_id) is int
            and type(partition) is int
            and type(batch_index) is int
            and type(batch_size) is int
        ):
            try:
                ledger, entry, part, index, size = (
                    ledger_id, entry_id, partition, batch_index, batch_size
                )
            except OverflowError:
                pass  # the checks below name the field
            else:
                self._ledger_id, self._entry_id, self._partition = ledger, entry, part
                self._batch_index, self._batch_size = index, size
                return
        self._ledger_id = _checked(ledger_id, "ledger_id", _I64_MIN, _I64_MAX)
        self._entry_id = _checked(entry_id, "entry_id", _I64_MIN, _I64_MAX)
        self._partition = <int32_t>_checked(partition, "partition", INT32_MIN, INT32_MAX)
        self._batch_index = <int32_t>_checked(batch_index, "batch_index", INT32_MIN, INT32_MAX)
        self._batch_size = <int32_t>_checked(batch_size, "batch_size", INT32_MIN, INT32_MAX)

    def ledger_id(self):
        return self._ledger_id

    def entry_id(self):
        return self._entry_id

    def partition(self):
        return self._partition

    def batch_index(self):
        return self._batch_index

    def batch_size(self):
        return self._batch_size

    def _key(self):
        return (self._ledger_id, self._entry_id, self._batch_index)

    def __richcmp__(self, other, int op):
        cdef MessageId o
        # A value: equal to the twin's MessageId of the same fields too.
        if isinstance(other, MessageId):
            o = <MessageId>other
            b = (o._ledger_id, o._entry_id, o._batch_index, o._partition)
        elif hasattr(other, "_batch_index") and hasattr(other, "_ledger_id"):
            b = (other._ledger_id, other._entry_id, other._batch_index, other._partition)
        else:
            return NotImplemented
        a = (self._ledger_id, self._entry_id, self._batch_index, self._partition)
        if op == 0:
            return a < b
        if op == 1:
            return a <= b
        if op == 2:
            return a == b
        if op == 3:
            return a != b
        if op == 4:
            return a > b
        return a >= b

    def __hash__(self):
        return hash(((self._ledger_id, self._entry_id, self._batch_index), self._partition))

    def serialize(self):
        return _ID.pack(_ID_MAGIC, self._ledger_id, self._entry_id, self._partition,
                        self._batch_index, self._batch_size)

    @classmethod
    def deserialize(cls, data):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"MessageId.deserialize takes bytes, not {type(data).__name__}")
        if len(data) != _ID.size or bytes(data[:2]) != _ID_MAGIC:
            raise InvalidMessageId(f"not a serialized MessageId: {bytes(data)[:32]!r}")
        _, ledger, entry, partition, batch_index, batch_size = _ID.unpack(bytes(data))
        if (ledger < 0 or entry < 0) and (ledger, entry) != (-1, -1):  # only earliest's
            raise InvalidMessageId(f"not a serialized MessageId: {bytes(data)[:32]!r}")
        return cls(ledger, entry, partition, batch_index, batch_size)

    def __reduce__(self):
        return (MessageId, (self._ledger_id, self._entry_id, self._partition,
                            self._batch_index, self._batch_size))

    def __repr__(self):
        return (
            f"MessageId(ledger_id={self._ledger_id}, entry_id={self._entry_id}, "
            f"partition={self._partition}, batch_index={self._batch_index})"
        )

    def __str__(self):
        return f"({self._ledger_id},{self._entry_id},{self._partition},{self._batch_index})"


cdef MessageId new_message_id(int64_t ledger_id, int64_t entry_id, int32_t partition,
                              int32_t batch_index, int32_t batch_size):
    """A MessageId made in C (no call of its __init__): what a durable batch's futures and
    the dispatch loop's messages answer."""
    cdef MessageId mid = MessageId.__new__(MessageId)
    mid._ledger_id = ledger_id
    mid._entry_id = entry_id
    mid._partition = partition
    mid._batch_index = batch_index
    mid._batch_size = batch_size
    return mid


cdef object message_id_type():
    return MessageId


cdef class Message:
    """A received message. Its id may be given as the five fields of a MessageId (a tuple):
    the MessageId is then made when first asked for."""

    def __init__(self, data, properties, key, message_id, topic, publish_time,
                 redelivery_count=0, txn=None, event_timestamp=0, ordering_key=None):
        self._data = data
        self._properties = properties
        self._key = key
        self._id = message_id
        self._topic = topic
        self._publish_time = publish_time
        self._redelivery_count = redelivery_count
        self._txn = txn
        if event_timestamp or ordering_key is not None:
            self._meta = (event_timestamp, ordering_key)

    def data(self):
        return self._data

    def value(self):
        return self._data

    def properties(self):
        return dict(self._properties) if self._properties else {}

    def partition_key(self):
        return self._key

    def message_id(self):
        mid = self._id
        if type(mid) is tuple:
            # Delivered with the id's fields: made on first use (most messages never are).
            mid = self._id = new_message_id(mid[0], mid[1], mid[2], mid[3], mid[4])
        return mid

    def topic_name(self):
        return self._topic

    def publish_timestamp(self):
        return self._publish_time

    def redelivery_count(self):
        return self._redelivery_count

    def event_timestamp(self):
        """The event time the producer set (ms since the epoch), 0 when none."""
        return self._meta[0] if self._meta is not None else 0

    def ordering_key(self):
        """The ordering key the producer set, None when none."""
        return self._meta[1] if self._meta is not None else None

    def __repr__(self):
        return f"Message(topic={self._topic!r}, id={self.message_id()!r}, {len(self._data)} bytes)"


def message_fields(list msgs):
    """The fields of received messages as columns (a dispatch batch's): ``(ids, data,
    properties, keys, topics, publish times, redelivery counts, event times, ordering
    keys)``. The ids are their ``serialize()`` bytes end to end; the times and counts are
    arrays (int64, int32, int64); properties None when there are none."""
    cdef Py_ssize_t i, n = len(msgs)
    cdef Message m
    cdef MessageId mid
    cdef bytearray packed = bytearray(n * _ID.size)
    cdef unsigned char[:] out = packed
    cdef array.array pubs = array.clone(_I64_ARRAY, n, zero=False)
    cdef array.array reds = array.clone(_I32_ARRAY, n, zero=False)
    cdef array.array events = array.clone(_I64_ARRAY, n, zero=True)
    data, props, keys, topics, okeys = [None] * n, [None] * n, [None] * n, [None] * n, [None] * n
    for i in range(n):
        m = <Message?>msgs[i]
        if type(m._id) is tuple:
            mid = new_message_id(m._id[0], m._id[1], m._id[2], m._id[3], m._id[4])
        else:
            mid = <MessageId?>m._id
        _pack_id(&out[i * _ID_SIZE], mid)
        data[i] = m._data
        if m._properties:
            props[i] = m._properties
        keys[i] = m._key
        topics[i] = m._topic
        pubs.data.as_longlongs[i] = m._publish_time
        reds.data.as_ints[i] = m._redelivery_count
        if m._meta is not None:
            events.data.as_longlongs[i] = m._meta[0]
            okeys[i] = m._meta[1]
    return bytes(packed), data, props, keys, topics, pubs, reds, events, okeys


cdef inline void _put(unsigned char *at, uint64_t value, int width) noexcept:
    cdef int k
    for k in range(width):
        at[k] = (value >> (8 * k)) & 0xFF


cdef void _pack_id(unsigned char *at, MessageId mid) noexcept:
    """``mid.serialize()`` written at `at` (_ID_SIZE bytes, little-endian as _ID)."""
    at[0], at[1] = 77, 49  # _ID_MAGIC, b"M1"
    _put(at + 2, <uint64_t>mid._ledger_id, 8)
    _put(at + 10, <uint64_t>mid._entry_id, 8)
    _put(at + 18, <uint32_t>mid._partition, 4)
    _put(at + 22, <uint32_t>mid._batch_index, 4)
    _put(at + 26, <uint32_t>mid._batch_size, 4)


def messages_from_fields(ids, data, props, keys, topics, pubs, reds, events, okeys):
    """Messages of columns as ``message_fields`` gives them (an id as its five fields, made
    into a MessageId when first asked for; properties None or a dict)."""
    cdef Py_ssize_t i, n = len(data)
    cdef Message m
    out = [None] * n
    for i in range(n):
        m = Message.__new__(Message)
        m._data = data[i]
        m._properties = props[i]
        m._key = keys[i]
        m._id = ids[i]
        m._topic = topics[i]
        m._publish_time = pubs[i]
        m._redelivery_count = reds[i]
        if events[i] or okeys[i] is not None:
            m._meta = (events[i], okeys[i])
        out[i] = m
    return out
