"""Key_Shared: a subscription's messages spread over its consumers by key, every message of a
key to one consumer and in order, as consumers come and go (Pulsar's draining rule), with
redeliveries and transactional acks going to the key's consumer."""

from __future__ import annotations

import threading
import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType, InitialPosition
from pulsartxn.messaging.key_shared import KeySelector, key_hash
from tests.helpers import drain

KS = ConsumerType.KeyShared
EARLIEST = InitialPosition.Earliest


def subscribe(client, name="s", consumer_name=None, topic="ks", **kwargs):
    return client.subscribe(
        topic,
        name,
        subscription_type=KS,
        initial_position=EARLIEST,
        consumer_name=consumer_name,
        **kwargs,
    )


def send(client, keys, topic="ks", tag=""):
    p = client.create_producer(topic)
    for i, key in enumerate(keys):
        p.send(f"{key}:{tag}{i}".encode(), partition_key=key)
    p.close()


def keys_of(msgs) -> set:
    return {m.partition_key() for m in msgs}


def test_keys_spread_over_concurrent_consumers_in_order(client):
    keys = [f"k{i % 40}" for i in range(800)]
    consumers = [subscribe(client, consumer_name=f"c{i}") for i in range(3)]
    got: dict[str, list] = {c.consumer_name(): [] for c in consumers}
    done = threading.Event()

    def run(c):
        while not done.is_set():
            for m in c.batch_receive(7, 50):
                got[c.consumer_name()].append((m.partition_key(), int(m.data().split(b":")[1])))
                c.acknowledge(m)

    threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    send(client, keys)
    for _ in range(400):
        if sum(len(v) for v in got.values()) >= len(keys):
            break
        threading.Event().wait(0.05)
    done.set()
    for t in threads:
        t.join()
    assert sum(len(v) for v in got.values()) == len(keys)
    owner = {}
    for name, msgs in got.items():
        for key, _ in msgs:
            assert owner.setdefault(key, name) == name, f"{key} went to two consumers"
        for key in keys_of_pairs(msgs):
            seq = [i for k, i in msgs if k == key]
            assert seq == sorted(seq) and len(seq) == 20
    assert len(set(owner.values())) == 3  # 40 keys: every consumer has some


def keys_of_pairs(pairs) -> set:
    return {k for k, _ in pairs}


def test_messages_without_a_key_go_to_one_consumer(client):
    a, b = subscribe(client, consumer_name="a"), subscribe(client, consumer_name="b")
    p = client.create_producer("ks")
    for i in range(20):
        p.send(b"%d" % i)
    got_a, got_b = drain(a), drain(b)
    assert sorted([len(got_a), len(got_b)]) == [0, 20]
    assert [m.data() for m in got_a + got_b] == [b"%d" % i for i in range(20)]


def test_a_joining_consumer_waits_for_its_keys_pending_elsewhere(client):
    keys = [f"k{i}" for i in range(40)]
    a = subscribe(client, consumer_name="a")
    send(client, keys, tag="first")
    first = drain(a)
    assert len(first) == 40  # delivered, not acknowledged
    b = subscribe(client, consumer_name="b")
    send(client, keys, tag="second")
    b_first = drain(b)
    assert b_first == []  # every key b took over has a message pending at a
    a_second = drain(a)
    moved = set(keys) - keys_of(a_second)
    assert moved and all(b"second" in m.data() for m in a_second)
    # a acknowledges what it holds of some moved key while b waits in a receive: b wakes
    key = sorted(moved)[0]
    out = []
    waiter = threading.Thread(target=lambda: out.append(b.receive(5000)))
    waiter.start()
    threading.Event().wait(0.2)
    assert not out
    with pytest.raises(pulsartxn.Timeout):
        a.receive(50)  # a take by a between b's and the ack: b is still woken by the ack
    acked = time.monotonic()
    a.acknowledge(next(m for m in first if m.partition_key() == key))
    waiter.join()
    assert time.monotonic() - acked < 2.0
    assert out[0].partition_key() == key and b"second" in out[0].data()
    for m in first:
        if m.partition_key() != key:
            a.acknowledge(m)
    rest = drain(b)
    assert keys_of(rest) == moved - {key}
    assert all(b"second" in m.data() for m in rest)


