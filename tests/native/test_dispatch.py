"""The dispatch loops of a subscription: native == twin on random read-aheads, cursors, pending
deliveries, byte budgets and decoded entries, and the outcome a model of the rules predicts."""

from __future__ import annotations

import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsartxn._native import load
from pulsartxn.messaging.message import MessageId

NATIVE, REFERENCE = load("native"), load("reference")
CONSUMER = object()


@st.composite
def read_aheads(draw):
    """(buffer items, mark, acked, partly bits, pending keys, held keys, aborted txns, counts,
    n, use_holds, max_bytes, already out): a read-ahead over entries 0..11 of up to 4
    messages each."""
    items = []
    for entry in range(12):
        size = draw(st.integers(1, 4))
        txn = draw(st.sampled_from([None, None, 7, 8]))
        for b in range(size):
            data = draw(st.binary(max_size=6))
            props = draw(st.sampled_from([None, {"k": "v"}]))
            key = draw(st.sampled_from([None, "a"]))
            bi, bsize = (b, size) if size > 1 else (-1, 0)
            items.append(((entry, bi), (data, props, key, 1000 + entry, bsize, txn)))
    keys = [k for k, _ in items]
    mark = draw(st.integers(-1, 4))
    acked = set(draw(st.lists(st.integers(0, 11), max_size=4)))
    partly = {
        e: draw(st.sets(st.integers(0, 3), max_size=3))
        for e in draw(st.lists(st.integers(0, 11), max_size=4, unique=True))
    }
    pending = set(draw(st.lists(st.sampled_from(keys), max_size=5)))
    held = set(draw(st.lists(st.sampled_from(keys), max_size=5)))
    aborted = set(draw(st.lists(st.sampled_from([7, 8]), max_size=1)))
    counts = {k: draw(st.integers(1, 3)) for k in draw(st.lists(st.sampled_from(keys), max_size=4))}
    n = draw(st.integers(1, 60))
    use_holds = draw(st.booleans())
    max_bytes = draw(st.one_of(st.integers(-3, 30), st.just(1 << 40)))
    already = draw(st.integers(0, 2))  # messages a caller took before, from elsewhere
    return (
        items,
        mark,
        acked,
        partly,
        pending,
        held,
        aborted,
        counts,
        n,
        use_holds,
        max_bytes,
        already,
    )


def _take(impl, case):
    items, mark, acked, partly, pending_keys, held, aborted, counts, n, use_holds = case[:10]
    max_bytes, already = case[10:]
    buffer = collections.deque(items)
    out: list = ["before"] * already
    pending = {k: impl.Pending(None, 0) for k in pending_keys}
    ack_sets = {}
    for e, bits in partly.items():
        s = impl.AckSet(4)
        for b in bits:
            s.set(b)
        ack_sets[e] = s
    holds = (lambda e, b: (e, b) in held) if use_holds else None
    result = impl.take_buffered(
        buffer,
        n,
        max_bytes,
        out,
        CONSUMER,
        pending,
        dict(counts),
        mark,
        set(acked),
        ack_sets,
        holds,
        aborted.__contains__,
        3,
        2,
        "persistent://public/default/t-partition-2",
        impl.Pending,
        impl.Message,
        MessageId,
    )
    messages = [
        (
            m.data(),
            m.properties(),
            m.partition_key(),
            m.message_id(),
            m.message_id().batch_size(),
            m.topic_name(),
            m.publish_timestamp(),
            m.redelivery_count(),
        )
        for m in out[already:]
    ]
    delivered = {k: (p.consumer is CONSUMER, p.count) for k, p in pending.items()}
    return result, messages, delivered, list(buffer)


def _model(case):
    """What the rules say: in order, skip what the cursor, a pending delivery or a held ack
    covers; stop at an aborted transaction's message (taken off), once n are out, or before a
    message that would bring the bytes past max_bytes when something is out already (left)."""
    items, mark, acked, partly, pending_keys, held, aborted, counts, n, use_holds = case[:10]
    max_bytes, already = case[10:]
    out, nbytes = [], 0
    rest = list(items)
    while rest and already + len(out) < n:
        (entry, bi), payload = rest[0]
        rest.pop(0)
        if (
            entry <= mark
            or entry in acked
            or (entry, bi) in pending_keys
            or (bi >= 0 and bi in partly.get(entry, ()))
            or (use_holds and (entry, bi) in held)
        ):
            continue
        if payload[5] is not None and payload[5] in aborted:
            return (len(out), nbytes, entry), out, rest
        if nbytes + len(payload[0]) > max_bytes and already + len(out) > 0:
            rest.insert(0, ((entry, bi), payload))
            return (len(out), nbytes, -2), out, rest
        out.append(((entry, bi), counts.get((entry, bi), 0)))
        nbytes += len(payload[0])
    return (len(out), nbytes, -1), out, rest


