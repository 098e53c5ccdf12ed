"""Fault injection in finalize: a participant that fails is retried with backoff until it
succeeds, and meanwhile the admin view shows the transaction still being finalized.

Faults are injected into real components: a participant resolver on a real broker, the real
transaction buffer of a real partition whose marker write fails inside the group commit with
an LMDB error, a real subscription's pending acks, and a broker closed in the middle of it."""

from __future__ import annotations

import functools
import threading
import time

import lmdb
import pytest

import pulsartxn
from pulsartxn import TxnID
from tests import helpers
from tests.helpers import wait_for


class Fault:
    """Fails while armed (or for its first `times` calls), counting the failures."""

    def __init__(self, times: int | None = None, exc: Exception | None = None) -> None:
        self.times = times
        self.exc = exc if exc is not None else OSError("injected failure")
        self.armed = threading.Event()
        self.armed.set()
        self.failures = 0
        self.lock = threading.Lock()

    def hit(self) -> None:
        with self.lock:
            if not self.armed.is_set():
                return
            if self.times is not None and self.failures >= self.times:
                self.armed.clear()
                return
            self.failures += 1
        raise self.exc

    def release(self) -> None:
        self.armed.clear()


class FlakyParticipant:
    """A resource manager whose end_txn hits a Fault first; records successful calls."""

    def __init__(self, fault: Fault | None = None) -> None:
        self.fault = fault
        self.calls: list = []

    def end_txn(self, txn_id, commit, low_watermark) -> None:
        if self.fault is not None:
            self.fault.hit()
        self.calls.append((txn_id, commit))


def finalizing(broker, txn_id: TxnID) -> dict:
    """The admin view of a transaction while it is being finalized, checked for consistency."""
    admin = broker.admin
    meta = admin.transaction_metadata(txn_id)
    stats = admin.coordinator_stats(txn_id.coordinator_id)
    listed = [f for f in stats["finalizing"] if f["txn_id"] == str(txn_id)]
    slow = [m for m in admin.slow_transactions(0) if m["txn_id"] == str(txn_id)]
    return {"meta": meta, "stats": stats, "listed": listed, "slow": slow}


@pytest.mark.parametrize("commit", [True, False])
def test_failing_participant_is_retried_and_shown_finalizing(tmp_path, commit):
    fault = Fault()
    flaky = FlakyParticipant(fault)
    healthy = FlakyParticipant()

    def resolve(kind, name):
        return flaky if name == "p-bad" else healthy

    with pulsartxn.Broker(
        tmp_path / "data", num_coordinators=2, sync=True, txn_participants=resolve
    ) as broker:
        client = broker.client()
        txn = client.new_transaction()
        broker.txn.add_partitions(txn.id, ["p-good", "p-bad"])
        broker.txn.add_subscriptions(txn.id, [("p-good", "sub")])
        done = threading.Event()
        ender = threading.Thread(
            target=lambda: (txn.commit() if commit else txn.abort(), done.set()), daemon=True
        )
        ender.start()
        state = "COMMITTING" if commit else "ABORTING"

        view = wait_for(
            lambda: (v := finalizing(broker, txn.id))["meta"]["finalize_retries"] >= 3 and v,
            what="three failed attempts",
        )
        # Decided: commit()/abort() returned once the failing participant failed its part.
        assert done.wait(10)
        assert view["meta"]["state"] == state
        assert view["meta"]["pending_participants"] == 1
        assert "injected failure" in view["meta"]["last_error"]
        assert "p-bad" in view["meta"]["last_error"]
        assert view["stats"]["committing" if commit else "aborting"] == 1
        assert view["stats"]["finalize_retries"] >= 3
        assert view["listed"] and view["listed"][0]["state"] == state
        assert view["listed"][0]["pending_participants"] == 1
        assert view["slow"] and view["slow"][0]["state"] == state
        assert txn.state.value == state
        # The healthy participants were finalized at once, once each.
        assert sorted(healthy.calls) == [(txn.id, commit), (txn.id, commit)]
        assert flaky.calls == []

        # Backoff: failures do not spin (10 ms doubling per attempt).
        before = fault.failures
        time.sleep(0.05)
        assert fault.failures - before <= 3

        fault.release()
        ender.join()
        final = "COMMITTED" if commit else "ABORTED"
        wait_for(lambda: txn.state.value == final, what=final)
        assert flaky.calls == [(txn.id, commit)]
        assert broker.admin.transaction_metadata(txn.id)["state"] == final
        stats = broker.admin.coordinator_stats(txn.id.coordinator_id)
        assert stats["committing"] == stats["aborting"] == 0 and stats["finalizing"] == []
        assert broker.admin.slow_transactions(0) == []


