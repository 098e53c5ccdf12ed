"""consumer.seek on both clients: to a MessageId (that message again), MessageId.earliest
and .latest, a publish time; with unacknowledged messages, transactions holding acks,
several consumers, a receive waiting, partitions, aborted messages, and a restart."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType, MessageId, errors

EARLIEST = pulsartxn.InitialPosition.Earliest


def send(client, topic: str, n: int, prefix: bytes = b"m", **kw) -> list[MessageId]:
    p = client.create_producer(topic, batching_enabled=False)
    ids = [p.send(prefix + b"%d" % i, **kw) for i in range(n)]
    p.close()
    return ids


def take(consumer, n: int, ack: bool = True) -> list[bytes]:
    out = []
    for _ in range(n):
        msg = consumer.receive(2000)
        if ack:
            consumer.acknowledge(msg)
        out.append(msg.data())
    return out


def nothing(consumer) -> bool:
    with pytest.raises(errors.Timeout):
        consumer.receive(50)
    return True


def test_seek_to_an_id_delivers_it_again_and_what_follows(client):
    ids = send(client, "t", 5)
    c = client.subscribe("t", "s", initial_position=EARLIEST)
    assert take(c, 5) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    c.seek(ids[2])
    assert take(c, 3) == [b"m2", b"m3", b"m4"]
    assert nothing(c)
    c.seek(MessageId.earliest)
    assert take(c, 1) == [b"m0"]
    c.seek(MessageId.latest)
    assert nothing(c)
    send(client, "t", 1, b"n")
    assert take(c, 1) == [b"n0"]
    assert client.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 0
    c.close()


def test_seek_forgets_unacknowledged_and_acknowledged_after_it(client):
    ids = send(client, "t", 6)
    c = client.subscribe("t", "s", initial_position=EARLIEST)
    msgs = [c.receive(2000) for _ in range(4)]  # delivered, m1 and m3 acknowledged
    c.acknowledge(msgs[1])
    c.acknowledge(msgs[3])
    c.negative_acknowledge(msgs[0])
    c.seek(ids[1])
    # Everything from m1 on again, once each: the nack and pending deliveries are gone.
    got = take(c, 5)
    assert got == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert nothing(c)
    c.close()


def test_seek_to_a_batch_index(client):
    p = client.create_producer("b", batching_max_publish_delay_ms=10_000)
    futures = [p.send_async(b"x%d" % i) for i in range(5)]
    p.flush()
    ids = [f.result() for f in futures]
    c = client.subscribe("b", "s", initial_position=EARLIEST)
    assert take(c, 5) == [b"x%d" % i for i in range(5)]
    c.seek(ids[3])
    assert take(c, 2) == [b"x3", b"x4"]
    assert nothing(c)
    c.close()


def test_seek_by_publish_time(client):
    send(client, "t", 3, b"old")
    time.sleep(0.01)
    cut = int(time.time() * 1000)
    time.sleep(0.01)
    send(client, "t", 2, b"new")
    c = client.subscribe("t", "s", initial_position=EARLIEST)
    assert len(take(c, 5)) == 5
    c.seek(cut)
    assert take(c, 2) == [b"new0", b"new1"]
    assert nothing(c)
    c.seek(0)
    assert len(take(c, 5)) == 5
    c.seek(cut + 3_600_000)  # after the last: nothing until a new one
    assert nothing(c)
    send(client, "t", 1, b"z")
    assert take(c, 1) == [b"z0"]
    c.close()


def test_seek_is_refused_while_a_transaction_holds_acks(client):
    send(client, "t", 3)
    c = client.subscribe("t", "s", initial_position=EARLIEST)
    first = c.receive(2000)
    txn = client.new_transaction()
    c.acknowledge(first, txn=txn)
    with pytest.raises(errors.TransactionConflict) as info:
        c.seek(MessageId.earliest)
    assert str(txn.id) in str(info.value)
    assert take(c, 2) == [b"m1", b"m2"]  # nothing changed
    txn.abort()
    c.seek(MessageId.earliest)
    got = take(c, 3)
    assert got == [b"m0", b"m1", b"m2"]
    txn = client.new_transaction()
    c.seek(MessageId.earliest)
    msg = c.receive(2000)
    c.acknowledge(msg, txn=txn)
    txn.commit()
    c.seek(MessageId.earliest)  # committed: nothing holds the subscription
    assert take(c, 1) == [b"m0"]
    c.close()


def test_seek_to_an_aborted_message_delivers_what_follows(client):
    p = client.create_producer("t", batching_enabled=False)
    p.send(b"a")
    txn = client.new_transaction()
    aborted = p.send(b"gone", txn=txn)
    txn.abort()
    p.send(b"b")
    c = client.subscribe("t", "s", initial_position=EARLIEST)
    assert take(c, 2) == [b"a", b"b"]
    c.seek(aborted)
    assert take(c, 1) == [b"b"]
    assert nothing(c)
    c.close()


def test_seek_on_shared_reaches_every_consumer(client):
    ids = send(client, "t", 8)
    c1 = client.subscribe("t", "s", ConsumerType.Shared, initial_position=EARLIEST)
    c2 = client.subscribe("t", "s", ConsumerType.Shared, initial_position=EARLIEST)
    held = [c1.receive(2000) for _ in range(3)]  # delivered to c1, never acknowledged
    assert held
    got = []
    for c in (c1, c2):
        while True:
            try:
                msg = c.receive(100)
            except errors.Timeout:
                break
            c.acknowledge(msg)
            got.append(msg.data())
    assert len(got) == 5
    c2.seek(ids[4])
    again = []
    for c in (c1, c2):
        while True:
            try:
                msg = c.receive(100)
            except errors.Timeout:
                break
            c.acknowledge(msg)
            again.append(msg.data())
    assert sorted(again) == [b"m4", b"m5", b"m6", b"m7"]
    c1.close()
    c2.close()


def test_seek_wakes_a_receive_that_waits(client):
    ids = send(client, "t", 3)
    c = client.subscribe("t", "s", initial_position=EARLIEST)
    assert take(c, 3) == [b"m0", b"m1", b"m2"]
    out = []
    t = threading.Thread(target=lambda: out.append(c.receive(10_000).data()))
    t.start()
    time.sleep(0.2)
    c.seek(ids[1])
    t.join(10)
    assert out == [b"m1"]
    assert take(c, 1) == [b"m2"]
    c.close()


def test_seek_on_a_partitioned_topic(client, broker):
    broker.create_topic("pt", 2)
    p = client.create_producer("pt", batching_enabled=False)
    ids = [p.send(b"k%d" % i, partition_key=f"key-{i}") for i in range(10)]
    c = client.subscribe("pt", "s", initial_position=EARLIEST)
    assert len(take(c, 10)) == 10
    # A MessageId resets its own partition only.
    target = ids[3]
    c.seek(target)
    expected = sorted(
        b"k%d" % i
        for i, m in enumerate(ids)
        if m.partition() == target.partition() and m.entry_id() >= target.entry_id()
    )
    assert sorted(take(c, len(expected))) == expected
    assert nothing(c)
    # Earliest and a publish time apply to every partition.
    c.seek(MessageId.earliest)
    assert len(take(c, 10)) == 10
    c.seek(0)
    assert len(take(c, 10)) == 10
    assert nothing(c)
    with pytest.raises(errors.InvalidMessageId):
        c.seek(MessageId(ids[0].ledger_id(), 0, 5))
    c.close()


def test_seek_refuses_what_is_no_position(client):
    send(client, "t", 1)
    c = client.subscribe("t", "s", initial_position=EARLIEST)
    with pytest.raises(TypeError):
        c.seek("0:0")
    with pytest.raises(TypeError):
        c.seek(True)
    with pytest.raises(ValueError):
        c.seek(-5)
    with pytest.raises(errors.InvalidMessageId):
        c.seek(MessageId(999, 0, -1))  # another ledger
    assert take(c, 1) == [b"m0"]  # nothing changed
    c.close()
    with pytest.raises(errors.AlreadyClosed):
        c.seek(MessageId.earliest)


_SEEK_AND_DIE = """
import os, sys
import pulsartxn
b = pulsartxn.Broker(sys.argv[1], sync=False)
c = b.client().subscribe("t", "s")
for _ in range(4):
    c.acknowledge(c.receive(2000))
