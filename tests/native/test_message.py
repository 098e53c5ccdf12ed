"""Message (native and twin): the accessors of API.md, an id given as its five fields made
into a MessageId when first asked for, repr and pickling; MessageId native == twin on any input."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pulsartxn
from pulsartxn._native import load
from pulsartxn.errors import InvalidMessageId
from pulsartxn.messaging.message import MessageId

IMPLS = [load("native"), load("reference")]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda ns: ns.kind)
def test_message_accessors_lazy_id_repr_and_pickle(impl):
    m = impl.Message(b"abc", {"k": "v"}, "pk", (7, 9, 2, 3, 10), "persistent://p/d/t", 123, 2)
    assert m.data() == m.value() == b"abc"
    props = m.properties()
    assert props == {"k": "v"}
    props["x"] = "y"
    assert m.properties() == {"k": "v"}  # a copy each time
    assert m.partition_key() == "pk"
    mid = m.message_id()
    assert mid == MessageId(7, 9, 2, 3, 10) and mid.batch_size() == 10
    assert m.message_id() is mid  # made once
    assert (m.topic_name(), m.publish_timestamp(), m.redelivery_count()) == (
        "persistent://p/d/t",
        123,
        2,
    )
    assert repr(m) == (
        "Message(topic='persistent://p/d/t', id=MessageId(ledger_id=7, entry_id=9, "
        "partition=2, batch_index=3), 3 bytes)"
    )
    plain = impl.Message(b"", None, None, MessageId(1, 2), "t", 0)
    assert plain.properties() == {} and plain.redelivery_count() == 0
    assert plain.message_id() == MessageId(1, 2)
    back = pickle.loads(pickle.dumps(m))
    assert (back.data(), back.message_id(), back.properties()) == (b"abc", mid, {"k": "v"})


def test_the_public_message_is_the_chosen_implementations():
    assert pulsartxn.Message is load(pulsartxn.IMPLEMENTATION).Message


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**63 - 1),
            st.integers(-1, 2**63 - 1),
            st.integers(-1, 2**31 - 1),
            st.integers(-1, 2**31 - 1),
            st.integers(0, 2**31 - 1),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_native_and_twin_message_ids_agree(fields):
    """MessageId (native and twin): the same accessors, order, equality and hash, repr, str
    and serialized bytes for the same fields; equal across the two; pickled and back."""
    native, twin = (load("native").MessageId, load("reference").MessageId)
    ns, ts = [native(*f) for f in fields], [twin(*f) for f in fields]
    for n, t, f in zip(ns, ts, fields):
        assert (n.ledger_id(), n.entry_id(), n.partition(), n.batch_index(), n.batch_size()) == f
        assert (t.ledger_id(), t.entry_id(), t.partition(), t.batch_index(), t.batch_size()) == f
        assert n == t and hash(n) == hash(t) and (repr(n), str(n)) == (repr(t), str(t))
        assert pickle.loads(pickle.dumps(n)) == n and pickle.loads(pickle.dumps(t)) == t
        if f[1] >= 0:
            assert n.serialize() == t.serialize()
            assert native.deserialize(t.serialize()) == n == twin.deserialize(n.serialize())
    order = sorted(range(len(fields)), key=lambda i: ns[i])
    assert [ts[i] for i in order] == sorted(ts)
    assert [ns[i] <= ns[j] for i in order for j in order] == [
        ts[i] <= ts[j] for i in order for j in order
    ]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda ns: ns.kind)
def test_a_message_id_refuses_what_is_not_one(impl):
    with pytest.raises(InvalidMessageId):
        impl.MessageId.deserialize(b"M1" + bytes(10))
    with pytest.raises(InvalidMessageId):  # an entry id past 2^63 - 1
        impl.MessageId.deserialize(b"M1" + bytes(8) + b"\xff" * 8 + bytes(12))
    with pytest.raises(TypeError):
        impl.MessageId.deserialize("M1")
    assert impl.MessageId(1, 2) != (1, 2, -1, -1)


def _outcome(call):
    """What a call answers: ("ok", value) or ("raised", its type and message)."""
    try:
        return ("ok", call())
    except Exception as exc:  # noqa: BLE001 - the outcome is compared, whatever it is
        return ("raised", type(exc), str(exc))


field = st.one_of(
    st.integers(-(2**64), 2**64),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**31 - 1, 2**31, -(2**31) - 1]),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.text(max_size=3),
)


@given(st.lists(field, min_size=0, max_size=6))
def test_native_and_twin_message_ids_check_their_fields_alike(fields):
    """Any arguments: the same MessageId from both, or the same error (TypeError for what is
    not an int, InvalidMessageId for an int out of its field's range)."""
    native, twin = (load("native").MessageId, load("reference").MessageId)
    n, t = _outcome(lambda: native(*fields)), _outcome(lambda: twin(*fields))
    if 2 <= len(fields) <= 5:
        assert n == t
        assert n[0] == "ok" or n[1] in (TypeError, InvalidMessageId)
    else:  # the arity error: Python's words differ between the two
        assert n[:2] == t[:2] == ("raised", TypeError)


@given(
    st.one_of(
        st.binary(max_size=40),
        st.binary(min_size=30, max_size=30).map(lambda b: b"M1" + b[2:]),
    )
)
def test_native_and_twin_deserialize_any_bytes_alike(data):
    native, twin = (load("native").MessageId, load("reference").MessageId)
    n, t = _outcome(lambda: native.deserialize(data)), _outcome(lambda: twin.deserialize(data))
    assert n == t
    if n[0] == "raised":
        assert n[1] is InvalidMessageId
    else:
        assert n[1].serialize() == data


received = st.lists(
    st.tuples(
        st.binary(max_size=12),
        st.none() | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
        st.none() | st.text(max_size=4),
        st.tuples(
            st.integers(0, 2**63 - 1),
            st.integers(0, 2**63 - 1),
            st.integers(-1, 2**31 - 1),
            st.integers(-1, 2**31 - 1),
            st.integers(0, 2**31 - 1),
        ),
        st.booleans(),  # the id as a MessageId, else as its five fields
        st.integers(0, 2**62),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**62),  # event time, 0: none
        st.none() | st.text(max_size=4),
    ),
    max_size=8,
)