def test_commit_returns_while_finalizing_and_completes(tmp_path):
    fault = Fault()
    participant = FlakyParticipant(fault)
    with pulsartxn.Broker(
        tmp_path / "data", num_coordinators=1, sync=True, txn_participants=lambda k, n: participant
    ) as broker:
        client = broker.client()
        txn = client.new_transaction()
        broker.txn.add_partitions(txn.id, ["p"])
        txn.commit()  # the decision is durable; its one participant is retried
        assert txn.state is pulsartxn.TxnState.COMMITTING
        with pytest.raises(pulsartxn.InvalidTxnStatus):
            txn.abort()  # decided: it can no longer change its mind
        assert broker.admin.coordinator_stats(0)["committing"] == 1
        fault.release()
        wait_for(lambda: txn.state is pulsartxn.TxnState.COMMITTED, what="COMMITTED")
        assert participant.calls == [(txn.id, True)]


def _partitions_of(producer_msgs) -> set:
    return {m.partition() for m in producer_msgs}


def _send_spread(producer, txn, n: int, prefix: str) -> list:
    """n messages in txn with keys that reach every partition of a 2-partition topic."""
    ids = [producer.send(f"{prefix}{i}".encode(), partition_key=f"k{i}", txn=txn) for i in range(n)]
    assert _partitions_of(ids) == {0, 1}
    return ids


def _inject_marker_fault(partition, fault: Fault) -> None:
    """The partition's next appends (its commit/abort markers) fail inside the group commit
    with an LMDB error, before anything is written."""
    original = partition.append_op

    def append_op(*args, **kwargs):
        op = original(*args, **kwargs)
        apply = op.apply

        def failing_apply(txn):
            fault.hit()
            return apply(txn)

        op.apply = failing_apply
        return op

    partition.append_op = append_op


# This module drains with a 300 ms wait (the shared default is 200 ms).
drain = functools.partial(helpers.drain, timeout_ms=300)


def test_lmdb_error_in_a_real_buffer_is_retried_until_the_marker_is_written(tmp_path):
    with pulsartxn.Broker(tmp_path / "data", num_coordinators=2, sync=True) as broker:
        broker.create_topic("t", partitions=2)
        client = broker.client()
        producer = client.create_producer("t")
        consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        txn = client.new_transaction()
        _send_spread(producer, txn, 8, "m")
        part = broker.topics.partition(broker.topic_partitions("t")[1])
        fault = Fault(exc=lmdb.Error("mdb_put: injected write error"))
        _inject_marker_fault(part, fault)
        done = threading.Event()
        threading.Thread(target=lambda: (txn.commit(), done.set()), daemon=True).start()

        meta = wait_for(
            lambda: (m := broker.admin.transaction_metadata(txn.id))["finalize_retries"] >= 3 and m,
            what="three failed marker writes",
        )
        assert meta["state"] == "COMMITTING" and meta["pending_participants"] == 1
        assert "injected write error" in meta["last_error"]
        assert part.topic in meta["last_error"]
        assert done.wait(10)  # decided: the commit returned, the marker is retried
        # The failing partition holds its messages back: its buffer still has the txn ongoing.
        tb = broker.admin.transaction_buffer_stats("t")["partitions"][part.topic]
        assert tb["ongoing_txn_size"] == 1 and str(txn.id) in tb["ongoing_txns"]
        early = drain(consumer, timeout_ms=100)
        assert all(m.message_id().partition() == 0 for m in early)
        assert fault.failures >= 3

        fault.release()
        wait_for(lambda: txn.state is pulsartxn.TxnState.COMMITTED, what="COMMITTED")
        tb = broker.admin.transaction_buffer_stats("t")["partitions"][part.topic]
        assert tb["ongoing_txn_size"] == 0 and tb["committed"] == 1
        got = sorted(m.data() for m in early + drain(consumer))
        assert got == sorted(f"m{i}".encode() for i in range(8))  # all of them, once each


