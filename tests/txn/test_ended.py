"""Ended transactions at the edges: their late operations, registrations that land after
their cleanup, participants their end never reached, and the low watermark that cleans up
after them. (env: tests/txn/conftest.py, the embedded and the remote client.)"""

from __future__ import annotations

import functools
import threading
import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType, TxnState
from pulsartxn.errors import AlreadyClosed, InvalidTxnStatus, TransactionTimeout
from tests import helpers

drain = functools.partial(helpers.drain, timeout_ms=100)
wait_for = helpers.wait_for


@pytest.mark.parametrize("end", ["commit", "abort", "timeout"])
def test_late_acks_of_an_ended_transaction_are_refused(env, end):
    """A transactional ack that comes after its transaction ended (committed, aborted, timed
    out), through any handle, is refused and holds nothing: the message is delivered again
    and a plain ack takes it."""
    broker = env()
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    producer.send(b"a")
    producer.send(b"b")
    consumer = client.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    a, b = drain(consumer)
    txn = client.new_transaction(timeout_ms=100 if end == "timeout" else 60_000)
    consumer.acknowledge(a, txn=txn)
    if end == "commit":
        txn.commit()
    elif end == "abort":
        txn.abort()
    else:
        wait_for(lambda: txn.state is TxnState.TIMEOUT)
    late = client.transaction(txn.id)  # a handle that does not know it ended
    error = TransactionTimeout if end == "timeout" else InvalidTxnStatus
    with pytest.raises(error):
        consumer.acknowledge(b, txn=late)
    assert broker.admin.pending_ack_stats("t", "s")["ongoing_txn_size"] == 0
    consumer.redeliver_unacknowledged_messages()
    got = drain(consumer)
    assert sorted(m.data() for m in got) == ([b"b"] if end == "commit" else [b"a", b"b"])
    for m in got:
        consumer.acknowledge(m)  # nothing holds them
    assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 0


def test_a_late_send_is_refused_after_the_buffer_forgot_the_transaction(tmp_path):
    """The transaction buffer remembers a bounded number of ended transactions; past it,
    the coordinator (or its low watermark) still refuses a late send."""
    with pulsartxn.Broker(tmp_path / "data", sync=False, num_coordinators=1) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        part = broker.topics.partition(broker.topic_partitions("t")[0])
        part.buffer.max_ended = 2
        holder = client.new_transaction()  # holds the low watermark below the others
        ended = []
        for i in range(4):
            txn = client.new_transaction()
            producer.send(b"x%d" % i, txn=txn)
            txn.commit()
            ended.append(txn.id)
        assert ended[0] not in part.buffer.ended  # forgotten here
        with pytest.raises(InvalidTxnStatus, match="COMMITTED"):
            producer.send(b"late", txn=client.transaction(ended[0]))
        holder.abort()
        assert helpers.scanned(client, "t", sort=True) == [b"x0", b"x1", b"x2", b"x3"]


