"""The seeds' scenarios end to end: transactional produce and acknowledge through the client."""

from __future__ import annotations

import functools
import time

import pyarrow as pa
import pytest

import pulsartxn
from pulsartxn import ConsumerType, InitialPosition, Isolation, TxnID, TxnState
from pulsartxn.errors import (
    InvalidConfiguration,
    InvalidMessageId,
    InvalidTxnStatus,
    TransactionConflict,
    TransactionNotFound,
    TransactionTimeout,
)
from tests import helpers

# Consumers here are drained with a 100 ms wait, and scans are compared sorted.
drain = functools.partial(helpers.drain, timeout_ms=100)
scanned = functools.partial(helpers.scanned, sort=True)


def values_of(msgs):
    return sorted(m.data() for m in msgs)


def lasting(broker):
    """A client whose transactions outlive a close of its broker, as a network session's do
    (an in-process client's are aborted when its broker closes: nobody could end them)."""
    if isinstance(broker, helpers.Served):
        return broker.client()
    return broker.client(session="lasting")


def test_invisible_until_commit_atomic_over_partitions_and_topics(env):
    broker = env()
    broker.create_topic("a", partitions=3)
    client = broker.client()
    pa_, pb = client.create_producer("a"), client.create_producer("b")
    ca, cb = (
        client.subscribe("a", "s", initial_position=pulsartxn.InitialPosition.Earliest),
        client.subscribe("b", "s", initial_position=pulsartxn.InitialPosition.Earliest),
    )
    txn = client.new_transaction()
    for i in range(9):
        pa_.send(b"a%d" % i, txn=txn)
    pb.send_async(b"b0", txn=txn)
    pb.send_batch([b"b1", b"b2"], txn=txn)
    assert drain(ca, timeout_ms=50) == [] and drain(cb, timeout_ms=50) == []
    assert scanned(client, "a") == [] and scanned(client, "b") == []
    assert not cb.has_message_available()
    assert cb.get_last_message_id().entry_id() == -1
    assert txn.state is TxnState.OPEN
    txn.commit()
    assert txn.state is TxnState.COMMITTED
    assert values_of(drain(ca)) == [b"a%d" % i for i in range(9)]
    assert values_of(drain(cb)) == [b"b0", b"b1", b"b2"]
    assert scanned(client, "b") == [b"b0", b"b1", b"b2"]
    assert len(broker.admin.transaction_buffer_stats("a")["partitions"]) == 3


