"""What one consumer can make a subscription hold or do for it: a take is capped in messages
and bytes, a message delivered and not acknowledged is held by its position only, and a
closing consumer wakes only the consumers its messages can feed."""

from __future__ import annotations

import gc
import queue
import random
import threading
import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType
from pulsartxn.messaging.readahead import READ_AHEAD_BYTES
from tests import helpers

QUEUE = 250  # the broker's receiver_queue_size in these tests
MAX_QUEUE = 600  # its max_receiver_queue_size
BUDGET = 100_000  # its dispatch_max_bytes


@pytest.fixture
def broker(tmp_path):
    """The `client` fixture's broker, with small dispatch bounds."""
    b = pulsartxn.Broker(
        tmp_path / "data",
        sync=False,
        receiver_queue_size=QUEUE,
        max_receiver_queue_size=MAX_QUEUE,
        dispatch_max_bytes=BUDGET,
    )
    yield b
    b.close()


def subscription(broker, topic: str, name: str = "s"):
    return broker.topics.resolve(topic)[1][0].subscriptions[name]


def wait_until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def receive_all(consumer, n: int, timeout_ms: int = 2000) -> list[list]:
    """Batches of batch_receive until n messages came."""
    batches, got = [], 0
    while got < n:
        msgs = consumer.batch_receive(10**9, timeout_ms)
        assert msgs, f"{got} of {n} received"
        batches.append(msgs)
        got += len(msgs)
    return batches


# -- a take is capped --------------------------------------------------------------------------