class _Elsewhere:
    """A participant resolver for participants that live in another broker (they answer
    here, the real ones of this broker never hear of the end): the coordinator finalizes
    them one by one, as it would remote ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.calls: list = []

    def __call__(self, kind, name):
        return self if kind == self.kind else None

    def end_txn(self, txn_id, commit, low_watermark) -> None:
        self.calls.append((txn_id, commit))


def test_a_registration_landing_after_the_cleanup_writes_nothing(tmp_path):
    """A subscription's registration rides in the pending-ack log write of its acks. If that
    write lands after the transaction's records were deleted (its end finalized one by one),
    it must write nothing: a NEW record with it would come back after a restart as an OPEN
    transaction holding the low watermark back until its deadline."""
    elsewhere = _Elsewhere("partition")
    data = tmp_path / "data"
    with pulsartxn.Broker(
        data,
        sync=True,
        num_coordinators=1,
        batching_max_publish_delay_ms=60_000,
        txn_participants=elsewhere,
    ) as broker:
        client = broker.client()
        client.create_producer("in", batching_enabled=False).send(b"x")
        consumer = client.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        txn = client.new_transaction()
        client.create_producer("out").send(b"y", txn=txn)  # a participant elsewhere
        consumer.acknowledge(consumer.receive(2000), txn=txn)
        pending = broker.topics.partition(broker.topic_partitions("in")[0]).subscriptions["s"]
        pending = pending.pending_ack
        with pending.lock:  # taken for the log; its write is on its way
            late = pending._rows_op(*pending._take_unlogged())
        txn.abort()
        assert txn.state is TxnState.ABORTED
        log_db = broker.storage.open_db(b"txnlog/0")
        wait_for(lambda: _entries(broker, log_db) == 0)  # cleaned up
        broker.storage.run(late)
        assert _entries(broker, log_db) == 0
        assert _entries(broker, broker.storage.open_db(b"pendingack")) == 0
    with pulsartxn.Broker(data, sync=True, num_coordinators=1) as broker:
        assert broker.admin.coordinator_stats(0)["recovered_txns"] == 0
        assert broker.admin.slow_transactions(0) == []


def _entries(broker, db) -> int:
    with broker.storage.read() as t:
        return t.stat(db)["entries"]


def test_the_timer_pushes_the_low_watermark_to_participants_that_missed_an_end(tmp_path):
    """A partition and a subscription that never heard of a transaction's end (its end went
    to participants elsewhere) keep it ongoing: readers of the partition stop at it, and its
    acks stay held. Once its coordinator's low watermark passes it, the coordinator's timer
    tells them, without more traffic: the partition aborts it, the subscription releases."""
    elsewhere = _Elsewhere("partition")
    subs_elsewhere = _Elsewhere("subscription")

    def resolve(kind, name):
        return elsewhere(kind, name) or subs_elsewhere(kind, name)

    with pulsartxn.Broker(
        tmp_path / "data",
        sync=False,
        num_coordinators=1,
        txn_timeout_tick_ms=10,
        txn_participants=resolve,
    ) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        producer.send(b"input")
        consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        (m,) = drain(consumer)
        txn = client.new_transaction()
        producer.send(b"lost-end", txn=txn)
        consumer.acknowledge(m, txn=txn)
        producer.send(b"after")
        txn.commit()  # its participants here are told nothing
        assert txn.state is TxnState.COMMITTED and elsewhere.calls and subs_elsewhere.calls
        wait_for(
            lambda: (
                broker.admin.transaction_buffer_stats("t")["ongoing_txn_size"] == 0
                and broker.admin.pending_ack_stats("t", "s")["ongoing_txn_size"] == 0
            )
        )
        stats = broker.admin.transaction_buffer_stats("t")
        assert stats["aborted_by_low_watermark"] == 1 and stats["ended_remembered"] == 0
        consumer.redeliver_unacknowledged_messages()
        assert [x.data() for x in drain(consumer)] == [b"input", b"after"]


def test_the_timer_lets_buffers_forget_ended_transactions(tmp_path):
    """A buffer remembers the transactions that ended on it (late sends refused) until their
    coordinator's low watermark passes them; the timer brings it without more traffic."""
    with pulsartxn.Broker(
        tmp_path / "data", sync=False, num_coordinators=1, txn_timeout_tick_ms=10
    ) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        for i in range(3):
            txn = client.new_transaction()
            producer.send(b"%d" % i, txn=txn)
            txn.commit()
        wait_for(lambda: broker.admin.transaction_buffer_stats("t")["ended_remembered"] == 0)
        stats = broker.admin.transaction_buffer_stats("t")
        assert int(stats["low_watermarks"]["0"]) > txn.id.sequence


def test_a_closed_client_aborts_the_transactions_it_left_open(env):
    """A client's close aborts the open transactions it began: nobody else holds them, and
    each would hold its partitions' readers back until its timeout. A group's is left to its
    group's decision; one that ended before the close stays as it ended."""
    broker = env()
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    committed = client.new_transaction(timeout_ms=600_000)
    producer.send(b"committed", txn=committed)
    committed.commit()
    left_open = client.new_transaction(timeout_ms=600_000)
    producer.send(b"left open", txn=left_open)
    grouped = client.new_transaction(timeout_ms=600_000, group="g")
    producer.send(b"grouped", txn=grouped)
    capability = client.group_capability("g")
    producer.send(b"plain")  # behind the open transactions: unreadable until they end
    ids = {t: t.id for t in (committed, left_open, grouped)}
    client.close()
    service = broker.txn
    assert service.state_of(ids[committed]) is TxnState.COMMITTED
    assert service.state_of(ids[left_open]) is TxnState.ABORTED
    assert service.state_of(ids[grouped]) is TxnState.OPEN
    with pytest.raises(InvalidTxnStatus, match="client went away"):
        broker.client().transaction(ids[left_open]).commit()
    other = broker.client()
    other.abort_group("g", group_capability=capability)
    assert helpers.scanned(other, "t") == [b"committed", b"plain"]