def test_pending_ack_failing_on_abort_keeps_messages_until_it_succeeds(tmp_path):
    with pulsartxn.Broker(tmp_path / "data", num_coordinators=2, sync=True) as broker:
        client = broker.client()
        producer = client.create_producer("in")
        for i in range(3):
            producer.send(f"x{i}".encode())
        consumer = client.subscribe(
            "in",
            "s",
            subscription_type=pulsartxn.ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        msgs = [consumer.receive(timeout_millis=2000) for _ in range(3)]
        txn = client.new_transaction()
        for m in msgs:
            consumer.acknowledge(m, txn=txn)
        sub = broker.topics.partition(broker.topic_partitions("in")[0]).subscriptions["s"]
        fault = Fault(exc=lmdb.Error("injected: pending ack log write failed"))
        pending = sub.pending_ack
        original = pending.end_txn

        def end_txn(txn_id, commit, low_watermark, **kwargs):
            fault.hit()
            return original(txn_id, commit, low_watermark, **kwargs)

        pending.end_txn = end_txn
        retries_before = broker.admin.coordinator_stats(txn.id.coordinator_id)["finalize_retries"]
        done = threading.Event()
        threading.Thread(target=lambda: (txn.abort(), done.set()), daemon=True).start()
        view = wait_for(
            lambda: (m := broker.admin.transaction_metadata(txn.id))["finalize_retries"] >= 2 and m,
            what="failed pending-ack aborts",
        )
        assert view["state"] == "ABORTING"
        assert view["acked_subscriptions"] == [[sub.partition.topic, "s"]]
        assert "pending ack log write failed" in view["last_error"]
        # Still held by the aborting transaction: nothing is redelivered yet.
        with pytest.raises(pulsartxn.Timeout):
            consumer.receive(timeout_millis=50)
        assert done.wait(10)  # decided: the abort returned, the subscription is retried
        fault.release()
        wait_for(lambda: txn.state is pulsartxn.TxnState.ABORTED, what="ABORTED")
        stats = broker.admin.coordinator_stats(txn.id.coordinator_id)
        assert stats["finalize_retries"] - retries_before == fault.failures
        assert txn.state is pulsartxn.TxnState.ABORTED
        again = sorted(m.data() for m in drain(consumer))
        assert again == [b"x0", b"x1", b"x2"]  # aborted acks: delivered again, once each


def test_broker_closed_mid_commit_finishes_the_commit_on_recovery(tmp_path):
    data = tmp_path / "data"
    with pulsartxn.Broker(data, num_coordinators=2, sync=True) as broker:
        broker.create_topic("t", partitions=2)
        client = broker.client()
        txn = client.new_transaction()
        _send_spread(client.create_producer("t"), txn, 6, "c")
        part = broker.topics.partition(broker.topic_partitions("t")[0])
        fault = Fault(exc=lmdb.Error("injected write error"))
        _inject_marker_fault(part, fault)
        txn.commit()  # decided; the partition's marker keeps failing
        assert broker.admin.transaction_metadata(txn.id)["state"] == "COMMITTING"
        assert fault.failures >= 1
        txn_id = txn.id
    # Closed mid-commit (the partition never got its marker). Recovery finishes the commit.
    with pulsartxn.Broker(data, num_coordinators=2, sync=True) as broker:
        stats = broker.admin.coordinator_stats(txn_id.coordinator_id)
        assert stats["recovered_finalizing"] == 1
        wait_for(
            lambda: broker.admin.coordinator_stats(txn_id.coordinator_id)["committing"] == 0,
            what="recovery to finalize the commit",
        )
        consumer = broker.client().subscribe(
            "t", "s", initial_position=pulsartxn.InitialPosition.Earliest
        )
        got = sorted(m.data() for m in drain(consumer))
        assert got == sorted(f"c{i}".encode() for i in range(6))
        tb = broker.admin.transaction_buffer_stats("t")["partitions"]
        assert all(p["ongoing_txn_size"] == 0 for p in tb.values())


def test_a_one_write_end_that_fails_gives_the_cursor_back(tmp_path):
    """A subscription's part of a one-write end applies the acks to its cursor inside the
    write; when that write fails after it (a later part of the same LMDB transaction), the
    cursor and the acks waiting to be logged are given back: the transaction is still open,
    its acks still held, and an abort then delivers them again."""
    from pulsartxn.storage import WriteOp, combine

    with pulsartxn.Broker(tmp_path / "data", num_coordinators=2, sync=True) as broker:
        client = broker.client()
        inputs = client.create_producer("in", batching_enabled=False)
        for i in range(4):
            inputs.send(f"x{i}".encode())
        consumer = client.subscribe(
            "in",
            "s",
            subscription_type=pulsartxn.ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        msgs = [consumer.receive(timeout_millis=2000) for _ in range(4)]
        consumer.acknowledge(msgs[3])
        sub = broker.topics.partition(broker.topic_partitions("in")[0]).subscriptions["s"]
        txn = client.new_transaction()
        for m in msgs[:3]:
            consumer.acknowledge(m, txn=txn)
        with sub.lock:
            cursor_before = sub.cursor.serialize()
            unlogged_before = list(sub.pending_ack.unlogged[txn.id])
        fault = Fault(exc=lmdb.Error("mdb_put: injected write error"))
        part = sub.pending_ack.end_op(txn.id, True, 0, 3)
        with pytest.raises(lmdb.Error, match="injected"):
            broker.storage.run(combine([part, WriteOp(lambda t: fault.hit())]))
        with sub.lock:
            assert sub.cursor.serialize() == cursor_before
            assert sub.pending_ack.unlogged[txn.id] == unlogged_before
        with pytest.raises(pulsartxn.Timeout):
            consumer.receive(timeout_millis=50)  # still held by the open transaction
        txn.abort()
        assert sorted(m.data() for m in drain(consumer)) == [b"x0", b"x1", b"x2"]
    with pulsartxn.Broker(tmp_path / "data", num_coordinators=2, sync=True) as broker:
        got = sorted(
            m.data()
            for m in drain(
                broker.client().subscribe(
                    "in", "s", initial_position=pulsartxn.InitialPosition.Earliest
                )
            )
        )
        assert got == [b"x0", b"x1", b"x2"]


def test_a_log_write_still_on_its_way_after_a_one_write_end_writes_nothing_of_it(tmp_path):
    """The broker's flusher takes a transaction's acks for the pending-ack log; the
    transaction then ends in one write (which deletes what it had logged) before that log
    write lands: it leaves those acks out, so no row of the finished transaction outlives it
    (a reopen would replay it as held)."""
    with pulsartxn.Broker(tmp_path / "data", num_coordinators=2, sync=True) as broker:
        client = broker.client()
        inputs = client.create_producer("in", batching_enabled=False)
        inputs.send(b"x0")
        inputs.send(b"x1")
        consumer = client.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        m0 = consumer.receive(timeout_millis=2000)
        pending = broker.topics.partition(broker.topic_partitions("in")[0]).subscriptions["s"]
        pending = pending.pending_ack
        txn = client.new_transaction()
        consumer.acknowledge(m0, txn=txn)
        with pending.lock:
            late = pending._rows_op(*pending._take_unlogged())  # taken, not yet written
        txn.commit()
        broker.storage.run(late)
        with broker.storage.read() as t:
            rows = [bytes(k) for k, _ in t.cursor(db=broker.storage.open_db(b"pendingack"))]
        assert rows == []
        again = client.new_transaction()  # the message after it, acked in a new transaction
        consumer.acknowledge(consumer.receive(timeout_millis=2000), txn=again)
    # Closed with `again` open: aborted (in-process), its ack released.
    with pulsartxn.Broker(tmp_path / "data", num_coordinators=2, sync=True) as broker:
        client = broker.client()
        assert broker.admin.pending_ack_stats("in", "s")["error"] is None
        assert [
            m.data()
            for m in drain(
                client.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest)
            )
        ] == [b"x1"]


def _one_subscription(tmp_path, n=4):
    broker = pulsartxn.Broker(tmp_path / "data", sync=True)
    client = broker.client()
    inputs = client.create_producer("in", batching_enabled=False)
    for i in range(n):
        inputs.send(f"x{i}".encode())
    consumer = client.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    msgs = [consumer.receive(timeout_millis=2000) for _ in range(n)]
    sub = broker.topics.partition(broker.topic_partitions("in")[0]).subscriptions["s"]
    return broker, client, consumer, msgs, sub


def test_an_ack_made_while_a_one_write_end_fails_is_kept(tmp_path):
    """The cursor takes a transaction's acks only once its one-write end has landed: a plain
    ack made while that write is being applied, which then fails, stays acknowledged (a
    cursor put back as it was before the write would drop it)."""
    from pulsartxn.storage import WriteOp, combine

    broker, client, consumer, msgs, sub = _one_subscription(tmp_path)
    with broker:
        txn = client.new_transaction()
        consumer.acknowledge_cumulative(msgs[1], txn=txn)

        def ack_then_fail(t):
            consumer.acknowledge(msgs[3])  # another thread's plain ack, meanwhile
            raise lmdb.Error("mdb_put: injected write error")

        part = sub.pending_ack.end_op(txn.id, True, 0, 1)
        with pytest.raises(lmdb.Error, match="injected"):
            broker.storage.run(combine([part, WriteOp(ack_then_fail)]))
        with sub.lock:
            assert sub.cursor.mark_delete == msgs[0].message_id().entry_id() - 1
            assert sub.cursor.is_acked(msgs[3].message_id().entry_id())
            assert not sub.committing
        txn.abort()
        consumer.redeliver_unacknowledged_messages()
        assert sorted(m.data() for m in drain(consumer)) == [b"x0", b"x1", b"x2"]


def test_a_cursor_written_after_a_one_write_end_in_its_group_keeps_its_acks(tmp_path):
    """Another cursor write in the same LMDB transaction as a one-write end, after it (a
    plain ack's persist riding in that group), writes the cursor with the transaction's acks
    although the cursor in memory takes them only once the write has landed: the record
    never loses a committed transaction's acks."""
    from pulsartxn.messaging.cursor import Cursor
    from pulsartxn.storage import WriteOp, combine

    broker, client, consumer, msgs, sub = _one_subscription(tmp_path)
    with broker:
        txn = client.new_transaction()
        consumer.acknowledge_cumulative(msgs[2], txn=txn)
        cursors = broker.storage.open_db(b"cursors")

        def persist(t):  # as Subscription._write_cursor does
            with sub.lock:
                data = sub.cursor_record()
            t.put(sub.key, data, db=cursors)

        part = sub.pending_ack.end_op(txn.id, True, 0, 1)
        broker.storage.run(combine([part, WriteOp(persist)]))
        with broker.storage.read() as t:
            record = Cursor.deserialize(t.get(sub.key, db=cursors))
        with sub.lock:
            assert record.serialize() == sub.cursor.serialize()
        assert record.mark_delete == msgs[2].message_id().entry_id()
