# cython: language_level=3, boundscheck=False, wraparound=False
"""The dispatch path of a subscription, per message: decoded entries into its read-ahead
(``buffer_messages``), and read-ahead into Messages for one consumer (``take_buffered``).

Every message a consumer receives passes through both once (``receive``, ``batch_receive``,
and the network service's flow). The subscription keeps its state (the read-ahead deque,
the pending deliveries, the cursor) and decides per entry (markers, aborted transactions,
what the cursor covers); these loops only walk its messages. The twin is
``reference/dispatch.py``.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Contains, PyDict_GetItem, PyDict_SetItem
from cpython.object cimport PyObject
from cpython.set cimport PySet_Contains
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t

from .ackset cimport AckSet
from .message cimport Message


cdef class Pending:
    """A message delivered and not yet acknowledged: the consumer it went to and the
    redelivery count of that delivery. No payload: a redelivery reads its entry again."""

    cdef public object consumer
    cdef public object count

    def __init__(self, consumer, count):
        self.consumer = consumer
        self.count = count


def take_buffered(
    object buffer,
    Py_ssize_t n,
    Py_ssize_t max_bytes,
    list out,
    object consumer,
    dict pending,
    dict counts,
    long long mark,
    set acked,
    dict partly,
    object holds,
    object is_aborted,
    object ledger_id,
    object index,
    object topic,
    object pending_type,
    object message_type,
    object message_id_type,
):
    """Move read-ahead items ``((entry, batch_index), payload)`` from the left of `buffer`
    (a payload of 7 carries the message's (event_timestamp, ordering_key))
    into `out` as Messages for `consumer` until `out` holds `n`, `buffer` is empty, or the
    next message's data would bring the bytes taken by this call past `max_bytes` while `out`
    is not empty (that item stays at the left of `buffer`: a larger message goes out alone).

    Skipped: an item already delivered and not acknowledged (in `pending`), at or below
    `mark`, in `acked`, acknowledged in its entry's batch (`partly`: entry -> AckSet), or held
    by a transaction's pending ack (``holds(entry, batch_index)``, when `holds` is given).
    Each delivery is recorded in `pending` as ``pending_type(consumer, count)``, the count
    taken from `counts`. Each Message gets ``message_id_type(ledger_id, entry, index,
    batch_index, batch_size)``, or with `message_id_type` None those five as a tuple (the
    Message makes its MessageId when first asked: most never are). Returns ``(delivered,
    nbytes, stop)``: `stop` is the entry id of a message whose transaction has aborted since
    it was read (read uncommitted; taken off the buffer, not delivered), after which the loop
    stops so that the caller acknowledges it internally and calls again with the cursor's new
    state; -2 when `max_bytes` stopped it; -1 otherwise."""
    cdef Py_ssize_t delivered = 0, nbytes = 0, size
    cdef long long entry_id, batch_index
    cdef tuple item, key, payload
    cdef object entry, bi, data, txn, acks, count, mid
    cdef PyObject *found
    cdef Pending held
    cdef AckSet ack_set
    cdef Message msg
    # The subscription's own types are built here without a call through Python.
    cdef bint plain_pending = pending_type is Pending
    cdef bint plain_message = message_type is Message
    popleft = buffer.popleft
    while len(out) < n and len(buffer):
        item = <tuple>popleft()
        key = <tuple>item[0]
        payload = <tuple>item[1]
        entry = key[0]
        bi = key[1]
        entry_id = entry
        batch_index = bi
        if entry_id <= mark or PySet_Contains(acked, entry) or PyDict_Contains(pending, key):
            continue
        if batch_index >= 0:
            found = PyDict_GetItem(partly, entry)
            if found is not NULL:
                acks = <object>found
                if type(acks) is AckSet and batch_index < (<AckSet>acks).nbits:
                    ack_set = <AckSet>acks
                    if (ack_set.words[batch_index >> 6] >> (batch_index & 63)) & 1:
                        continue
                elif acks.test(bi):
                    continue
        if holds is not None and holds(entry, bi):
            continue
        txn = payload[5]
        if txn is not None and is_aborted(txn):
            return delivered, nbytes, entry_id
        data = payload[0]
        size = len(data)
        if nbytes + size > max_bytes and len(out):
            buffer.appendleft(item)
            return delivered, nbytes, -2
        if counts:
            found = PyDict_GetItem(counts, key)
            count = <object>found if found is not NULL else 0
        else:
            count = 0
        if plain_pending:
            held = Pending.__new__(Pending)
            held.consumer = consumer
            held.count = count
            PyDict_SetItem(pending, key, held)
        else:
            PyDict_SetItem(pending, key, pending_type(consumer, count))
        if message_id_type is None:
            mid = (ledger_id, entry, index, bi, payload[4])
        else:
            mid = message_id_type(ledger_id, entry, index, bi, payload[4])
        if plain_message:
            msg = Message.__new__(Message)
            msg._data = data
            msg._properties = payload[1]
            msg._key = payload[2]
            msg._id = mid
            msg._topic = topic
            msg._publish_time = payload[3]
            msg._redelivery_count = count
            msg._txn = None
            if len(payload) > 6:  # (event_timestamp, ordering_key) of a message sent with them
                msg._meta = payload[6]
            out.append(msg)
        elif len(payload) > 6:
            out.append(message_type(data, payload[1], payload[2], mid, topic, payload[3], count,
                                    None, *payload[6]))
        else:
            out.append(message_type(data, payload[1], payload[2], mid, topic, payload[3], count))
        delivered += 1
        nbytes += size
    return delivered, nbytes, -1


def buffer_messages(
    object append,
    object entry_id,
    Py_ssize_t n,
    Py_ssize_t first,
    object when,
    object txn,
    object some_acked,
    const uint8_t[::1] value_data,
    const int64_t[::1] value_offsets,
    const uint8_t[::1] key_valid,
    const int64_t[::1] key_offsets,
    const uint8_t[::1] key_data,
    object props_of,
):
    """Append the `n` messages of one entry (decoded messages first..first+n-1) to a
    subscription's read-ahead through `append`, each as ``((entry_id, batch_index), (value,
    properties, key, publish_time, batch_size, txn))``; batch_index and batch_size are -1 and
    0 for an entry of one message. Skipped: batch indexes `some_acked` (an AckSet, or None)
    holds. ``props_of(m)`` makes message m's properties (a dict, or None when it has none);
    props_of None: no message has any. None rather than an empty dict keeps the item tuples
    free of containers, so the garbage collector stops tracking them (a consumer's read-ahead
    and its deliveries not yet acknowledged would otherwise be traversed by every collection).
    `key_valid` is the decoded bool column as uint8.
    Returns how many were appended."""
    cdef Py_ssize_t b, m, added = 0
    cdef int64_t lo, hi
    cdef bint batched = n > 1
    cdef object size = n if batched else 0
    cdef object pkey, props, value
    cdef const uint8_t *vd = &value_data[0] if value_data.shape[0] else NULL
    cdef const uint8_t *kd = &key_data[0] if key_data.shape[0] else NULL
    for b in range(n):
        if some_acked is not None and some_acked.test(b):
            continue
        m = first + b
        pkey = None
        if key_valid[m]:
            lo = key_offsets[m]
            hi = key_offsets[m + 1]
            pkey = PyUnicode_DecodeUTF8(<const char *>(kd + lo), hi - lo, "surrogateescape")
        props = props_of(m) if props_of is not None else None
        lo = value_offsets[m]
        hi = value_offsets[m + 1]
        value = PyBytes_FromStringAndSize(<const char *>(vd + lo), hi - lo)
        append(((entry_id, b if batched else -1), (value, props, pkey, when, size, txn)))
        added += 1
    return added