def test_an_in_process_client_forgets_the_transactions_that_ended(tmp_path):
    """What an in-process client remembers to abort at its close stays bounded: ended
    transactions are forgotten as it goes, and the open one among thousands is aborted."""
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        left_open = client.new_transaction(timeout_ms=600_000)
        producer.send(b"left open", txn=left_open)
        for i in range(3000):
            txn = client.new_transaction()
            producer.send(b"%d" % i, txn=txn)
            txn.commit()
        assert len(client._began) < 1100  # the open one, and those since the last pruning
        client.close()
        assert broker.txn.state_of(left_open.id) is TxnState.ABORTED
        assert len(helpers.scanned(broker.client(), "t")) == 3000


def test_threads_beginning_at_once_lose_none_to_a_pruning(tmp_path):
    """Threads that begin transactions on one client while it prunes what it remembers: none
    of them fails, and every one left open is aborted by the close."""
    with pulsartxn.Broker(tmp_path / "d", num_coordinators=4, sync=False) as broker:
        client = broker.client()
        txns: list = []
        errors: list = []

        def begin():
            try:
                for _ in range(3000):
                    txns.append(client.new_transaction(timeout_ms=600_000))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=begin) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        client.close()
        assert {broker.txn.state_of(t.id) for t in txns} == {TxnState.ABORTED}


def test_a_close_racing_begins_leaves_none_open(tmp_path):
    """Threads beginning transactions while the client closes: each begin either returns a
    transaction the close aborts or raises AlreadyClosed, and none is left OPEN (a begin
    that slipped past the close's check would have been remembered where the close no
    longer looks). A second close changes nothing."""
    with pulsartxn.Broker(tmp_path / "d", num_coordinators=4, sync=False) as broker:
        for _ in range(20):
            client = broker.client()
            begun: list = []
            refused: list = []
            started = threading.Barrier(5)

            def begin(client=client, begun=begun, refused=refused, started=started):
                started.wait()
                while True:
                    try:
                        begun.append(client.new_transaction(timeout_ms=600_000))
                    except AlreadyClosed:
                        refused.append(1)
                        return

            threads = [threading.Thread(target=begin) for _ in range(4)]
            for t in threads:
                t.start()
            started.wait()
            time.sleep(0.01)
            client.close()
            for t in threads:
                t.join()
            assert len(refused) == 4 and begun
            assert broker.txn.owned() == []  # nothing OPEN: not one begin outlived the close
            assert {broker.txn.state_of(t.id) for t in begun} == {TxnState.ABORTED}
            client.close()
            assert {broker.txn.state_of(t.id) for t in begun} == {TxnState.ABORTED}
            with pytest.raises(AlreadyClosed):
                client.new_transaction()


def test_how_transactions_ended_is_kept_for_the_last_sequences_only(tmp_path, monkeypatch):
    """The outcome kept for each ended transaction that wrote anything (what answers an end
    re-sent after a restart) is let go once OUTCOMES_KEPT newer sequences were handed out,
    by the coordinators' timer: the store holds a bounded number of them, the newest."""
    from pulsartxn.txn import coordinator, log

    monkeypatch.setattr(log, "OUTCOMES_KEPT", 16)
    monkeypatch.setattr(coordinator, "OUTCOME_PAGE", 4)
    path = str(tmp_path / "b")
    with pulsartxn.Broker(path, num_coordinators=1) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        ids = []
        for i in range(60):
            txn = client.new_transaction()
            producer.send(b"%d" % i, txn=txn)
            (txn.commit if i % 2 else txn.abort)()
            ids.append(txn.id)
        empty = client.new_transaction()  # writes nothing: nothing to keep
        empty.commit()

        def kept() -> list[int]:
            env = broker.storage.env
            with env.begin() as lmdb_txn:
                db = env.open_db(log.OUTCOMES_DB, txn=lmdb_txn, create=False)
                return [int.from_bytes(bytes(k)[4:], "big") for k, _ in lmdb_txn.cursor(db=db)]

        newest = [t.sequence for t in ids][-12:]
        wait_for(lambda: len(kept()) <= 16 + 4, what="the old outcomes pruned")
        assert set(newest) <= set(kept()) and empty.id.sequence not in kept()
    with pulsartxn.Broker(path, num_coordinators=1) as broker:
        client = broker.client()
        for i, txn_id in enumerate(ids[-12:], start=48):
            state = TxnState.COMMITTED if i % 2 else TxnState.ABORTED
            assert client.transaction(txn_id).state is state
        with pytest.raises(pulsartxn.TransactionNotFound):
            client.transaction(ids[0])  # let go: as any transaction the store forgot