def test_a_leaving_consumers_messages_go_to_the_keys_new_consumer_first(client):
    keys = [f"k{i}" for i in range(30)]
    a, b = subscribe(client, consumer_name="a"), subscribe(client, consumer_name="b")
    send(client, keys, tag="first")
    held_a, held_b = drain(a), drain(b)
    assert held_a and held_b and len(held_a) + len(held_b) == 30
    send(client, keys, tag="second")
    a.close()  # its messages go back: the keys are b's now, earlier messages first
    got = drain(b)
    by_key: dict = {}
    for m in got:
        by_key.setdefault(m.partition_key(), []).append(m)
    assert set(by_key) == keys_of(held_a) | keys_of(held_b)
    for key in keys_of(held_a):
        first, second = by_key[key]
        assert b"first" in first.data() and first.redelivery_count() == 1
        assert b"second" in second.data() and second.redelivery_count() == 0
    for key in keys_of(held_b):
        assert [b"second" in m.data() for m in by_key[key]] == [True]


def test_nacked_and_redelivered_messages_go_back_to_the_keys_consumer(client):
    keys = [f"k{i}" for i in range(30)]
    a = subscribe(client, consumer_name="a", negative_ack_redelivery_delay_ms=0)
    b = subscribe(client, consumer_name="b", negative_ack_redelivery_delay_ms=0)
    send(client, keys)
    got_a, got_b = drain(a), drain(b)
    for m in got_a:
        a.negative_acknowledge(m)
    b.redeliver_unacknowledged_messages()
    again_b, again_a = drain(b), drain(a)
    assert keys_of(again_a) == keys_of(got_a) and keys_of(again_b) == keys_of(got_b)
    assert {m.redelivery_count() for m in again_a + again_b} == {1}


def test_a_due_delayed_message_takes_its_place_by_position(client):
    """A delayed message, once due, is delivered in position order among the messages of its
    consumer that were read and not yet delivered (as Pulsar replays what it held back),
    not behind all of them."""
    ring = KeySelector()
    ring.add("c1", "c1")
    ring.add("c2", "c2")
    owned = {}
    for i in range(200):
        owned.setdefault(ring.select(key_hash(f"k{i}".encode())), []).append(f"k{i}")
    mine, other = owned["c1"][:2], owned["c2"][0]
    c1 = subscribe(client, consumer_name="c1")
    c2 = subscribe(client, consumer_name="c2")
    p = client.create_producer("ks")
    p.send(b"delayed", partition_key=mine[0], deliver_after_ms=500)
    due_at = time.monotonic() + 0.5
    for i in range(3):
        p.send(b"a%d" % i, partition_key=mine[1])
    p.send(b"other", partition_key=other)
    # c2's take reads past c1's three messages (they wait for c1) to its own
    assert c2.receive(5000).data() == b"other"
    time.sleep(max(0.0, due_at - time.monotonic()) + 0.2)
    got = [c1.receive(5000) for _ in range(4)]
    assert [m.data() for m in got] == [b"delayed", b"a0", b"a1", b"a2"]
    assert [m.message_id() for m in got] == sorted(m.message_id() for m in got)
    p.close()


def test_cumulative_ack_is_refused(client):
    a = subscribe(client, consumer_name="a")
    send(client, ["x", "y"])
    msgs = drain(a)
    with pytest.raises(pulsartxn.InvalidConfiguration, match="Key_Shared"):
        a.acknowledge_cumulative(msgs[-1])
    txn = client.new_transaction()
    with pytest.raises(pulsartxn.InvalidConfiguration):
        a.acknowledge_cumulative(msgs[-1], txn)
    txn.abort()
    assert len(drain(subscribe(client, name="other"))) == 2


