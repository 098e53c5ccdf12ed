"""Pure-Python twin of ``_native/dispatch.pyx``: the dispatch loop of a subscription."""

from __future__ import annotations


class Pending:
    """The twin of ``Pending`` in dispatch.pyx."""

    __slots__ = ("consumer", "count")

    def __init__(self, consumer, count):
        self.consumer = consumer
        self.count = count


def take_buffered(
    buffer,
    n,
    max_bytes,
    out,
    consumer,
    pending,
    counts,
    mark,
    acked,
    partly,
    holds,
    is_aborted,
    ledger_id,
    index,
    topic,
    pending_type,
    message_type,
    message_id_type,
):
    """The twin of ``take_buffered`` in dispatch.pyx, whose docstring states the contract."""
    delivered = nbytes = 0
    popleft = buffer.popleft
    while len(out) < n and buffer:
        item = popleft()
        key, payload = item
        entry_id, batch_index = key
        if (
            entry_id <= mark
            or entry_id in acked
            or key in pending
            or (
                batch_index >= 0
                and (acks := partly.get(entry_id)) is not None
                and acks.test(batch_index)
            )
            or (holds is not None and holds(entry_id, batch_index))
        ):
            continue
        data, properties, pkey, publish_time, batch_size, txn = payload[:6]
        if txn is not None and is_aborted(txn):
            return delivered, nbytes, entry_id
        if nbytes + len(data) > max_bytes and out:
            buffer.appendleft(item)
            return delivered, nbytes, -2
        count = counts.get(key, 0) if counts else 0
        pending[key] = pending_type(consumer, count)
        mid = (ledger_id, entry_id, index, batch_index, batch_size)
        if message_id_type is not None:
            mid = message_id_type(*mid)
        meta = payload[6:]  # (event_timestamp, ordering_key) of a message sent with them
        out.append(
            message_type(data, properties, pkey, mid, topic, publish_time, count, None, *meta[0])
            if meta
            else message_type(data, properties, pkey, mid, topic, publish_time, count)
        )
        delivered += 1
        nbytes += len(data)
    return delivered, nbytes, -1


def buffer_messages(
    append,
    entry_id,
    n,
    first,
    when,
    txn,
    some_acked,
    value_data,
    value_offsets,
    key_valid,
    key_offsets,
    key_data,
    props_of,
):
    """The twin of ``buffer_messages`` in dispatch.pyx, whose docstring states the contract."""
    batched = n > 1
    size = n if batched else 0
    added = 0
    for b in range(n):
        if some_acked is not None and some_acked.test(b):
            continue
        m = first + b
        pkey = None
        if key_valid[m]:
            lo, hi = int(key_offsets[m]), int(key_offsets[m + 1])
            pkey = bytes(key_data[lo:hi]).decode("utf-8", "surrogateescape")
        props = props_of(m) if props_of is not None else None
        lo, hi = int(value_offsets[m]), int(value_offsets[m + 1])
        value = bytes(value_data[lo:hi])
        append(((entry_id, b if batched else -1), (value, props, pkey, when, size, txn)))
        added += 1
    return added
