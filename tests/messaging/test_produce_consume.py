"""Producers and consumers on a real LMDB directory: order, batching, dedup, acks, types."""

from __future__ import annotations

import random
import threading

import pyarrow as pa
import pytest

import pulsartxn
from pulsartxn import ConsumerType, InitialPosition
from tests.helpers import drain


def test_send_receive_in_order_with_metadata(client):
    producer = client.create_producer("t")
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    ids = [
        producer.send(f"m{i}".encode(), properties={"i": str(i)}, partition_key=f"k{i}")
        for i in range(20)
    ]
    assert ids == sorted(ids) and len(set(ids)) == 20
    got = [consumer.receive(1000) for _ in range(20)]
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(20)]
    assert [m.properties() for m in got] == [{"i": str(i)} for i in range(20)]
    assert [m.partition_key() for m in got] == [f"k{i}" for i in range(20)]
    assert [m.message_id() for m in got] == ids
    assert all(
        m.topic_name() == "persistent://public/default/t" and m.publish_timestamp() > 0 for m in got
    )
    assert all(m.redelivery_count() == 0 for m in got)
    with pytest.raises(pulsartxn.Timeout):
        consumer.receive(50)


def test_batched_send_async_shares_entries(client):
    producer = client.create_producer(
        "t", batching_max_messages=100, batching_max_publish_delay_ms=60_000
    )
    futures = [producer.send_async(b"x%d" % i) for i in range(250)]
    producer.flush()
    ids = [f.result() for f in futures]
    entries = {mid.entry_id() for mid in ids}
    assert len(entries) == 3  # 100 + 100 + 50
    assert [mid.batch_index() for mid in ids[:100]] == list(range(100))
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    got = drain(consumer)
    assert [m.data() for m in got] == [b"x%d" % i for i in range(250)]
    for m in got[:150]:
        consumer.acknowledge(m)
    consumer.close()
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    assert [m.data() for m in drain(consumer)] == [b"x%d" % i for i in range(150, 250)]


def test_publish_delay_flushes_a_lone_async_send(client):
    producer = client.create_producer("t", batching_max_publish_delay_ms=5)
    fut = producer.send_async(b"lonely")
    assert fut.result(timeout=5).entry_id() == 0


def test_dedup_returns_the_original_id_and_stores_once(broker, tmp_path):
    client = broker.client()
    producer = client.create_producer("t", producer_name="p1")
    first = producer.send(b"a", sequence_id=5)
    batch = [producer.send_async(b"b%d" % i, sequence_id=10 + i) for i in range(4)]
    producer.flush()
    assert producer.send(b"a-again", sequence_id=5) == first
    assert producer.send(b"b2-again", sequence_id=12) == batch[2].result()
    assert producer.send(b"gap", sequence_id=7).entry_id() == -1  # never stored, below highest
    producer.close()
    values = [v for b in client.scan("t") for v in b.column("value").to_pylist()]
    assert values == [b"a", b"b0", b"b1", b"b2", b"b3"]
    # The same name again on this broker continues after its highest sequence too.
    same = client.create_producer("t", producer_name="p1")
    assert same.last_sequence_id() == 13
    assert same.send(b"b0-again", sequence_id=10) == batch[0].result()
    same.close()
    # After a restart the same producer name continues after its highest sequence.
    broker.close()
    with pulsartxn.Broker(broker.data_dir, sync=False) as again:
        c = again.client()
        p = c.create_producer("t", producer_name="p1")
        assert p.last_sequence_id() == 13
        assert p.send(b"dup", sequence_id=11) == batch[1].result()
        p.send(b"new")
        values = [v for b in c.scan("t") for v in b.column("value").to_pylist()]
        assert values == [b"a", b"b0", b"b1", b"b2", b"b3", b"new"]


def test_producer_busy_and_closed(client):
    p = client.create_producer("t", producer_name="same")
    with pytest.raises(pulsartxn.ProducerBusy):
        client.create_producer("t", producer_name="same")
    p.close()
    p.close()
    with pytest.raises(pulsartxn.AlreadyClosed):
        p.send(b"x")
    client.create_producer("t", producer_name="same").send(b"y")