def test_transactional_acks_conflict_and_an_abort_redelivers_to_the_key(client):
    keys = [f"k{i}" for i in range(20)]
    a, b = subscribe(client, consumer_name="a"), subscribe(client, consumer_name="b")
    send(client, keys)
    got_a, got_b = drain(a), drain(b)
    assert got_a and got_b
    t1, t2 = client.new_transaction(), client.new_transaction()
    a.acknowledge(got_a[0], t1)
    b.acknowledge(got_b[0], t1)
    with pytest.raises(pulsartxn.TransactionConflict):
        a.acknowledge(got_a[0], t2)
    with pytest.raises(pulsartxn.TransactionConflict):
        a.acknowledge(got_a[0])  # held by t1
    t2.abort()
    t1.abort()
    again_a, again_b = drain(a), drain(b)
    assert [m.data() for m in again_a] == [got_a[0].data()]
    assert [m.data() for m in again_b] == [got_b[0].data()]
    assert again_a[0].redelivery_count() == 1
    t3 = client.new_transaction()
    for m in got_a[1:] + again_a:
        a.acknowledge(m, t3)
    t3.commit()
    for m in got_b[1:] + again_b:
        b.acknowledge(m)
    a.close()
    b.close()
    assert drain(subscribe(client, consumer_name="c")) == []


def test_other_types_cannot_join_a_key_shared_subscription(client):
    subscribe(client, consumer_name="a")
    with pytest.raises(pulsartxn.ConsumerBusy, match="Key_Shared"):
        client.subscribe("ks", "s", subscription_type=ConsumerType.Shared)


def test_partitioned_topic_keeps_each_keys_order(client, broker):
    broker.create_topic("pks", 3)
    keys = [f"k{i % 10}" for i in range(200)]
    consumers = [subscribe(client, consumer_name=f"c{i}", topic="pks") for i in range(2)]
    send(client, keys, topic="pks")
    seen: dict = {}
    for c in consumers:
        for m in drain(c):
            seen.setdefault(m.partition_key(), []).append(
                (c.consumer_name(), int(m.data().split(b":")[1]))
            )
            c.acknowledge(m)
    assert sum(len(v) for v in seen.values()) == 200
    for pairs in seen.values():
        assert len({c for c, _ in pairs}) == 1
        assert [i for _, i in pairs] == sorted(i for _, i in pairs)


def test_has_message_available_counts_only_the_consumers_keys(client):
    a, b = subscribe(client, consumer_name="a"), subscribe(client, consumer_name="b")
    send(client, [f"k{i}" for i in range(30)])
    got_a = drain(a)
    assert got_a and not a.has_message_available()
    assert b.has_message_available()
    got_b = drain(b)
    assert len(got_a) + len(got_b) == 30 and not b.has_message_available()
    a.close()  # a's keys and messages go to b
    assert b.has_message_available()
    assert {m.data() for m in drain(b)} == {m.data() for m in got_a}


def test_a_receive_held_by_the_read_ahead_limit_wakes_when_the_others_take(
    client, broker, monkeypatch
):
    """A take reads past at most LOOKAHEAD messages of other consumers' keys. A consumer whose
    messages lie past that many of another's waits, and is woken by that other's take (it
    waited for a publish, or its own timeout, before), without an ack."""
    from pulsartxn.messaging import key_shared

    monkeypatch.setattr(key_shared, "LOOKAHEAD", 50)
    a, b = subscribe(client, consumer_name="a"), subscribe(client, consumer_name="b")
    sub = broker.topics.resolve("ks")[1][0].subscriptions["s"]

    def owner(key) -> str:
        return sub.key_shared.selector.select(key_shared.key_hash(key.encode())).consumer_name()

    keys = [f"k{i}" for i in range(200)]
    of_a = [k for k in keys if owner(k) == "a"][:3]
    of_b = [k for k in keys if owner(k) == "b"][:3]
    send(client, [of_b[i % 3] for i in range(120)], tag="b")  # 120 of b's first
    send(client, [of_a[i % 3] for i in range(5)], tag="a")
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(a.receive(20_000)), daemon=True)
    waiting.start()
    deadline = time.monotonic() + 10
    while not sub.parked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sub.parked and not got  # held: its messages lie past 50 of b's
    taken = b.batch_receive(100, 1000)  # no ack: the take alone frees the way
    assert len(taken) == 100 and keys_of(taken) <= set(of_b)
    waiting.join(5)
    assert got and got[0].partition_key() in of_a
    assert sorted(m.data() for m in drain(b)) == sorted(
        f"{of_b[i % 3]}:b{i}".encode() for i in range(100, 120)
    )