def test_never_visible_after_abort_and_markers_move_the_cursor(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t")
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    txn = client.new_transaction()
    producer.send(b"gone", txn=txn)
    producer.send(b"plain")  # waits behind the open transaction (order is kept)
    assert drain(consumer, timeout_ms=50) == []
    txn.abort()
    msgs = drain(consumer)
    assert values_of(msgs) == [b"plain"]
    consumer.acknowledge(msgs[0])
    assert scanned(client, "t") == [b"plain"]
    stats = broker.admin.transaction_buffer_stats("t")
    assert stats["aborted_txn_count"] == 1 and stats["ongoing_txn_size"] == 0
    assert stats["max_read_position"] == stats["last_entry_id"] + 1
    # The aborted entry and the marker were acknowledged internally: nothing is left.
    assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 0
    assert not consumer.has_message_available()
    last = consumer.get_last_message_id()
    assert last.entry_id() == msgs[0].message_id().entry_id()  # not the marker after it


def test_ack_commit_moves_the_cursor_and_abort_redelivers(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    for i in range(4):
        producer.send(b"m%d" % i)
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    msgs = drain(consumer)
    assert len(msgs) == 4
    keep = client.new_transaction()
    undo = client.new_transaction()
    consumer.acknowledge(msgs[0], txn=keep)
    consumer.acknowledge(msgs[1], txn=keep)
    consumer.acknowledge(msgs[2], txn=undo)
    consumer.redeliver_unacknowledged_messages()
    # Held messages are not redelivered while their transaction is open; msgs[3] is.
    (m3,) = drain(consumer)
    assert m3.data() == b"m3" and m3.redelivery_count() == 1
    keep.commit()
    undo.abort()
    again = drain(consumer)
    assert [m.data() for m in again] == [b"m2"] and again[0].redelivery_count() == 1
    stats = broker.admin.pending_ack_stats("t", "s")
    assert stats["committed"] == 1 and stats["aborted"] == 1 and stats["ongoing_txn_size"] == 0
    for m in again + [m3]:
        consumer.acknowledge(m)
    broker.close()
    broker = env()
    consumer = broker.client().subscribe(
        "t", "s", initial_position=pulsartxn.InitialPosition.Earliest
    )
    assert drain(consumer) == []


def test_conflicts(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    for i in range(3):
        producer.send(b"m%d" % i)
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    m0, m1, m2 = drain(consumer)
    first, second = client.new_transaction(), client.new_transaction()
    consumer.acknowledge(m0, txn=first)
    with pytest.raises(TransactionConflict):
        consumer.acknowledge(m0, txn=second)  # held by another transaction
    with pytest.raises(TransactionConflict):
        consumer.acknowledge(m0)  # a plain ack of a held message: refused, nothing changes
    consumer.acknowledge(m1)
    third = client.new_transaction()
    with pytest.raises(TransactionConflict):
        consumer.acknowledge(m1, txn=third)  # already acknowledged
    # After a conflict a transaction can only abort: its commit aborts it, then raises; so
    # does a commit through another handle on it, and a with-block that ends normally.
    with pytest.raises(TransactionConflict, match="was aborted"):
        client.transaction(second.id).commit()
    assert second.state is TxnState.ABORTED
    with pytest.raises(InvalidTxnStatus):
        second.commit()
    with pytest.raises(TransactionConflict, match="was aborted"):
        with third:
            pass
    assert third.state is TxnState.ABORTED
    # What a failed transaction held is released by its commit (not at its timeout).
    fourth = client.new_transaction()
    consumer.acknowledge(m2, txn=fourth)
    with pytest.raises(TransactionConflict):
        consumer.acknowledge(m0, txn=fourth)
    with pytest.raises(TransactionConflict):
        fourth.commit()
    assert fourth.state is TxnState.ABORTED
    assert [m.data() for m in drain(consumer)] == [b"m2"]  # redelivered
    first.commit()
    stats = broker.admin.topic_stats("t")["subscriptions"]["s"]
    assert stats["backlog"] == 1  # m2 only
    assert broker.admin.pending_ack_stats("t", "s")["pending_ack_entries"] == 0


def _batched(client, n: int, per_entry: int):
    """m0..m<n-1> on "t" in entries of `per_entry` messages (a full batch is one entry, with
    no publish-delay flush in between however slow the machine: the delay is long)."""
    producer = client.create_producer(
        "t", batching_max_messages=per_entry, batching_max_publish_delay_ms=60_000
    )
    for i in range(n):
        producer.send_async(b"m%d" % i)
    producer.flush()
    return producer


def test_batch_index_acks_in_transactions(env):
    broker = env()
    client = broker.client()
    _batched(client, 4, 4)
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    msgs = drain(consumer)
    assert [m.message_id().batch_index() for m in msgs] == [0, 1, 2, 3]
    a, b = client.new_transaction(), client.new_transaction()
    consumer.acknowledge(msgs[0], txn=a)
    consumer.acknowledge(msgs[1], txn=b)  # another index of the same entry: no conflict
    with pytest.raises(TransactionConflict):
        consumer.acknowledge(msgs[1], txn=a)
    a.abort()
    b.commit()
    redelivered = drain(consumer)
    assert [m.data() for m in redelivered] == [b"m0"]


def test_cumulative_ack_in_a_transaction(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    for i in range(5):
        producer.send(b"m%d" % i)
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    msgs = drain(consumer)
    other = client.new_transaction()
    consumer.acknowledge(msgs[1], txn=other)
    txn = client.new_transaction()
    with pytest.raises(TransactionConflict):
        consumer.acknowledge_cumulative(msgs[3], txn=txn)  # covers msgs[1], held by `other`
    other.abort()
    txn2 = client.new_transaction()
    consumer.acknowledge_cumulative(msgs[3], txn=txn2)
    with pytest.raises(TransactionConflict):
        consumer.acknowledge(msgs[2])
    txn2.commit()
    assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 1
    shared = client.subscribe(
        "u",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    client.create_producer("u").send(b"x")
    (m,) = drain(shared)
    with pytest.raises(InvalidConfiguration):
        shared.acknowledge_cumulative(m, txn=client.new_transaction())


@pytest.mark.parametrize("cumulative", [False, True])
def test_committed_acks_leave_the_unacknowledged_set_and_nothing_else(env, cumulative):
    """Many messages in flight (batched entries), some acknowledged in committed
    transactions (individually, or cumulatively to a batch index inside an entry): asking
    for redelivery brings back exactly the others."""
    broker = env()
    client = broker.client()
    _batched(client, 60, 8)
    kind = ConsumerType.Exclusive if cumulative else ConsumerType.Shared
    consumer = client.subscribe(
        "t", "s", subscription_type=kind, initial_position=pulsartxn.InitialPosition.Earliest
    )
    drain(consumer)
    consumer.redeliver_unacknowledged_messages()  # every message now has a redelivery count
    msgs = sorted(drain(consumer), key=lambda m: m.message_id())
    assert len(msgs) == 60 and all(m.redelivery_count() == 1 for m in msgs)
    if cumulative:
        first = client.new_transaction()
        consumer.acknowledge_cumulative(msgs[13], txn=first)  # inside the second entry
        first.commit()
        second = client.new_transaction()
        consumer.acknowledge_cumulative(msgs[29], txn=second)
        second.commit()
        acked = set(range(30))
    else:
        acked = set(range(0, 60, 3)) | {7, 8}
        for chunk in (sorted(acked)[:9], sorted(acked)[9:]):
            txn = client.new_transaction()
            for i in chunk:
                consumer.acknowledge(msgs[i], txn=txn)
            txn.commit()
    stats = broker.admin.topic_stats("t")["subscriptions"]["s"]
    assert stats["unacked"] == 60 - len(acked)  # no committed message left among them
    sub = broker.topics.partition(broker.topic_partitions("t")[0]).subscriptions["s"]
    assert len(sub._redelivery_counts) == 60 - len(acked)  # nor among the counts
    consumer.redeliver_unacknowledged_messages()
    again = drain(consumer)
    assert sorted(m.data() for m in again) == sorted(
        b"m%d" % i for i in range(60) if i not in acked
    )
    assert all(m.redelivery_count() == 2 for m in again)
    assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 60 - len(acked)


def _logged(broker, txn_id) -> list[bytes]:
    """The keys of the records `txn_id` has in its coordinator's log now."""
    from pulsartxn.txn import log

    prefix = log.seq_prefix(txn_id.sequence)
    keys = []
    with broker.storage.read() as t:
        cursor = t.cursor(db=broker.txn.of(txn_id).db)
        if cursor.set_range(prefix):
            for key in cursor.iternext(values=False):
                if not bytes(key).startswith(prefix):
                    break
                keys.append(bytes(key))
    return keys


class _Elsewhere:
    """A participant resolver for which the partitions of topic "far" live elsewhere: their
    part is told after the decision (end_txn), not written with it."""

    def __init__(self) -> None:
        self.ended: list = []

    def __call__(self, kind, name):
        if kind == "partition" and "/far-partition-" in name:
            return self

    def end_txn(self, txn_id, commit, low_watermark):
        self.ended.append((txn_id, commit))


@pytest.mark.parametrize("durable_begin", [False, True])
def test_a_local_end_is_one_write_that_leaves_nothing_in_the_log(env, durable_begin):
    """A transaction whose participants all live in this broker ends in one write: its
    batches still waiting, its markers, its acks applied to the cursors, and the deletion of
    whatever it had logged (no END record, no cleanup afterwards). One with a participant
    elsewhere keeps the logged decision until that participant has been told."""
    broker = env(durable_begin=durable_begin)
    client = broker.client()
    p = client.create_producer("t", batching_max_publish_delay_ms=60_000)
    q = client.create_producer("u", batching_max_publish_delay_ms=60_000)
    riding = client.new_transaction()  # its batches go into its commit's write
    p.send_async(b"a1", txn=riding)
    q.send_async(b"b1", txn=riding)
    assert len(_logged(broker, riding.id)) == int(durable_begin)
    landed = client.new_transaction()  # its send written before its end logs it
    p.send(b"a2", txn=landed)
    q.send_async(b"b2", txn=landed)
    if not isinstance(broker, helpers.Served):
        # In process, the send's entry id is claimed: it rides too, until a group takes it.
        assert len(_logged(broker, landed.id)) == int(durable_begin)
        broker.storage.commits.flush_lazy(durable=False, lead=True)
    assert len(_logged(broker, landed.id)) == 2  # NEW and the partition
    again = client.new_transaction()
    p.send(b"a3", txn=again)
    q.send_async(b"b3", txn=again)

    riding.commit()
    assert _logged(broker, riding.id) == []  # at once: nothing waits for a cleanup
    landed.abort()
    assert _logged(broker, landed.id) == []
    again.commit()
    assert _logged(broker, again.id) == []
    assert riding.state is TxnState.COMMITTED and landed.state is TxnState.ABORTED

    producer = client.create_producer("in", batching_enabled=False)
    for v in (b"x", b"y", b"z"):
        producer.send(v)
    consumer = client.subscribe(
        "in",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    x, y, z = drain(consumer)
    acked = client.new_transaction()
    p.send(b"a4", txn=acked)
    consumer.acknowledge(x, txn=acked)
    consumer.acknowledge(z, txn=acked)
    acked.commit()  # the cursor write is part of the one write
    assert acked.state is TxnState.COMMITTED and _logged(broker, acked.id) == []
    released = client.new_transaction()
    consumer.acknowledge(y, txn=released)
    released.abort()
    assert _logged(broker, released.id) == []
    assert [m.data() for m in drain(consumer)] == [b"y"]  # x and z stay acknowledged

    broker.close()
    broker = env(durable_begin=durable_begin)
    client = broker.client()
    assert scanned(client, "t") == [b"a1", b"a3", b"a4"]
    assert scanned(client, "u") == [b"b1", b"b3"]
    assert [
        m.data()
        for m in drain(
            client.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        )
    ] == [b"y"]
    for txn in (riding, landed, again, acked, released):
        assert _logged(broker, txn.id) == []
    broker.close()

    elsewhere = _Elsewhere()
    broker = env(durable_begin=durable_begin, txn_participants=elsewhere)
    client = broker.client()
    broker.create_topic("far", 1)
    txn = client.new_transaction()
    client.create_producer("t").send(b"a5", txn=txn)
    client.create_producer("far").send(b"f", txn=txn)
    consumer = client.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    consumer.acknowledge(consumer.receive(1000), txn=txn)
    txn.commit()
    assert elsewhere.ended == [(txn.id, True)]  # told by finalize, after the decision
    deadline = time.monotonic() + 5
    while _logged(broker, txn.id):  # its END record goes once every participant is told
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_timeout_aborts_produced_messages_and_acks(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    producer.send(b"in")
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    (m,) = drain(consumer)
    txn = client.new_transaction(timeout_ms=100)
    producer.send(b"out", txn=txn)
    consumer.acknowledge(m, txn=txn)
    deadline = time.monotonic() + 5
    while txn.state is not TxnState.TIMEOUT and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(TransactionTimeout):
        txn.commit()
    with pytest.raises(InvalidTxnStatus):
        producer.send(b"late", txn=txn)
    again = drain(consumer)
    assert [x.data() for x in again] == [b"in"] and again[0].redelivery_count() == 1
    assert scanned(client, "t") == [b"in"]


def test_a_timed_out_commit_says_timeout_even_when_its_batch_was_refused(env):
    """A transaction whose messages still wait in the producer when its deadline passes: the
    commit writes them first, which the coordinator refuses (timed out); the commit then
    raises TransactionTimeout, as any commit of a timed-out transaction does."""
    broker = env()
    client = broker.client()
    producer = client.create_producer("t", batching_max_publish_delay_ms=60_000)
    txn = client.new_transaction(timeout_ms=50)
    waiting = producer.send_async(b"late", txn=txn)
    deadline = time.monotonic() + 5
    while txn.state is not TxnState.TIMEOUT:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(TransactionTimeout, match="timed out"):
        txn.commit()
    assert isinstance(waiting.exception(timeout=5), InvalidTxnStatus)
    assert scanned(client, "t") == []


def test_read_uncommitted_sees_open_transactions_never_aborted_ones(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t")
    committed = client.subscribe("t", "rc", initial_position=pulsartxn.InitialPosition.Earliest)
    dirty = client.subscribe(
        "t",
        "ru",
        isolation=Isolation.READ_UNCOMMITTED,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    txn = client.new_transaction()
    producer.send(b"open", txn=txn)
    assert values_of(drain(dirty)) == [b"open"]
    assert drain(committed, timeout_ms=50) == []
    doomed = client.new_transaction()
    producer.send(b"doomed", txn=doomed)
    doomed.abort()
    producer.send(b"plain")
    assert values_of(drain(dirty)) == [b"plain"]
    txn.commit()
    assert values_of(drain(committed)) == [b"open", b"plain"]


def test_restart_in_every_state(env):
    broker = env()
    client = lasting(broker)
    producer = client.create_producer("t", batching_enabled=False)
    committed, aborted, open_ = (client.new_transaction() for _ in range(3))
    for txn, value in ((committed, b"c"), (aborted, b"a"), (open_, b"o")):
        producer.send(value, txn=txn)
    committed.commit()
    aborted.abort()
    open_id = open_.id
    broker.close()
    broker = env()
    client = broker.client()
    stats = broker.admin.transaction_buffer_stats("t")
    assert stats["ongoing_txn_size"] == 1 and stats["aborted_txn_count"] == 1
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    assert values_of(drain(consumer, timeout_ms=50)) == [b"c"]  # `o` still holds what follows it
    again = client.transaction(open_id)
    assert again.state is TxnState.OPEN
    producer = client.create_producer("t")
    producer.send(b"o2", txn=again)
    again.commit()
    assert values_of(drain(consumer)) == [b"o", b"o2"]
    assert scanned(client, "t") == [b"c", b"o", b"o2"]


def test_pending_acks_survive_restart(env):
    broker = env()
    client = lasting(broker)
    producer = client.create_producer("t")
    producer.send_batch([b"%d" % i for i in range(500)])
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    msgs = drain(consumer)
    assert len(msgs) == 500
    txn = client.new_transaction()
    for m in msgs[:400]:
        consumer.acknowledge(m, txn=txn)
    # A network session's acks are stored before they are answered (its transaction
    # outlives the broker's process); an in-process client's are batched (below).
    assert broker.admin.pending_ack_stats("t", "s")["acks"] == 400
    tid = txn.id
    broker.close()
    broker = env()
    client = broker.client()
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    assert len(drain(consumer)) == 100  # the 400 are still held
    client.transaction(tid).commit()
    broker.close()
    broker = env()
    consumer = broker.client().subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    assert len(drain(consumer)) == 100


def test_in_process_acks_are_logged_in_batches(tmp_path):
    """An in-process client's transactional acks wait to be logged together (Pulsar #19084:
    a write per ack costs the broker its CPU); its transaction dies with the process anyway."""
    with pulsartxn.Broker(tmp_path / "data", sync=False) as broker:
        client = broker.client()
        client.create_producer("t").send_batch([b"%d" % i for i in range(500)])
        consumer = client.subscribe(
            "t",
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        txn = client.new_transaction()
        for m in drain(consumer):
            consumer.acknowledge(m, txn=txn)
        stats = broker.admin.pending_ack_stats("t", "s")
        assert stats["acks"] == 500 and stats["log_writes"] < 100
        txn.commit()
        assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 0


def test_commit_group_over_produce_and_acks(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t")
    attempts = [client.new_transaction(group="job") for _ in range(3)]
    for i, txn in enumerate(attempts):
        producer.send_batch(pa.array([b"attempt%d" % i] * 3), txn=txn)
    client.commit_group("job", [attempts[1]])
    assert scanned(client, "t") == [b"attempt1"] * 3


def test_decisions_over_handles_write_what_their_producers_still_hold(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t")  # batching: sends wait in the producer
    attempts = [client.new_transaction(group="job") for _ in range(2)]
    for i, txn in enumerate(attempts):
        for k in range(5):
            producer.send_async(b"a%d-%d" % (i, k), txn=txn)
    assert client.commit_group("job", [attempts[0]])["committed"] == [attempts[0].id]
    both = [client.new_transaction() for _ in range(2)]
    for i, txn in enumerate(both):
        producer.send_async(b"b%d" % i, txn=txn)
    client.commit_all(both)
    expected = [b"a0-%d" % k for k in range(5)] + [b"b0", b"b1"]
    assert sorted(scanned(client, "t")) == sorted(expected)


def test_bad_input_changes_nothing(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t")
    producer.send(b"x")
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    (m,) = drain(consumer)
    done = client.new_transaction()
    done.commit()
    with pytest.raises(InvalidTxnStatus):
        consumer.acknowledge(m, txn=done)
    with pytest.raises(InvalidTxnStatus):
        producer.send(b"y", txn=done)
    with pytest.raises(TransactionNotFound):
        consumer.acknowledge(m, txn=TxnID(0, 12345))
    other = client.create_producer("other")
    other.send(b"z")
    foreign = drain(
        client.subscribe("other", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    )[0]
    txn = client.new_transaction()
    with pytest.raises(InvalidMessageId):
        consumer.acknowledge(foreign, txn=txn)
    assert broker.admin.pending_ack_stats("t", "s")["acks"] == 0
    assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 1
    txn.commit()
    assert scanned(client, "t") == [b"x"]


def test_low_watermark_aborts_leftovers_of_finished_transactions(env):
    broker = env(num_coordinators=1)
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    stale = client.new_transaction()
    producer.send(b"stale", txn=stale)
    part = broker.topics.partition(broker.topic_partitions("t")[0])
    # The coordinator finished `stale` elsewhere and its end never reached this partition:
    # the next end on this partition carries a low watermark above it.
    later = client.new_transaction()
    part.buffer.end_txn(later.id, True, later.id.sequence)
    stats = broker.admin.transaction_buffer_stats("t")
    assert stats["ongoing_txn_size"] == 0 and stats["aborted_by_low_watermark"] == 1
    with pytest.raises(InvalidTxnStatus):
        producer.send(b"late", txn=stale)  # below the watermark: refused
    assert scanned(client, "t") == []


def test_low_watermark_releases_acks_of_finished_transactions(env):
    """Pending acks of transactions whose end never reached the subscription are released
    by the next end there that carries a low watermark above them: only those of the same
    coordinator, also after the broker reopened and replayed its pending-ack log."""
    broker = env(num_coordinators=2)
    client = lasting(broker)
    producer = client.create_producer("t", batching_enabled=False)
    for i in range(6):
        producer.send(b"m%d" % i)
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    msgs = drain(consumer)
    stale = [client.new_transaction(coordinator_id=0) for _ in range(3)]
    other = client.new_transaction(coordinator_id=1)
    for txn, m in zip(stale + [other], msgs):
        consumer.acknowledge(m, txn=txn)
    sub = broker.topics.partition(broker.topic_partitions("t")[0]).subscriptions["s"]
    sub.pending_ack.flush()  # their acks reach the log: the reopen replays them
    broker.close()
    broker = env(num_coordinators=2)
    client = broker.client()
    assert broker.admin.pending_ack_stats("t", "s")["ongoing_txn_size"] == 4  # replayed
    sub = broker.topics.partition(broker.topic_partitions("t")[0]).subscriptions["s"]
    later = client.new_transaction(coordinator_id=0)
    sub.pending_ack.end_txn(later.id, True, stale[1].id.sequence + 1)
    # stale[0] and stale[1] are below it; stale[2] and the other coordinator's are not.
    assert broker.admin.pending_ack_stats("t", "s")["ongoing_txn_size"] == 2
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    assert sorted(m.data() for m in drain(consumer)) == [b"m0", b"m1", b"m4", b"m5"]
    sub.pending_ack.end_txn(later.id, True, later.id.sequence)
    assert broker.admin.pending_ack_stats("t", "s")["ongoing_txn_size"] == 1
    assert [m.data() for m in drain(consumer)] == [b"m2"]


def test_initial_position_latest_with_transactions(env):
    broker = env()
    client = broker.client()
    producer = client.create_producer("t")
    txn = client.new_transaction()
    producer.send(b"before", txn=txn)
    consumer = client.subscribe("t", "s", initial_position=InitialPosition.Latest)
    txn.commit()
    producer.send(b"after")
    assert values_of(drain(consumer)) == [b"after"]


def _txns(client, producer, n, abort_every=2):
    ids = []
    for i in range(n):
        txn = client.new_transaction()
        producer.send(b"v%d" % i, txn=txn)
        (txn.abort if i % abort_every == 0 else txn.commit)()
        ids.append(txn.id)
    return ids


def test_snapshots_in_segments_and_recovery_from_them(env):
    broker = env(txn_snapshot_every_txns=10)
    client = lasting(broker)
    producer = client.create_producer("t", batching_enabled=False)
    _txns(client, producer, 40)
    open_txn = client.new_transaction()
    producer.send(b"open", txn=open_txn)
    stats = broker.admin.transaction_buffer_stats("t")
    assert stats["snapshots_taken"] >= 3 and stats["snapshot_segments"] >= 3
    # Each snapshot wrote only what changed: a segment of the new aborts and a small head.
    assert stats["last_snapshot_bytes"] < 20 * 24 + 200
    before = scanned(client, "t")
    broker.close()
    broker = env(txn_snapshot_every_txns=10)
    client = broker.client()
    stats = broker.admin.transaction_buffer_stats("t")
    assert stats["snapshot_load_error"] is None
    assert stats["aborted_txn_count"] == 20 and stats["ongoing_txn_size"] == 1
    assert scanned(client, "t") == before == sorted(b"v%d" % i for i in range(40) if i % 2)
    client.transaction(open_txn.id).commit()
    assert b"open" in scanned(client, "t")


def test_a_corrupt_snapshot_is_ignored_and_rebuilt_from_the_ledger(env, tmp_path):
    import lmdb

    broker = env(txn_snapshot_every_txns=5)
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    _txns(client, producer, 12, abort_every=3)
    before = scanned(client, "t")
    broker.close()
    lenv = lmdb.open(str(tmp_path / "data"), max_dbs=64)
    db = lenv.open_db(b"tbsnapshot")
    with lenv.begin(write=True) as txn:
        key = b"persistent://public/default/t\0h"
        raw = bytearray(txn.get(key, db=db))
        raw[-1] ^= 0xFF
        txn.put(key, bytes(raw), db=db)
    lenv.close()
    broker = env(txn_snapshot_every_txns=5)
    client = broker.client()
    stats = broker.admin.transaction_buffer_stats("t")
    assert "checksum" in stats["snapshot_load_error"]
    assert stats["aborted_txn_count"] == 4
    assert scanned(client, "t") == before


class _Unreachable:
    """A participant resolver that makes one kind of participant fail (the broker's own is
    used for everything else): the transaction stays COMMITTING/ABORTING until recovery."""

    def __init__(self, kind):
        self.kind = kind

    def __call__(self, kind, name):
        if kind == self.kind:
            return self

    def end_txn(self, txn_id, commit, low_watermark):
        raise OSError("participant unreachable")


@pytest.mark.parametrize("commit", [True, False])
@pytest.mark.parametrize("stuck", ["partition", "subscription"])
def test_restart_while_committing_or_aborting(env, commit, stuck):
    broker = env(txn_participants=_Unreachable(stuck))
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    producer.send(b"input")
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    (m,) = drain(consumer)
    txn = client.new_transaction()
    producer.send(b"output", txn=txn)
    consumer.acknowledge(m, txn=txn)
    (txn.commit if commit else txn.abort)()  # decided: returns, the participant is retried
    assert txn.state is (TxnState.COMMITTING if commit else TxnState.ABORTING)
    tid = txn.id
    broker.close()
    broker = env()  # every participant reachable again: recovery finishes the decision
    client = broker.client()
    deadline = time.monotonic() + 5
    while client.transaction(tid).state not in (TxnState.COMMITTED, TxnState.ABORTED):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert client.transaction(tid).state is (TxnState.COMMITTED if commit else TxnState.ABORTED)
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    got = [x.data() for x in drain(consumer)]
    if commit:
        assert got == [b"output"]  # the input's ack applied once, the output visible once
    else:
        assert got == [b"input"]  # the output never visible, the input delivered again
    broker.close()
    broker = env()
    assert scanned(broker.client(), "t") == ([b"input", b"output"] if commit else [b"input"])


_CRASH_WITH_ACKS = r"""
import os, sys
import pulsartxn
broker = pulsartxn.Broker(sys.argv[1], sync=True, batching_max_publish_delay_ms=60_000)
# "session": the network service's client of one session (its transactions outlive this
# process); "in-process": an embedded client's (they die with it).
if sys.argv[2] == "session":
    client = broker.client(session="s-1")
else:
    client = broker.client()
producer = client.create_producer("t", batching_enabled=False)
for i in range(3):
    producer.send(b"m%d" % i)
consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
txn = client.new_transaction(timeout_ms=600_000)
for _ in range(3):
    consumer.acknowledge(consumer.receive(1000), txn=txn)
print(txn.id, flush=True)
os._exit(0)  # the process dies at once, the transaction open
"""


def _crash_with_acks(tmp_path, owner: str):
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(_CRASH_WITH_ACKS)
    data = tmp_path / "data"
    run = subprocess.run(
        [sys.executable, str(script), str(data), owner], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return data, TxnID.parse(run.stdout.strip())


def _reboot(data) -> None:
    """What the broker finds after the machine restarted: another boot id than at its last
    open (the writes it stored but had not flushed may be gone)."""
    from pulsartxn.storage import Storage
    from pulsartxn.txn.clean_close import BOOT_KEY

    storage = Storage(str(data))  # replays the journal the crash left
    storage.write(lambda t: t.put(BOOT_KEY, b"another-boot", db=storage.meta))
    storage.close()


def test_a_sessions_acks_outlive_its_brokers_crash(tmp_path):
    """A network session's transaction outlives its broker's process, and so do the acks it
    was answered (stored before the answer): any handle commits it after the restart."""
    data, txn_id = _crash_with_acks(tmp_path, "session")
    with pulsartxn.Broker(data, sync=False) as broker:
        assert broker.admin.coordinator_stats(txn_id.coordinator_id)["recovered_unverified"] == 0
        assert broker.admin.pending_ack_stats("t", "s")["ongoing_txn_size"] == 1
        client = broker.client()
        client.transaction(txn_id).commit()
        assert (
            drain(client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest))
            == []
        )  # all three acknowledged


@pytest.mark.parametrize("handle", ["counted", "uncounted"])
def test_after_a_reboot_only_the_counting_handle_commits(tmp_path, handle):
    """After the machine restarted, what a transaction was answered and the broker had not
    flushed may be gone: its commit must state what it made (the handle that opened it
    counts), checked against what the broker holds; a handle that cannot say cannot commit,
    and its commit aborts the transaction, saying why."""
    data, txn_id = _crash_with_acks(tmp_path, "session")
    _reboot(data)
    with pulsartxn.Broker(data, sync=False) as broker:
        assert broker.admin.coordinator_stats(txn_id.coordinator_id)["recovered_unverified"] == 1
        client = broker.client(session="s-1")
        txn = client.transaction(txn_id)
        partition = broker.topic_partitions("t")[0]
        consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        if handle == "counted":
            with pytest.raises(InvalidTxnStatus, match="1 of its 4 acknowledgements.*aborted"):
                txn.commit(counts=({(partition, "s"): 4}, {}))  # one more than it holds
            assert txn.state is TxnState.ABORTED
            assert [m.data() for m in drain(consumer)] == [b"m0", b"m1", b"m2"]
            return
        with pytest.raises(InvalidTxnStatus, match="only the handle.*aborted"):
            txn.commit()
        assert txn.state is TxnState.ABORTED
        assert [m.data() for m in drain(consumer)] == [b"m0", b"m1", b"m2"]


def test_after_a_reboot_the_counting_handle_commits_what_is_all_there(tmp_path):
    data, txn_id = _crash_with_acks(tmp_path, "session")
    _reboot(data)
    with pulsartxn.Broker(data, sync=False) as broker:
        client = broker.client(session="s-1")
        partition = broker.topic_partitions("t")[0]
        client.transaction(txn_id).commit(counts=({(partition, "s"): 3}, {}))
        assert (
            drain(client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest))
            == []
        )


def test_an_in_process_transaction_dies_with_its_process(tmp_path):
    """Its client is gone: recovery aborts it at once (not at its timeout, 10 minutes away),
    and the messages it held come back. Its begin rode with its acks, which had not reached
    the log: no trace of it is left, and ending it says it is unknown."""
    data, txn_id = _crash_with_acks(tmp_path, "in-process")
    with pulsartxn.Broker(data, sync=False) as broker:
        client = broker.client()
        with pytest.raises(TransactionNotFound):
            client.transaction(txn_id)
        consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        assert [m.data() for m in drain(consumer)] == [b"m0", b"m1", b"m2"]


def test_a_one_write_end_deletes_a_registration_the_flusher_logged(env):
    """A subscription's registration rides in the pending-ack log write of its acks, which the
    broker's flusher may make before the transaction ends, carrying the NEW record with it.
    The transaction's one-write end must delete those records too, or a reopen finds it OPEN
    (and aborts it) although its markers say committed."""
    broker = env()
    client = broker.client()
    client.create_producer("in", batching_enabled=False).send(b"x")
    consumer = client.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    m = consumer.receive(2000)
    txn = client.new_transaction()
    consumer.acknowledge(m, txn=txn)
    pending = broker.topics.partition(broker.topic_partitions("in")[0]).subscriptions["s"]
    pending.pending_ack.flush()  # as the flusher does after its delay: rows + registration
    # The flusher may have taken them first, its write still on the way: wait for it.
    deadline = time.monotonic() + 10
    while _logged(broker, txn.id) == [] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _logged(broker, txn.id) != []
    client.create_producer("out").send_async(b"y", txn=txn)  # rides in the end
    txn.commit()
    assert _logged(broker, txn.id) == []
    broker.close()
    broker = env()
    client = broker.client()
    assert broker.admin.slow_transactions(0) == []  # none left open, to be aborted
    assert scanned(client, "out") == [b"y"]
    assert (
        drain(client.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest))
        == []
    )