@settings(max_examples=300, deadline=None)
@given(read_aheads())
def test_take_buffered_native_equals_twin_equals_the_rules(case):
    native = _take(NATIVE, case)
    assert native == _take(REFERENCE, case)
    result, messages, delivered, rest = native
    expected, out, expected_rest = _model(case)
    assert result == expected
    assert [(m[3].entry_id(), m[3].batch_index()) for m in messages] == [k for k, _ in out]
    assert [m[7] for m in messages] == [c for _, c in out]
    assert all(m[3].ledger_id() == 3 and m[3].partition() == 2 for m in messages)
    assert rest == expected_rest
    for key, count in out:
        assert delivered[key] == (True, count)
    # Within the budget, but for a message larger than it taken first (alone).
    assert expected[1] <= max(case[10], 0) or (len(out) == 1 and case[11] == 0)


@st.composite
def decoded_entries(draw):
    """Columns of decoded messages as the entry decoder gives them, and one entry in them."""
    msgs = draw(
        st.lists(
            st.tuples(
                st.binary(max_size=8),
                st.one_of(st.none(), st.text(max_size=4)),
                st.one_of(st.none(), st.dictionaries(st.text(max_size=2), st.text(max_size=2))),
            ),
            min_size=1,
            max_size=12,
        )
    )
    first = draw(st.integers(0, len(msgs) - 1))
    n = draw(st.integers(1, len(msgs) - first))
    acked = draw(st.one_of(st.none(), st.sets(st.integers(0, n - 1))))
    any_props = draw(st.booleans())
    return msgs, first, n, acked, any_props


def _columns(msgs):
    values = [v for v, _, _ in msgs]
    keys = [(k or "").encode("utf-8", "surrogateescape") for _, k, _ in msgs]
    value_offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int64)
    key_offsets = np.cumsum([0] + [len(k) for k in keys]).astype(np.int64)
    value_data = np.frombuffer(b"".join(values), np.uint8).copy()
    key_data = np.frombuffer(b"".join(keys), np.uint8).copy()
    key_valid = np.array([k is not None for _, k, _ in msgs], np.bool_).view(np.uint8)
    return value_data, value_offsets, key_valid, key_offsets, key_data


@settings(max_examples=300, deadline=None)
@given(decoded_entries())
def test_buffer_messages_native_equals_twin_equals_the_columns(case):
    msgs, first, n, acked, any_props = case
    columns = _columns(msgs)
    results = []
    for impl in (NATIVE, REFERENCE):
        some_acked = None
        if acked is not None:
            some_acked = impl.AckSet(n)
            for b in acked:
                some_acked.set(b)
        got: list = []
        props_of = (lambda m: msgs[m][2] or None) if any_props else None
        added = impl.buffer_messages(
            got.append, 41, n, first, 1234, None, some_acked, *columns, props_of
        )
        assert added == len(got)
        results.append(got)
    assert results[0] == results[1]
    batched = n > 1
    expected = [
        (
            (41, b if batched else -1),
            (
                msgs[first + b][0],
                (msgs[first + b][2] or None) if any_props else None,
                msgs[first + b][1],
                1234,
                n if batched else 0,
                None,
            ),
        )
        for b in range(n)
        if acked is None or b not in acked
    ]
    assert results[0] == expected


@settings(max_examples=100, deadline=None)
@given(read_aheads())
def test_take_buffered_fills_native_messages_and_calls_any_other_message_type(case):
    """The native loop fills its own Message in C; another message type (the twin's) is
    called; the messages are the same either way."""
    items = case[0]
    seen = []
    for impl, message_type in (
        (NATIVE, NATIVE.Message),
        (NATIVE, REFERENCE.Message),
        (REFERENCE, REFERENCE.Message),
    ):
        out: list = []
        impl.take_buffered(
            collections.deque(items),
            len(items),
            1 << 40,
            out,
            CONSUMER,
            {},
            {},
            -1,
            set(),
            {},
            None,
            lambda t: False,
            3,
            2,
            "t",
            impl.Pending,
            message_type,
            None,
        )
        assert all(type(m) is message_type for m in out)
        seen.append([(m.data(), m.properties(), m.message_id(), m.redelivery_count()) for m in out])
    assert seen[0] == seen[1] == seen[2]