def test_batch_receive_takes_at_most_the_receiver_queue_size(client):
    sent = [b"m%d" % i for i in range(1500)]
    client.create_producer("t").send_batch(sent)
    default = client.subscribe("t", "default", initial_position=pulsartxn.InitialPosition.Earliest)
    assert len(default.batch_receive(10**9, 1000)) == QUEUE
    own = client.subscribe(
        "t", "own", receiver_queue_size=100, initial_position=pulsartxn.InitialPosition.Earliest
    )
    batches = receive_all(own, len(sent))
    assert [len(b) for b in batches] == [100] * 15
    assert [m.data() for b in batches for m in b] == sent
    capped = client.subscribe(
        "t",
        "capped",
        receiver_queue_size=10**9,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    assert len(capped.batch_receive(10**9, 1000)) == MAX_QUEUE
    assert len(capped.batch_receive(7, 1000)) == 7
    for bad in (0, -1, True, 2.5, "10"):
        with pytest.raises(ValueError, match="receiver_queue_size"):
            client.subscribe(
                "t",
                "bad",
                receiver_queue_size=bad,
                initial_position=pulsartxn.InitialPosition.Earliest,
            )


def test_batch_receive_takes_at_most_the_byte_budget(client):
    """Within BUDGET bytes of message data a call, first delivery and redelivery alike; a
    message larger than the budget comes alone; every message once, in order."""
    sent = [b"%02d" % i + b"s" * 9_998 for i in range(25)] + [b"L" * 250_000]
    sent += [b"%02d" % i + b"m" * 29_998 for i in range(5)]
    producer = client.create_producer("t", batching_enabled=False)
    for value in sent:
        producer.send(value)
    first = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    for holder in (
        first,
        client.subscribe(
            "t",
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        ),
    ):
        batches = receive_all(holder, len(sent), 300)
        sizes = [sum(len(m.data()) for m in b) for b in batches]
        assert all(s <= BUDGET or len(b) == 1 for s, b in zip(sizes, batches)), sizes
        assert [len(b) for b in batches] == [10, 10, 5, 1, 3, 2]
        assert [m.data() for b in batches for m in b] == sent
        # The next consumer gets them as redeliveries, read again from the ledger.
        assert {m.redelivery_count() for b in batches for m in b} == {int(holder is not first)}
        holder.close()


def test_read_ahead_is_bounded_in_bytes(broker):
    client = broker.client()
    producer = client.create_producer("big", batching_enabled=False)
    sent = [bytes([i]) * (1 << 20) for i in range(24)]
    for value in sent:
        producer.send(value)
    consumer = client.subscribe("big", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    sub = subscription(broker, "big")
    got = []
    while len(got) < len(sent):
        got.append(consumer.receive(5000).data())
        # 64 entries of 1 MiB would be read ahead at once without the byte bound.
        assert sum(len(payload[0]) for _, payload in sub.read_ahead.buffer) <= READ_AHEAD_BYTES
    assert got == sent


# -- positions, not payloads -------------------------------------------------------------------


def test_a_closed_consumer_leaves_positions_not_payloads(client, broker):
    """40 messages of 1 MiB received and not acknowledged, then the consumer closes: what the
    subscription keeps for their redelivery is positions (the heap held the payloads: 40 MiB),
    and the next consumer gets every message, read again from the ledger."""
    n, size = 40, 1 << 20
    producer = client.create_producer("big", batching_enabled=False)
    for i in range(n):
        producer.send(bytes([i]) * size)
    with client.subscribe(
        "big", "warm-up", initial_position=pulsartxn.InitialPosition.Earliest
    ) as warm_up:  # what a first receive imports
        assert len(warm_up.batch_receive(1, 1000)) == 1
    gc.collect()
    base = helpers.heap_in_use()
    holder = client.subscribe(
        "big",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    receive_all(holder, n)  # one message a call: each is larger than the budget
    holder.close()
    gc.collect()
    held = helpers.heap_in_use() - base
    assert held < 4 << 20, f"{held / 2**20:.1f} MiB held after the consumer closed"
    sub = subscription(broker, "big")
    assert sorted(sub._redeliver) == [(e, -1) for e in range(n)]
    assert not sub._pending and not sub.read_ahead.buffer
    again = client.subscribe(
        "big",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    msgs = [m for b in receive_all(again, n) for m in b]
    assert [m.data() for m in msgs] == [bytes([i]) * size for i in range(n)]
    assert {m.redelivery_count() for m in msgs} == {1}


def test_a_redelivery_is_the_message_as_sent(client, broker):
    """A batch entry partly acknowledged, its other messages redelivered after a close and
    after a negative ack: the same data, properties, key, id and publish time, count + 1."""
    producer = client.create_producer("t", batching_max_publish_delay_ms=50)
    futures = [
        producer.send_async(b"v%d" % i, properties={"i": str(i)}, partition_key=f"k{i}")
        for i in range(10)
    ]
    producer.flush()
    ids = [f.result() for f in futures]
    assert len({i.entry_id() for i in ids}) == 1  # one batch entry
    first = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    msgs = first.batch_receive(10, 2000)
    assert len(msgs) == 10
    for i in (0, 3, 7):
        first.acknowledge(msgs[i])
    first.close()

    def seen(m):
        return (m.data(), m.properties(), m.partition_key(), m.message_id(), m.publish_timestamp())

    expected = [seen(m) for i, m in enumerate(msgs) if i not in (0, 3, 7)]
    second = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=10,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    again = second.batch_receive(10, 2000)
    assert [seen(m) for m in again] == expected
    assert [m.redelivery_count() for m in again] == [1] * 7
    second.negative_acknowledge(again[2])
    nacked = second.receive(5000)
    assert (seen(nacked), nacked.redelivery_count()) == (expected[2], 2)
    for m in again:
        second.acknowledge(m)
    sub = subscription(broker, "t")
    assert not sub._redelivery_counts and not sub._pending and not sub._redeliver
    assert second.batch_receive(10, 100) == []


def test_a_message_redelivered_again_is_read_again(client):
    """Taken from the entry a redelivery read, then given back by a consumer that closes: the
    next redelivery reads the entry again (the one it read had given that message away)."""
    client.create_producer("t").send(b"x")
    first = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    assert first.receive(5000).redelivery_count() == 0
    first.redeliver_unacknowledged_messages()
    assert first.receive(5000).redelivery_count() == 1
    first.close()
    second = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    msg = second.receive(5000)
    assert (msg.data(), msg.redelivery_count()) == (b"x", 2)


def test_an_aborted_redelivery_leaves_no_count(broker):
    """Read uncommitted: a message delivered twice whose transaction then aborts is
    acknowledged internally when its redelivery reads it again, its count dropped with it."""
    client = broker.client()
    txn = client.new_transaction()
    client.create_producer("t").send(b"x", txn=txn)
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        isolation=pulsartxn.Isolation.READ_UNCOMMITTED,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    assert consumer.receive(5000).data() == b"x"
    consumer.redeliver_unacknowledged_messages()
    assert consumer.receive(5000).redelivery_count() == 1
    consumer.redeliver_unacknowledged_messages()
    sub = subscription(broker, "t")
    assert sub._redelivery_counts
    txn.abort()
    with pytest.raises(pulsartxn.Timeout):
        consumer.receive(200)
    assert not sub._redelivery_counts and not sub._redeliver and not sub._pending


# -- wake-ups ----------------------------------------------------------------------------------


def park(consumers, results: queue.Queue) -> list[threading.Thread]:
    """Each consumer in receive(timeout_millis=None) on a thread of its own."""

    def body(c):
        try:
            results.put((c, c.receive()))
        except pulsartxn.AlreadyClosed:
            results.put("closed")
        except pulsartxn.PulsarTxnError as exc:
            results.put(exc)

    threads = [threading.Thread(target=body, args=(c,), daemon=True) for c in consumers]
    for t in threads:
        t.start()
    return threads


def test_closing_parked_consumers_wakes_each_once(broker):
    """500 consumers parked on one Shared subscription, then closed: each close wakes its own
    receive and nobody else (waking every other consumer each time made n(n+1)/2 wake-ups,
    each of them a poll of the subscription: 1000 consumers took 32 s of CPU)."""
    client = broker.client()
    n = 500
    consumers = [
        client.subscribe(
            "idle",
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        for _ in range(n)
    ]
    results: queue.Queue = queue.Queue()
    threads = park(consumers, results)
    wait_until(lambda: sum(c._parked for c in consumers) == n)
    for c in consumers:
        c.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert [results.get_nowait() for _ in range(n)] == ["closed"] * n
    assert sum(c._signal for c in consumers) == n


def test_a_send_wakes_only_the_subscriptions_a_receive_waits_on(broker):
    """A publish rouses the subscriptions with a consumer parked, of every type, and none of
    the idle ones (it rang every subscription of the topic: 20,000 idle ones made a send
    there 30 times slower). A subscription leaves that set once its waiters are roused."""
    client = broker.client()
    producer = client.create_producer("many", batching_enabled=False)
    for i in range(50):  # idle: made, then left without a consumer
        client.subscribe("many", f"idle-{i}").close()
    part = broker.topics.resolve("many")[1][0]
    assert part.awaited == set()
    kinds = (ConsumerType.Shared, ConsumerType.KeyShared, ConsumerType.Failover)
    consumers = [client.subscribe("many", f"waits-{k.name}", subscription_type=k) for k in kinds]
    results: queue.Queue = queue.Queue()
    threads = park(consumers, results)
    wait_until(lambda: sum(c._parked for c in consumers) == len(consumers))
    assert {s.name for s in part.awaited} == {f"waits-{k.name}" for k in kinds}
    producer.send(b"m")
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert [results.get_nowait()[1].data() for _ in kinds] == [b"m"] * len(kinds)
    shared = {s.name for s in part.awaited}
    assert "waits-Shared" not in shared and "waits-KeyShared" not in shared
    for c in consumers:
        c.close()
    assert part.awaited == set()


def test_a_closing_consumer_hands_its_messages_to_parked_ones(client, broker):
    """Three messages held by a consumer that closes reach three of five parked consumers
    at once; the wake-ups are about the messages, not the consumers."""
    producer = client.create_producer("t", batching_enabled=False)
    for value in (b"a", b"b", b"c"):
        producer.send(value)
    holder = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    held = [holder.receive(5000) for _ in range(3)]
    assert [m.redelivery_count() for m in held] == [0, 0, 0]
    waiters = [
        client.subscribe(
            "t",
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        for _ in range(5)
    ]
    parked = list(subscription(broker, "t").consumers)[1:]  # the broker's side of them
    results: queue.Queue = queue.Queue()
    threads = park(waiters, results)
    wait_until(lambda: sum(c._parked for c in parked) == 5)
    before = sum(c._signal for c in parked)
    holder.close()
    got = [results.get(timeout=30) for _ in range(3)]
    assert sorted(m.data() for _, m in got) == [b"a", b"b", b"c"]
    assert [m.redelivery_count() for _, m in got] == [1, 1, 1]
    # One per message, and at most one handed on by each taker that left some behind.
    assert 3 <= sum(c._signal for c in parked) - before <= 6
    for c, m in got:
        c.acknowledge(m)
    for c in waiters:
        c.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert [results.get_nowait() for _ in range(2)] == ["closed", "closed"]


def test_a_parked_failover_consumer_takes_over_on_close(client, broker):
    active = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Failover,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    standby = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Failover,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    results: queue.Queue = queue.Queue()
    (thread,) = park([standby], results)
    parked = list(subscription(broker, "t").consumers)[1]
    wait_until(lambda: parked._parked == 1)
    client.create_producer("t").send(b"x")
    assert active.receive(5000).data() == b"x"  # not acknowledged: goes to the next
    assert results.empty()
    active.close()
    consumer, msg = results.get(timeout=30)
    assert (consumer, msg.data(), msg.redelivery_count()) == (standby, b"x", 1)
    thread.join(30)
    standby.close()


@pytest.mark.parametrize("seed", range(3))
def test_parked_consumers_of_a_partitioned_topic_take_everything(broker, seed):
    """Consumers parked with no timeout on the four partitions of a Shared subscription, some
    closing with a message in hand, some negatively acknowledging, others joining, while
    bursts are published: every message is acknowledged, none waits with a consumer parked
    (a lost wake-up would leave it there: the receives have no timeout)."""
    rng = random.Random(seed)
    broker.create_topic("p", partitions=4)
    client = broker.client()
    kind = ConsumerType.Shared
    lock = threading.Lock()
    acked: set[bytes] = set()
    threads = []
    consumers = []

    def consume(c, quit_after, nacks):
        taken = 0
        try:
            while True:
                m = c.receive()
                taken += 1
                if taken == quit_after:
                    c.close()  # with this one in hand: it goes to another consumer
                    return
                if taken % 5 == 0 and nacks:
                    c.negative_acknowledge(m)  # back after its delay, to any of them
                    continue
                c.acknowledge(m)
                with lock:
                    acked.add(m.data())
        except pulsartxn.AlreadyClosed:
            pass

    def join(quit_after):
        delay = rng.choice([0, 5, 30])
        c = client.subscribe(
            "p",
            "s",
            subscription_type=kind,
            negative_ack_redelivery_delay_ms=delay,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        consumers.append(c)
        args = (c, quit_after, rng.random() < 0.5)
        t = threading.Thread(target=consume, args=args, daemon=True)
        threads.append(t)
        t.start()

    join(0)  # one stays to the end
    for _ in range(5):
        join(rng.choice([3, 7, 0]))
    producer = client.create_producer("p", batching_enabled=False)
    sent = [b"m%d" % i for i in range(400)]
    for i in range(0, len(sent), 20):
        for value in sent[i : i + 20]:
            producer.send_async(value, partition_key=value.decode())
        producer.flush()
        if rng.random() < 0.5:
            join(rng.choice([3, 7, 0]))
        time.sleep(rng.random() * 0.01)
    wait_until(lambda: len(acked) == len(sent) or not any(t.is_alive() for t in threads))
    assert acked == set(sent)
    for c in consumers:
        c.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