def test_bad_sends_change_nothing(client, broker):
    p = client.create_producer("t")
    p.send(b"ok")
    with pytest.raises(pulsartxn.MessageTooBig):
        p.send(b"x" * (5 * 1024 * 1024 + 1))
    with pytest.raises(TypeError):
        p.send("str")
    with pytest.raises(TypeError):
        p.send(b"x", properties={"a": 1})
    with pytest.raises(TypeError):
        p.send(b"x", partition_key=5)
    with pytest.raises(ValueError):
        p.send(b"x", sequence_id=-1)
    with pytest.raises(pulsartxn.MessageTooBig):
        p.send_batch([b"a", b"x" * (5 * 1024 * 1024 + 1)])
    with pytest.raises(TypeError):
        p.send_batch([b"a", "b"])
    with pytest.raises(ValueError):
        p.send_batch([b"a", b"b"], keys=["k"])
    assert broker.admin.topic_stats("t")["messages"] == 1
    assert p.send(b"ok2").entry_id() == 1


def test_send_batch_lists_and_arrow(client):
    p = client.create_producer("t", batching_max_messages=1000)
    assert p.send_batch([b"v%d" % i for i in range(2500)]) == 2500
    assert p.send_batch(pa.array([f"s{i}" for i in range(10)])) == 10
    assert p.send_batch(pa.array([b"k"] * 3, pa.binary()), keys=["a", None, "c"]) == 3
    batches = list(client.scan("t"))
    table = pa.Table.from_batches(batches)
    assert table.num_rows == 2513
    assert table.column("value").to_pylist()[:3] == [b"v0", b"v1", b"v2"]
    assert table.column("value").to_pylist()[2500] == b"s0"
    assert table.column("key").to_pylist()[-3:] == [b"a", None, b"c"]
    for col in (
        "topic",
        "partition",
        "ledger_id",
        "entry_id",
        "batch_index",
        "key",
        "value",
        "properties",
        "publish_time",
    ):
        assert col in table.schema.names