def test_a_consumer_held_by_the_read_ahead_limit_reads_nothing_again(client, broker, monkeypatch):
    """What the read-ahead reads is routed to a queue per consumer: a consumer whose messages
    lie past LOOKAHEAD of another's reads nothing again while it waits (it read the other's
    10,000 again at every take, 6 ms each under the subscription's lock, woken by every ack
    of the other's: two consumers draining 100k collapsed to a quarter of their rate), and
    its messages come, in order, once the other's take frees the way."""
    from pulsartxn.messaging import key_shared

    monkeypatch.setattr(key_shared, "LOOKAHEAD", 50)
    a, b = subscribe(client, consumer_name="a"), subscribe(client, consumer_name="b")
    sub = broker.topics.resolve("ks")[1][0].subscriptions["s"]
    ks = sub.key_shared

    def owner(key) -> str:
        return ks.selector.select(key_shared.key_hash(key.encode())).consumer_name()

    keys = [f"k{i}" for i in range(200)]
    of_a = [k for k in keys if owner(k) == "a"][:3]
    of_b = [k for k in keys if owner(k) == "b"][:3]
    send(client, [of_b[i % 3] for i in range(120)], tag="b")  # 120 of b's first
    send(client, [of_a[i % 3] for i in range(5)], tag="a")
    fills = []
    fill = sub.read_ahead.fill
    monkeypatch.setattr(sub.read_ahead, "fill", lambda rc: fills.append(1) or fill(rc))
    with pytest.raises(pulsartxn.Timeout):
        a.receive(0)  # held: its messages lie past 50 of b's
    routed, read = ks._queued, len(fills)
    for _ in range(5):
        with pytest.raises(pulsartxn.Timeout):
            a.receive(0)
    assert (ks._queued, len(fills)) == (routed, read)  # nothing read or routed again
    b.acknowledge(b.receive(1000))  # an ack does not read for a either
    assert len(fills) == read
    taken = b.batch_receive(80, 1000)
    assert len(taken) == 80 and keys_of(taken) <= set(of_b)
    got = [a.receive(5000) for _ in range(5)]  # the way is free: a reads on, in order
    assert [m.data() for m in got] == [f"{of_a[i % 3]}:a{i}".encode() for i in range(5)]
    rest = drain(b)
    assert sorted(m.data() for m in rest) == sorted(
        f"{of_b[i % 3]}:b{i}".encode() for i in range(81, 120)
    )


def test_the_ring_moves_only_the_keys_of_a_consumer_that_comes_or_goes():
    from pulsartxn.messaging.key_shared import KeySelector, key_hash

    hashes = [key_hash(f"key-{i}".encode()) for i in range(5000)]
    ring = KeySelector()
    ring.add("A", "a")
    ring.add("B", "b")
    before = [ring.select(h) for h in hashes]
    ring.add("C", "c")
    after = [ring.select(h) for h in hashes]
    moved = [(x, y) for x, y in zip(before, after) if x != y]
    assert moved and all(y == "C" for _, y in moved)  # only to the new consumer
    assert 0.2 < after.count("C") / len(hashes) < 0.45  # about a third
    ring.remove("C")
    assert [ring.select(h) for h in hashes] == before  # and back when it leaves
    ring.remove("A")
    assert {ring.select(h) for h in hashes} == {"B"}


def test_batched_entries_spread_by_each_messages_key(client):
    keys = [f"k{i % 8}" for i in range(400)]
    client.create_producer("ks").send_batch([b"%d" % i for i in range(400)], keys=keys)
    a, b = subscribe(client, consumer_name="a"), subscribe(client, consumer_name="b")
    owner: dict = {}
    got = 0
    for name, c in (("a", a), ("b", b)):
        last: dict = {}
        for m in drain(c):
            key, i = m.partition_key(), int(m.data())
            assert owner.setdefault(key, name) == name and last.get(key, -1) < i
            last[key] = i
            c.acknowledge(m)
            got += 1
    assert got == 400 and set(owner.values()) == {"a", "b"}
    a.close()
    b.close()
    assert drain(subscribe(client, consumer_name="c")) == []  # every batch index acked