@given(received)
def test_native_and_twin_message_columns_agree(rows):
    """message_fields (a dispatch batch's columns of received messages) and
    messages_from_fields (messages of such columns): the same columns from both, ids
    serialized as MessageId.serialize, and messages of those columns equal to the first."""
    native, twin = load("native"), load("reference")
    columns = []
    for impl in (native, twin):
        msgs = [
            impl.Message(
                d, p, k, impl.MessageId(*mid) if as_id else mid, "t", pub, red, None, ev, ok
            )
            for d, p, k, mid, as_id, pub, red, ev, ok in rows
        ]
        columns.append(impl.message_fields(msgs))
    n, t = columns
    assert n[0] == t[0] == b"".join(native.MessageId(*r[3]).serialize() for r in rows)
    assert [list(c) for c in n[1:]] == [list(c) for c in t[1:]]
    assert (n[5].typecode, n[6].typecode, n[7].typecode) == ("q", "i", "q")
    ids = [r[3] for r in rows]
    for impl in (native, twin):
        back = impl.messages_from_fields(ids, *n[1:])
        assert [
            (
                m.data(),
                m.properties(),
                m.partition_key(),
                m.message_id(),
                m.publish_timestamp(),
                m.redelivery_count(),
                m.event_timestamp(),
                m.ordering_key(),
            )
            for m in back
        ] == [
            (d, p or {}, k, native.MessageId(*mid), pub, red, ev, ok)
            for d, p, k, mid, _, pub, red, ev, ok in rows
        ]