def test_partitioned_routing_keys_are_stable(broker, client):
    broker.create_topic("parts", partitions=4)
    p = client.create_producer("parts")
    by_key = {}
    for i in range(40):
        mid = p.send(b"x", partition_key=f"key-{i % 5}")
        by_key.setdefault(f"key-{i % 5}", set()).add(mid.partition())
    assert all(len(v) == 1 for v in by_key.values())
    unkeyed = {p.send(b"y").partition() for _ in range(8)}
    assert unkeyed == {0, 1, 2, 3}
    consumer = client.subscribe("parts", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    assert len(drain(consumer)) == 48


def test_ack_individual_and_cumulative_survive_restart(broker):
    client = broker.client()
    p = client.create_producer("t", batching_enabled=False)
    for i in range(10):
        p.send(b"%d" % i)
    c = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    msgs = drain(c)
    c.acknowledge(msgs[0])
    c.acknowledge(msgs[2])
    c.acknowledge_cumulative(msgs[5])
    c.acknowledge(msgs[8].message_id())
    assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 3
    broker.close()
    with pulsartxn.Broker(broker.data_dir, sync=False) as again:
        c2 = again.client().subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        assert [m.data() for m in drain(c2)] == [b"6", b"7", b"9"]


def test_batch_index_acks(client, broker):
    p = client.create_producer("t", batching_max_messages=10, batching_max_publish_delay_ms=60_000)
    fs = [p.send_async(b"%d" % i) for i in range(10)]
    p.flush()
    assert len({f.result().entry_id() for f in fs}) == 1
    c = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    msgs = drain(c)
    for m in msgs[::2]:
        c.acknowledge(m)
    assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 5
    c.close()
    c = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    assert [m.data() for m in drain(c)] == [b"1", b"3", b"5", b"7", b"9"]


def test_reopened_subscription_reads_past_random_partial_acks(broker):
    """Batched entries with some batch indexes, some whole entries and a cumulative prefix
    acknowledged: after a reopen, dispatch reads the ledger again and delivers exactly the
    rest, in order, with their keys and properties."""
    rng = random.Random(7)
    client = broker.client()
    p = client.create_producer("t", batching_max_messages=7, batching_max_publish_delay_ms=60_000)
    for i in range(200):
        key = None if i % 3 else f"k{i}"
        props = {"i": str(i)} if i % 2 else None
        p.send_async(b"%d" % i, properties=props, partition_key=key)
    p.flush()
    c = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    msgs = drain(c)
    assert len(msgs) == 200
    c.acknowledge_cumulative(msgs[rng.randrange(20, 40)])
    for m in rng.sample(msgs, 80):
        c.acknowledge(m)
    entry = msgs[100].message_id().entry_id()
    for m in msgs:
        if m.message_id().entry_id() == entry:
            c.acknowledge(m)  # one whole batched entry
    acked = {m.data() for m in msgs if c._subs[0].cursor.is_acked(*_key(m))}
    broker.close()
    with pulsartxn.Broker(broker.data_dir, sync=False) as again:
        rest = drain(
            again.client().subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        )
        expected = [m for m in msgs if m.data() not in acked]
        assert [m.data() for m in rest] == [m.data() for m in expected]
        assert [m.message_id() for m in rest] == [m.message_id() for m in expected]
        assert [m.partition_key() for m in rest] == [m.partition_key() for m in expected]
        assert [m.properties() for m in rest] == [m.properties() for m in expected]
        assert all(m.redelivery_count() == 0 for m in rest)


def _key(m):
    mid = m.message_id()
    return mid.entry_id(), mid.batch_index()


def test_large_messages_dispatch_whole(client):
    """A read-ahead holding more than 16 MiB of values (the copy-free path) delivers every
    message whole and in order."""
    p = client.create_producer("t", batching_enabled=False)
    values = [bytes([i]) * (4 << 20) for i in range(6)]
    for v in values:
        p.send(v)
    c = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    got = [c.receive(5000) for _ in values]
    assert [m.data() for m in got] == values


def test_negative_ack_and_redeliver_unacknowledged(client):
    p = client.create_producer("t")
    for i in range(3):
        p.send(b"%d" % i)
    c = client.subscribe(
        "t",
        "s",
        negative_ack_redelivery_delay_ms=20,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    a, b, cc = (c.receive(1000) for _ in range(3))
    c.negative_acknowledge(b)
    again = c.receive(2000)
    assert again.data() == b"1" and again.redelivery_count() == 1
    c.redeliver_unacknowledged_messages()
    redelivered = drain(c)
    assert sorted(m.data() for m in redelivered) == [b"0", b"1", b"2"]
    assert {m.data(): m.redelivery_count() for m in redelivered} == {b"0": 1, b"1": 2, b"2": 1}


def test_exclusive_failover_and_shared(client):
    p = client.create_producer("t")
    for i in range(6):
        p.send(b"%d" % i)
    ex = client.subscribe("t", "ex", initial_position=pulsartxn.InitialPosition.Earliest)
    with pytest.raises(pulsartxn.ConsumerBusy):
        client.subscribe("t", "ex", initial_position=pulsartxn.InitialPosition.Earliest)
    with pytest.raises(pulsartxn.ConsumerBusy):
        client.subscribe(
            "t",
            "ex",
            subscription_type=ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
    ex.close()

    f1 = client.subscribe(
        "t",
        "fo",
        subscription_type=ConsumerType.Failover,
        consumer_name="a",
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    f2 = client.subscribe(
        "t",
        "fo",
        subscription_type=ConsumerType.Failover,
        consumer_name="b",
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    first = f1.receive(1000)
    f1.acknowledge(first)
    f1.receive(1000)  # left unacknowledged: the next consumer gets it
    with pytest.raises(pulsartxn.Timeout):
        f2.receive(50)
    f1.close()
    assert [m.data() for m in drain(f2)] == [b"1", b"2", b"3", b"4", b"5"]

    s1 = client.subscribe(
        "t",
        "sh",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    s2 = client.subscribe(
        "t",
        "sh",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    got1 = [s1.receive(1000) for _ in range(3)]
    got2 = [s2.receive(1000) for _ in range(3)]
    assert sorted(m.data() for m in got1 + got2) == [b"%d" % i for i in range(6)]
    with pytest.raises(pulsartxn.InvalidConfiguration):
        s1.acknowledge_cumulative(got1[0])
    for m in got1[:2]:
        s1.acknowledge(m)
    s1.close()  # its unacked message goes to s2
    assert [m.data() for m in drain(s2)] == [got1[2].data()]


def test_initial_position_latest_and_unsubscribe(client, broker):
    p = client.create_producer("t")
    p.send(b"old")
    c = client.subscribe("t", "late", initial_position=InitialPosition.Latest)
    p.send(b"new")
    assert [m.data() for m in drain(c)] == [b"new"]
    other = client.subscribe(
        "t",
        "e",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    other2 = client.subscribe(
        "t",
        "e",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    with pytest.raises(pulsartxn.ConsumerBusy):
        other.unsubscribe()
    other2.close()
    other.unsubscribe()
    assert "e" not in broker.admin.topic_stats("t")["subscriptions"]
    again = client.subscribe("t", "e", initial_position=InitialPosition.Latest)
    with pytest.raises(pulsartxn.Timeout):
        again.receive(50)


def test_bad_acks_and_closed_consumers(client, broker):
    p = client.create_producer("t")
    mid = p.send(b"x")
    c = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    with pytest.raises(pulsartxn.InvalidMessageId):
        c.acknowledge(pulsartxn.MessageId(mid.ledger_id(), 99))
    with pytest.raises(pulsartxn.InvalidMessageId):
        c.acknowledge(pulsartxn.MessageId(mid.ledger_id() + 7, 0))
    with pytest.raises(pulsartxn.InvalidMessageId):
        c.acknowledge(pulsartxn.MessageId(mid.ledger_id(), 0, partition=3))
    with pytest.raises(TypeError):
        c.acknowledge("x")
    assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 1
    c.close()
    with pytest.raises(pulsartxn.AlreadyClosed):
        c.receive(10)
    with pytest.raises(pulsartxn.AlreadyClosed):
        c.acknowledge(mid)
    # Closed comes first, whatever is wrong with the call too (both clients alike).
    txn = client.new_transaction()
    for call in (c.acknowledge, c.acknowledge_cumulative, c.negative_acknowledge):
        with pytest.raises(pulsartxn.AlreadyClosed):
            call(None)
    with pytest.raises(pulsartxn.AlreadyClosed):
        c.acknowledge(None, txn)
    txn.abort()


def test_message_id_serialization_and_last_message(client):
    p = client.create_producer("t", batching_enabled=False)
    c = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    assert not c.has_message_available()
    mids = [p.send(b"%d" % i) for i in range(3)]
    assert c.has_message_available()
    assert c.get_last_message_id() == mids[-1]
    for mid in mids:
        assert pulsartxn.MessageId.deserialize(mid.serialize()) == mid
    with pytest.raises(pulsartxn.PulsarTxnError):
        pulsartxn.MessageId.deserialize(b"garbage")


def test_threads_producing_and_consuming_at_once(client):
    n_threads, per_thread = 4, 300
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    received = []
    done = threading.Event()

    def consume():
        while True:
            try:
                m = consumer.receive(500)
            except pulsartxn.Timeout:
                if done.is_set():
                    return
                continue
            received.append(m.data())
            consumer.acknowledge(m)

    def produce(t):
        producer = client.create_producer("t")
        for i in range(per_thread):
            if i % 3:
                producer.send_async(b"%d-%d" % (t, i))
            else:
                producer.send(b"%d-%d" % (t, i))
        producer.flush()

    readers = [threading.Thread(target=consume) for _ in range(2)]
    writers = [threading.Thread(target=produce, args=(t,)) for t in range(n_threads)]
    for th in readers + writers:
        th.start()
    for th in writers:
        th.join()
    done.set()
    for th in readers:
        th.join()
    assert sorted(received) == sorted(
        b"%d-%d" % (t, i) for t in range(n_threads) for i in range(per_thread)
    )
    per_producer = {}
    for v in received:
        t, i = v.split(b"-")
        per_producer.setdefault(t, []).append(int(i))
    assert all(len(v) == per_thread for v in per_producer.values())


@pytest.mark.parametrize("sync", [False, True])
def test_flush_returns_with_every_future_done_from_many_threads(tmp_path, sync):
    """flush() commits its batches in the calling thread unless a group is being committed
    (then it waits for that one and looks again): from several threads at once each returns
    with all of its futures done and durable, and a flush from a send callback (run inside
    the commit) returns too."""
    with pulsartxn.Broker(tmp_path / "d", sync=sync) as broker:
        client = broker.client()
        from_callback = []

        def work(t):
            # A long publish delay: only flush() sends the batches.
            p = client.create_producer("t", batching_max_publish_delay_ms=60_000)
            for round_ in range(20):
                futures = [p.send_async(b"%d-%d-%d" % (t, round_, i)) for i in range(7)]
                p.flush()
                assert all(f.done() for f in futures)
                assert [f.result().entry_id() for f in futures] == [
                    futures[0].result().entry_id()
                ] * 7
            p.send_async(b"cb-%d" % t, callback=lambda e, mid: (p.flush(), from_callback.append(e)))
            p.flush()

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not any(th.is_alive() for th in threads)
        assert from_callback == [pulsartxn.Result.Ok] * 4
    with pulsartxn.Broker(tmp_path / "d", sync=sync) as broker:
        values = [v for b in broker.client().scan("t") for v in b.column("value").to_pylist()]
        assert len(values) == 4 * (20 * 7 + 1) and len(set(values)) == len(values)


def test_send_async_futures_behave_as_futures(client):
    from concurrent.futures import as_completed, wait

    p = client.create_producer("t", batching_max_messages=50, batching_max_publish_delay_ms=60_000)
    seen = []
    futures = [
        p.send_async(b"%d" % i, callback=lambda err, mid: seen.append((err, mid)))
        for i in range(120)
    ]
    assert futures[0].result(timeout=10).batch_index() == 0  # a full batch goes on its own
    assert not futures[-1].done()  # the last 20 wait in the container (no delay flush)
    p.flush()
    done, not_done = wait(futures, timeout=10)
    assert len(done) == 120 and not not_done
    ids = [f.result() for f in as_completed(futures, timeout=10)]
    assert sorted(ids) == [f.result() for f in futures]
    assert [mid.batch_index() for mid in (f.result() for f in futures[:50])] == list(range(50))
    assert len(seen) == 120 and all(res is pulsartxn.Result.Ok for res, _ in seen)
    assert sorted(mid for _, mid in seen) == sorted(ids)
    assert all(f.exception() is None for f in futures)


def test_partitioned_subscription_state_survives_restart(broker):
    broker.create_topic("parts", partitions=3)
    client = broker.client()
    p = client.create_producer("parts", producer_name="writer")
    sent = [p.send(b"m%d" % i, partition_key=f"k{i}") for i in range(30)]
    c = client.subscribe(
        "parts",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    got = drain(c)
    assert len(got) == 30
    kept = {m.data() for m in got[::3]}
    for m in got:
        if m.data() not in kept:
            c.acknowledge(m)
    gone = client.subscribe("parts", "gone", initial_position=pulsartxn.InitialPosition.Earliest)
    gone.unsubscribe()
    broker.close()
    with pulsartxn.Broker(broker.data_dir, sync=False) as again:
        client = again.client()
        assert again.topic_partitions("parts") == broker_partitions("parts", 3)
        stats = again.admin.topic_stats("parts")
        assert set(stats["subscriptions"]) == {"s"}
        assert stats["subscriptions"]["s"]["backlog"] == len(kept)
        c = client.subscribe(
            "parts",
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        assert {m.data() for m in drain(c)} == kept
        again_p = client.create_producer("parts", producer_name="writer")
        # Sequence ids are per partition: message 0 went where key k0 routes, with its
        # partition's first sequence id; re-sent, it is found and not stored again.
        first_on_partition = min(
            i for i, mid in enumerate(sent) if mid.partition() == sent[0].partition()
        )
        assert first_on_partition == 0
        assert again_p.send(b"dup", partition_key="k0", sequence_id=0) == sent[0]
        assert again.admin.topic_stats("parts")["messages"] == 30


def broker_partitions(name, n):
    return [f"persistent://public/default/{name}-partition-{i}" for i in range(n)]


def test_read_ahead_is_bounded_by_messages_not_entries(broker):
    """A ledger of large batch entries is read ahead about a receiver queue at a time (Pulsar's
    1000 messages), not 64 entries of 1000 messages at once; every message still comes once,
    in order, across entries of mixed sizes."""
    from pulsartxn.messaging.readahead import READ_AHEAD_MESSAGES

    client = broker.client()
    producer = client.create_producer("big")
    sizes = [1000, 1, 1, 3000, 1, 500, 2000, 1, 1, 1]
    sent = []
    for i, n in enumerate(sizes):
        values = [b"%d-%d" % (i, j) for j in range(n)]
        producer.send_batch(values)
        sent.extend(values)
    partition = broker.topics.resolve("big")[1][0]
    counts = [partition.message_count(e) for e in range(len(sizes))]
    for start in range(len(sizes)):
        for want in (1, 2, 1000, 1001, 3002, 10**6):
            got = partition.entries_holding(start, len(sizes), want)
            # Brute force: the fewest entries from start holding `want`, or all that are left.
            k, held = 0, 0
            while start + k < len(sizes) and held < want:
                held += counts[start + k]
                k += 1
            assert got == max(k, 1), (start, want)
    consumer = client.subscribe("big", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    subscription = partition.subscriptions["s"]
    received = []
    while len(received) < len(sent):
        msgs = consumer.batch_receive(100, 2000)
        assert msgs
        received.extend(m.data() for m in msgs)
        # What is buffered ahead stays within one read of about a receiver queue.
        assert len(subscription.read_ahead.buffer) <= max(READ_AHEAD_MESSAGES, max(sizes))
        consumer.acknowledge_cumulative(msgs[-1])
    assert received == sent
