"""Delayed delivery (deliver_at / deliver_after_ms) with Pulsar's semantics, on both clients:
held on Shared subscriptions until its time, at once on Exclusive and Failover, after its
transaction's commit, never when aborted, across a broker restart, not delayed again when
redelivered."""

from __future__ import annotations

import threading
import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType, InitialPosition

DELAY_MS = 800


def _sub(client, topic, name="s", sub_type=ConsumerType.Shared, **kw):
    return client.subscribe(
        topic, name, subscription_type=sub_type, initial_position=InitialPosition.Earliest, **kw
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_shared_holds_a_delayed_message_until_its_time(client):
    p = client.create_producer("dl-shared")
    c = _sub(client, "dl-shared")
    sent = _now_ms()
    p.send(b"late", deliver_after_ms=DELAY_MS)
    p.send(b"now")
    assert c.receive(5000).data() == b"now"  # what follows is not held back
    with pytest.raises(pulsartxn.Timeout):
        c.receive(DELAY_MS // 4)
    cpu = time.process_time()
    msg = c.receive(5000)  # waits for the due time, not in a busy loop
    assert msg.data() == b"late" and msg.redelivery_count() == 0
    assert _now_ms() >= sent + DELAY_MS
    assert time.process_time() - cpu < 0.4
    c.acknowledge(msg)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(200)


def test_deliver_at_absolute_and_in_the_past(client):
    p = client.create_producer("dl-at")
    c = _sub(client, "dl-at")
    p.send(b"past", deliver_at=_now_ms() - 10_000)
    due = _now_ms() + DELAY_MS
    p.send_async(b"at", deliver_at=due).result()
    assert c.receive(5000).data() == b"past"
    assert c.receive(5000).data() == b"at"
    assert _now_ms() >= due


@pytest.mark.parametrize("sub_type", [ConsumerType.Exclusive, ConsumerType.Failover])
def test_exclusive_and_failover_deliver_at_once(client, sub_type):
    p = client.create_producer("dl-excl")
    p.send(b"late", deliver_after_ms=60_000)
    c = _sub(client, "dl-excl", sub_type=sub_type)
    assert c.receive(2000).data() == b"late"


def test_a_parked_receive_is_woken_by_a_delayed_message_sent_after_it_parked(client):
    p = client.create_producer("dl-park")
    c = _sub(client, "dl-park")
    got = []
    t = threading.Thread(target=lambda: got.append(c.receive(10_000)))
    t.start()
    time.sleep(0.3)
    due = _now_ms() + DELAY_MS
    p.send(b"late", deliver_at=due)
    t.join(10)
    assert got and got[0].data() == b"late" and _now_ms() >= due


def test_transactional_delayed_message_needs_commit_and_time(client):
    p = client.create_producer("dl-txn")
    c = _sub(client, "dl-txn")
    # Committed before its time: delivered at its time.
    txn = client.new_transaction()
    due = _now_ms() + DELAY_MS
    p.send(b"early-commit", txn=txn, deliver_at=due)
    txn.commit()
    assert c.receive(5000).data() == b"early-commit" and _now_ms() >= due
    # Its time passes before the commit: delivered once committed, not before.
    txn = client.new_transaction()
    p.send(b"late-commit", txn=txn, deliver_after_ms=100)
    time.sleep(0.4)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(200)
    txn.commit()
    assert c.receive(5000).data() == b"late-commit"
    # Aborted: never, before or after its time.
    txn = client.new_transaction()
    p.send(b"aborted", txn=txn, deliver_after_ms=200)
    txn.abort()
    with pytest.raises(pulsartxn.Timeout):
        c.receive(600)


def test_abort_after_the_message_was_held_never_delivers_it(client):
    p = client.create_producer("dl-abort-held")
    c = _sub(client, "dl-abort-held", isolation=pulsartxn.Isolation.READ_UNCOMMITTED)
    txn = client.new_transaction()
    p.send(b"held", txn=txn, deliver_after_ms=500)
    p.flush()
    with pytest.raises(pulsartxn.Timeout):
        c.receive(200)  # read uncommitted, and held for its time
    txn.abort()
    with pytest.raises(pulsartxn.Timeout):
        c.receive(900)


def test_redelivery_is_not_delayed_again(client):
    p = client.create_producer("dl-redeliver")
    c = _sub(client, "dl-redeliver", negative_ack_redelivery_delay_ms=100)
    # The message's delay is far above the nack delay: the bounds below hold on a busy machine.
    p.send(b"late", deliver_after_ms=2000)
    first = c.receive(5000)
    c.negative_acknowledge(first)
    start = time.monotonic()
    again = c.receive(5000)
    assert again.data() == b"late" and again.redelivery_count() == 1
    assert time.monotonic() - start < 1.0  # the nack delay, not the message's delay again
    # Its consumer closes: the next one gets it at once.
    c.close()
    c2 = _sub(client, "dl-redeliver")
    start = time.monotonic()
    assert c2.receive(5000).data() == b"late"
    assert time.monotonic() - start < 1.0


def test_delayed_messages_spread_over_shared_consumers(client):
    p = client.create_producer("dl-many")
    c1 = _sub(client, "dl-many", consumer_name="a")
    c2 = _sub(client, "dl-many", consumer_name="b")
    due = _now_ms() + 400
    for i in range(6):
        p.send(b"m%d" % i, deliver_at=due + 20 * i)
    seen = []
    deadline = time.monotonic() + 5
    while len(seen) < 6 and time.monotonic() < deadline:
        for c in (c1, c2):
            try:
                m = c.receive(50)
            except pulsartxn.Timeout:
                continue
            seen.append(m.data())
            c.acknowledge(m)
    assert sorted(seen) == [b"m%d" % i for i in range(6)]
    assert _now_ms() >= due


@pytest.mark.parametrize("remote", [False, True], ids=["embedded", "remote"])
def test_delayed_messages_survive_a_broker_restart(tmp_path, remote):
    from pulsartxn.server.service import BrokerServer

    def open_client(broker):
        if not remote:
            return broker.client(), None
        server = BrokerServer(broker, "127.0.0.1", 0)
        return pulsartxn.Client(f"pulsartxn://127.0.0.1:{server.port}"), server

    def close(broker, client, server):
        client.close()
        if server is not None:
            server.shutdown_sessions()
            server.shutdown()
        broker.close()

    broker = pulsartxn.Broker(tmp_path / "data", sync=False)
    client, server = open_client(broker)
    c = _sub(client, "dl-restart")
    due = _now_ms() + 1500
    client.create_producer("dl-restart").send(b"late", deliver_at=due)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(100)
    close(broker, client, server)

    broker = pulsartxn.Broker(tmp_path / "data", sync=False)
    client, server = open_client(broker)
    try:
        c = _sub(client, "dl-restart")
        msg = c.receive(5000)
        assert msg.data() == b"late" and _now_ms() >= due
    finally:
        close(broker, client, server)


def test_has_message_available_and_stats_count_held_messages(client, broker):
    p = client.create_producer("dl-avail")
    c = _sub(client, "dl-avail")
    p.send(b"late", deliver_after_ms=500)
    assert not c.has_message_available()  # held: not available before its time
    stats = broker.admin.topic_stats("dl-avail")["subscriptions"]["s"]
    assert stats["delayed"] == 1
    time.sleep(0.6)
    assert c.has_message_available()
    assert c.receive(1000).data() == b"late"
    assert broker.admin.topic_stats("dl-avail")["subscriptions"]["s"]["delayed"] == 0


def test_many_delayed_messages_each_no_earlier_than_its_time_and_once(client):
    p = client.create_producer("dl-order")
    c = _sub(client, "dl-order")
    base = _now_ms()
    dues = {b"m%d" % i: base + (i * 37) % 600 for i in range(20)}
    futures = [p.send_async(data, deliver_at=due) for data, due in dues.items()]
    for f in futures:
        f.result()
    seen = {}
    while len(seen) < len(dues):
        m = c.receive(5000)
        assert m.data() not in seen
        seen[m.data()] = _now_ms()
        c.acknowledge(m)
    assert all(seen[d] >= dues[d] for d in dues)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(200)


def test_a_closed_producer_refuses_a_delayed_send(client):
    p = client.create_producer("dl-closed")
    p.close()
    with pytest.raises(pulsartxn.AlreadyClosed):
        p.send(b"x", deliver_after_ms=10)
    with pytest.raises(pulsartxn.AlreadyClosed):
        p.send_async(b"x", ordering_key="k")


def test_key_shared_holds_delayed_messages_and_keys_by_ordering_key(client):
    p = client.create_producer("dl-keyshared")
    a = _sub(client, "dl-keyshared", sub_type=ConsumerType.KeyShared, consumer_name="a")
    b = _sub(client, "dl-keyshared", sub_type=ConsumerType.KeyShared, consumer_name="b")
    due = _now_ms() + 500
    # One ordering key over many partition keys: every message on one consumer, in order.
    for i in range(8):
        p.send(b"m%d" % i, partition_key=f"pk{i}", ordering_key="one", deliver_at=due)
    got: dict = {}
    deadline = time.monotonic() + 5
    while sum(len(v) for v in got.values()) < 8 and time.monotonic() < deadline:
        for name, c in (("a", a), ("b", b)):
            try:
                m = c.receive(50)
            except pulsartxn.Timeout:
                continue
            assert _now_ms() >= due
            got.setdefault(name, []).append(m.data())
    assert len(got) == 1 and list(got.values())[0] == [b"m%d" % i for i in range(8)]


def test_seek_keeps_a_delayed_message_held_until_its_time(client):
    p = client.create_producer("dl-seek")
    c = _sub(client, "dl-seek")
    p.send(b"now")
    due = _now_ms() + 700
    p.send(b"late", deliver_at=due)
    assert c.receive(5000).data() == b"now"
    c.seek(pulsartxn.MessageId.earliest)
    assert c.receive(5000).data() == b"now"  # read again from the start
    with pytest.raises(pulsartxn.Timeout):
        c.receive(200)  # still held after the seek
    m = c.receive(5000)
    assert m.data() == b"late" and _now_ms() >= due
    c.acknowledge(m)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(200)  # held once, delivered once


def test_seek_past_a_held_message_drops_it(client, broker):
    p = client.create_producer("dl-seek-past")
    c = _sub(client, "dl-seek-past")
    p.send(b"late", deliver_after_ms=300)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(100)
    c.seek(pulsartxn.MessageId.latest)
    assert broker.admin.topic_stats("dl-seek-past")["subscriptions"]["s"]["delayed"] == 0
    with pytest.raises(pulsartxn.Timeout):
        c.receive(500)
