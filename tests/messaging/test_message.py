"""Message (native and twin): the accessors of API.md, an id given as its five fields made
into a MessageId when first asked for, repr and pickling."""

from __future__ import annotations

import pickle

import pytest

import pulsartxn
from pulsartxn._native import load
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