c.seek(pulsartxn.MessageId.deserialize(bytes.fromhex(sys.argv[2])))
os._exit(0)  # no close: what seek answered must be stored already
"""


def test_a_seek_is_durable_when_it_returns(tmp_path):
    b = pulsartxn.Broker(tmp_path / "data", sync=False)
    c = b.client()
    ids = send(c, "t", 4)
    c.subscribe("t", "s", initial_position=EARLIEST).close()
    b.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(
        [sys.executable, "-c", _SEEK_AND_DIE, str(tmp_path / "data"), ids[1].serialize().hex()],
        check=True,
        env=env,
        timeout=120,
    )
    b = pulsartxn.Broker(tmp_path / "data", sync=False)
    consumer = b.client().subscribe("t", "s")
    assert take(consumer, 3) == [b"m1", b"m2", b"m3"]
    assert nothing(consumer)
    b.close()


def test_seeks_racing_shared_consumers_lose_and_break_nothing(client):
    """Seeks while two Shared consumers receive and acknowledge in threads: no error, no
    deadlock; after a last seek to the earliest, every message comes exactly once."""
    n = 60
    send(client, "t", n)
    consumers = [
        client.subscribe("t", "s", ConsumerType.Shared, initial_position=EARLIEST) for _ in range(2)
    ]
    stop = threading.Event()
    failures: list = []

    def work(c):
        while not stop.is_set():
            try:
                c.acknowledge(c.receive(20))
            except errors.Timeout:
                pass
            except Exception as exc:  # noqa: BLE001 - the test asserts there are none
                failures.append(exc)
                return

    threads = [threading.Thread(target=work, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    for i in range(20):
        consumers[i % 2].seek(MessageId.earliest if i % 3 else 0)
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join(10)
    assert not failures, failures
    consumers[0].seek(MessageId.earliest)
    got = []
    for c in consumers:
        while True:
            try:
                msg = c.receive(100)
            except errors.Timeout:
                break
            c.acknowledge(msg)
            got.append(msg.data())
    assert sorted(got) == sorted(b"m%d" % i for i in range(n))
    for c in consumers:
        c.close()
