"""Message metadata on send (pulsar-client's ordering_key, event_timestamp) on both clients:
stored per message, received back, validated before anything is sent."""

from __future__ import annotations

import datetime
import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType, InitialPosition


def _subscribe(client, topic, name="s", **kw):
    return client.subscribe(topic, name, initial_position=InitialPosition.Earliest, **kw)


def test_fields_round_trip_on_send_and_send_async(client):
    p = client.create_producer("meta-rt")
    p.send(b"plain")
    p.send(b"a", ordering_key="ok-a", event_timestamp=1_700_000_000_123, properties={"x": "y"})
    p.send_async(b"b", ordering_key=b"ok-b", partition_key="pk").result()
    called = []
    fut = p.send_async(b"c", lambda res, mid: called.append((res, mid)), event_timestamp=5)
    assert called == [] or called[0][0] is pulsartxn.Result.Ok
    mid = fut.result()
    deadline = time.monotonic() + 5
    while not called and time.monotonic() < deadline:
        time.sleep(0.01)
    assert called == [(pulsartxn.Result.Ok, mid)]
    p.send(b"after")
    c = _subscribe(client, "meta-rt")
    got = [c.receive(5000) for _ in range(5)]
    assert [m.data() for m in got] == [b"plain", b"a", b"b", b"c", b"after"]
    assert [m.event_timestamp() for m in got] == [0, 1_700_000_000_123, 0, 5, 0]
    assert [m.ordering_key() for m in got] == [None, "ok-a", "ok-b", None, None]
    assert got[1].properties() == {"x": "y"} and got[2].partition_key() == "pk"
    # batch_receive and a scan carry them too (the scan's schema is unchanged).
    c2 = _subscribe(client, "meta-rt", "s2")
    batch = c2.batch_receive(10, 2000)
    assert [m.ordering_key() for m in batch] == [None, "ok-a", "ok-b", None, None]
    values = [b.column("value").to_pylist() for b in client.scan("meta-rt")]
    assert sum(values, []) == [b"plain", b"a", b"b", b"c", b"after"]


def test_metadata_in_a_transaction_and_on_a_partitioned_topic(client, broker):
    broker.create_topic("meta-parts", partitions=3)
    p = client.create_producer("meta-parts")
    c = _subscribe(client, "meta-parts")
    txn = client.new_transaction()
    for i in range(6):
        p.send(b"t%d" % i, txn=txn, ordering_key=f"k{i}", event_timestamp=100 + i)
    aborted = client.new_transaction()
    p.send(b"gone", txn=aborted, ordering_key="never")
    aborted.abort()
    with pytest.raises(pulsartxn.Timeout):
        c.receive(300)  # not before the commit
    txn.commit()
    got = sorted((c.receive(5000) for _ in range(6)), key=lambda m: m.data())
    assert [(m.data(), m.ordering_key(), m.event_timestamp()) for m in got] == [
        (b"t%d" % i, f"k{i}", 100 + i) for i in range(6)
    ]
    with pytest.raises(pulsartxn.Timeout):
        c.receive(300)


def test_redelivered_message_keeps_its_metadata(client):
    p = client.create_producer("meta-redeliver")
    p.send(b"m", ordering_key="o", event_timestamp=9)
    c = _subscribe(client, "meta-redeliver", subscription_type=ConsumerType.Shared)
    first = c.receive(5000)
    c.redeliver_unacknowledged_messages()
    again = c.receive(5000)
    assert again.message_id() == first.message_id() and again.redelivery_count() == 1
    assert (again.ordering_key(), again.event_timestamp()) == ("o", 9)


def test_deduplicated_resend_with_metadata_is_stored_once(client):
    p = client.create_producer("meta-dedup", producer_name="dedup-p")
    a = p.send(b"x", sequence_id=7, ordering_key="o")
    b = p.send(b"x", sequence_id=7, ordering_key="o")
    assert a == b
    c = _subscribe(client, "meta-dedup")
    assert c.receive(5000).data() == b"x"
    with pytest.raises(pulsartxn.Timeout):
        c.receive(300)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"ordering_key": 5}, TypeError),
        ({"ordering_key": bytearray(b"x")}, TypeError),
        ({"event_timestamp": -1}, ValueError),
        ({"event_timestamp": 1.5}, TypeError),
        ({"event_timestamp": True}, TypeError),
        ({"event_timestamp": "5"}, TypeError),
        ({"deliver_after_ms": -1}, ValueError),
        ({"deliver_after_ms": False}, TypeError),
        ({"deliver_at": -5}, ValueError),
        ({"deliver_at": 1 << 63}, ValueError),
        ({"deliver_at": 2.0}, TypeError),
        ({"deliver_after": 5}, TypeError),
        ({"deliver_after": datetime.timedelta(seconds=-1)}, ValueError),
        ({"deliver_at": 1, "deliver_after_ms": 1}, ValueError),
        ({"deliver_after_ms": 1, "deliver_after": datetime.timedelta(seconds=1)}, ValueError),
    ],
)
def test_bad_values_are_refused_and_nothing_is_sent(client, kwargs, error):
    p = client.create_producer("meta-bad")
    with pytest.raises(error):
        p.send(b"x", **kwargs)
    with pytest.raises(error):
        p.send_async(b"x", **kwargs)
    p.send(b"ok")
    c = _subscribe(client, "meta-bad")
    assert c.receive(5000).data() == b"ok"
    with pytest.raises(pulsartxn.Timeout):
        c.receive(200)
