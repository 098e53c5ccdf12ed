"""Transaction coordinators: lifecycle, log, timeouts, low watermark, finalize, recovery."""

from __future__ import annotations

import threading
import time

import lmdb
import pytest

import pulsartxn
from pulsartxn import TxnID, TxnState
from pulsartxn.errors import (
    CoordinatorNotFound,
    CoordinatorUnavailable,
    InvalidTxnStatus,
    TooManyTransactions,
    TransactionNotFound,
    TransactionTimeout,
)
from pulsartxn.txn import log

P1 = "persistent://public/default/t-partition-0"
P2 = "persistent://public/default/t-partition-1"


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def log_keys(broker, coordinator_id):
    db = broker.storage.open_db(b"txnlog/%d" % coordinator_id)
    with broker.storage.read() as txn:
        return [bytes(k) for k, _ in txn.cursor(db=db)]


def test_round_robin_ids_and_explicit_coordinator(open_broker):
    client = open_broker().client()
    txns = [client.new_transaction() for _ in range(8)]
    assert [t.id.coordinator_id for t in txns] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [t.id.sequence for t in txns] == [1, 1, 1, 1, 2, 2, 2, 2]  # 0:0 means "no txn"
    t = client.new_transaction(coordinator_id=2)
    assert t.id == TxnID(2, 3) and t.state is TxnState.OPEN
    with pytest.raises(CoordinatorNotFound):
        client.new_transaction(coordinator_id=4)


@pytest.mark.parametrize("durable_begin", [True, False])
def test_commit_and_abort_are_logged_then_the_log_is_emptied(open_broker, durable_begin):
    broker = open_broker(durable_begin=durable_begin)
    client = broker.client()
    t = client.new_transaction(coordinator_id=0)
    if durable_begin:
        assert len(log_keys(broker, 0)) == 1  # the NEW record, before new_transaction returned
    else:
        assert log_keys(broker, 0) == []  # it rides with the first write
    broker.txn.add_partitions(t.id, [P1, P2])
    assert len(log_keys(broker, 0)) == 2
    broker.txn.add_subscriptions(t.id, [(P1, "sub")])
    assert len(log_keys(broker, 0)) == 3
    t.commit()
    assert t.state is TxnState.COMMITTED
    assert wait_for(lambda: log_keys(broker, 0) == [])
    empty = client.new_transaction(coordinator_id=0)
    empty.commit()  # nothing written, nothing to delete
    assert empty.state is TxnState.COMMITTED and log_keys(broker, 0) == []
    calls = broker.txn.participants.resolve("partition", P1).calls
    assert [(c[0], c[1]) for c in calls] == [(t.id, True)]
    a = client.new_transaction(coordinator_id=0)
    broker.txn.add_partitions(a.id, [P1])
    a.abort()
    assert a.state is TxnState.ABORTED
    assert broker.txn.participants.resolve("partition", P1).outcomes()[a.id] is False
    assert broker.txn.participants.resolve("subscription", (P1, "sub")).outcomes() == {t.id: True}


@pytest.mark.parametrize("first", ["commit", "abort"])
@pytest.mark.parametrize("second", ["commit", "abort"])
def test_every_end_after_an_end_is_refused_and_changes_nothing(
    open_broker, participants, first, second
):
    broker = open_broker()
    client = broker.client()
    t = client.new_transaction()
    broker.txn.add_partitions(t.id, [P1])
    getattr(t, first)()
    final = t.state
    with pytest.raises(InvalidTxnStatus):
        getattr(t, second)()
    with pytest.raises(InvalidTxnStatus):
        broker.txn.add_partitions(t.id, [P2])
    assert t.state is final
    assert len(broker.txn.participants.resolve("partition", P1).calls) == 1
    assert ("partition", P2) not in participants.by_name


def test_context_manager_commits_or_aborts(open_broker):
    client = open_broker().client()
    with client.new_transaction() as t:
        pass
    assert t.state is TxnState.COMMITTED
    with pytest.raises(KeyError):
        with client.new_transaction() as u:
            raise KeyError("boom")
    assert u.state is TxnState.ABORTED
    with client.new_transaction() as v:
        v.abort()  # ended inside: exit leaves it alone
    assert v.state is TxnState.ABORTED


def test_timeout_aborts_and_commit_then_raises_transaction_timeout(open_broker):
    broker = open_broker()
    client = broker.client()
    t = client.new_transaction(timeout_ms=50)
    broker.txn.add_partitions(t.id, [P1])
    keep = client.new_transaction(timeout_ms=60_000)
    assert wait_for(lambda: t.state is TxnState.TIMEOUT)
    with pytest.raises(TransactionTimeout):
        t.commit()
    with pytest.raises(TransactionTimeout):
        broker.txn.add_partitions(t.id, [P2])
    assert issubclass(TransactionTimeout, InvalidTxnStatus)
    assert broker.txn.participants.resolve("partition", P1).outcomes() == {t.id: False}
    assert keep.state is TxnState.OPEN
    stats = broker.admin.coordinator_stats(t.id.coordinator_id)
    assert stats["timed_out"] == 1 and stats["aborted"] == 1


def test_many_short_timeouts_all_fire(open_broker):
    broker = open_broker()
    client = broker.client()
    txns = [client.new_transaction(timeout_ms=20 + (i % 7) * 10) for i in range(300)]
    assert wait_for(lambda: all(t.state is TxnState.TIMEOUT for t in txns), timeout=10)
    assert sum(s["active"] for s in broker.admin.coordinators()) == 0


def test_bad_timeouts_and_unknown_ids(open_broker):
    broker = open_broker(max_txn_timeout_ms=10_000)
    client = broker.client()
    for bad in (0, -5, 1 << 41):
        with pytest.raises(ValueError):
            client.new_transaction(timeout_ms=bad)
    with pytest.raises(TypeError):
        client.new_transaction(timeout_ms=1.5)
    capped = client.new_transaction(timeout_ms=10**9)
    assert broker.admin.transaction_metadata(capped.id)["timeout_ms"] == 10_000
    with pytest.raises(TransactionNotFound):
        client.transaction(TxnID(1, 999))
    with pytest.raises(CoordinatorNotFound):
        client.transaction(TxnID(9, 0))
    with pytest.raises(CoordinatorNotFound):
        client.commit_all([TxnID(9, 0)])
    assert sum(s["active"] for s in broker.admin.coordinators()) == 1


def test_handle_by_id_from_another_client(open_broker):
    broker = open_broker()
    t = broker.client().new_transaction()
    other = broker.client().transaction(str(t.id))
    other.commit()
    assert t.state is TxnState.COMMITTED
    assert broker.client().transaction(int(t.id)).state is TxnState.COMMITTED


def test_low_watermark_after_out_of_order_ends(open_broker):
    broker = open_broker(num_coordinators=1)
    client = broker.client()
    txns = [client.new_transaction() for _ in range(5)]
    coordinator = broker.txn.coordinator(0)
    assert [t.id.sequence for t in txns] == [1, 2, 3, 4, 5]
    assert coordinator.low_watermark() == 1
    txns[1].commit()
    txns[3].abort()
    assert coordinator.low_watermark() == 1
    txns[0].commit()
    assert coordinator.low_watermark() == 3
    txns[2].abort()
    assert coordinator.low_watermark() == 5
    txns[4].commit()
    assert coordinator.low_watermark() == 6  # nothing live: the next sequence
    # The watermark reaches participants at finalize: below it, everything is finished.
    t = client.new_transaction()
    broker.txn.add_partitions(t.id, [P1])
    t.commit()
    ((_, _, lwm),) = broker.txn.participants.resolve("partition", P1).calls
    assert lwm == t.id.sequence == 6


def test_failing_participant_is_retried_and_does_not_hold_back_others(open_broker, participants):
    broker = open_broker()
    client = broker.client()
    bad = participants("partition", P1)
    bad.failures = 4
    good = participants("partition", P2)
    t = client.new_transaction()
    broker.txn.add_partitions(t.id, [P1, P2])
    t.commit()  # returns: the decision is durable, the failing one is retried meanwhile
    assert wait_for(lambda: good.outcomes() == {t.id: True})  # not held back by the failing one
    view = broker.admin.coordinator_stats(t.id.coordinator_id)
    assert t.state in (TxnState.COMMITTING, TxnState.COMMITTED)
    if t.state is TxnState.COMMITTING:
        assert [f["txn_id"] for f in view["finalizing"]] == [str(t.id)]
    assert wait_for(lambda: t.state is TxnState.COMMITTED)
    assert bad.outcomes() == {t.id: True}
    assert broker.admin.coordinator_stats(t.id.coordinator_id)["finalize_retries"] == 4


def test_commit_returns_while_a_participant_keeps_failing(open_broker, participants):
    """Once its decision is durable, a commit returns even if a participant never answers
    (it used to wait for all of them, for ever); the admin views show the retries."""
    broker = open_broker()
    client = broker.client()
    bad = participants("partition", P1)
    bad.failures = 10**9
    t = client.new_transaction()
    broker.txn.add_partitions(t.id, [P1])
    t.commit()
    assert t.state is TxnState.COMMITTING
    with pytest.raises(InvalidTxnStatus, match="COMMITTING"):
        t.commit()  # decided: not again
    assert wait_for(lambda: broker.admin.coordinator_stats(t.id.coordinator_id)["finalizing"])
    (view,) = broker.admin.coordinator_stats(t.id.coordinator_id)["finalizing"]
    assert view["txn_id"] == str(t.id) and view["retries"] >= 1
    assert "injected failure" in view["last_error"]
    with bad.lock:
        bad.failures = 0
    assert wait_for(lambda: t.state is TxnState.COMMITTED, timeout=30)
    assert bad.outcomes() == {t.id: True}


def test_commit_all_is_all_or_nothing(open_broker):
    broker = open_broker()
    client = broker.client()
    a, b, c = (client.new_transaction(coordinator_id=1) for _ in range(3))
    for t, p in ((a, P1), (b, P2), (c, P1)):
        broker.txn.add_partitions(t.id, [p])
    c.abort()
    with pytest.raises(InvalidTxnStatus):
        client.commit_all([a, b, c])
    assert a.state is TxnState.OPEN and b.state is TxnState.OPEN
    assert a.id not in broker.txn.participants.resolve("partition", P1).outcomes()
    client.commit_all([a, b.id])
    assert a.state is TxnState.COMMITTED and b.state is TxnState.COMMITTED
    decisions = broker.storage.open_db(b"txndecisions")
    assert wait_for(lambda: _count(broker, decisions) == 0)


def _count(broker, db):
    with broker.storage.read() as txn:
        return txn.stat(db)["entries"]


def test_commit_group_commits_winners_and_aborts_the_rest(open_broker):
    broker = open_broker()
    client = broker.client()
    attempts = [client.new_transaction(group="job-1") for _ in range(4)]
    other = client.new_transaction(group="job-2")
    for t in attempts:
        broker.txn.add_partitions(t.id, [P1])
    result = client.commit_group("job-1", [attempts[0].id, attempts[2]])
    assert set(result["committed"]) == {attempts[0].id, attempts[2].id}
    assert set(result["aborted"]) == {attempts[1].id, attempts[3].id}
    assert [t.state for t in attempts] == [
        TxnState.COMMITTED,
        TxnState.ABORTED,
        TxnState.COMMITTED,
        TxnState.ABORTED,
    ]
    assert other.state is TxnState.OPEN
    outcomes = broker.txn.participants.resolve("partition", P1).outcomes()
    assert outcomes == {t.id: t.state is TxnState.COMMITTED for t in attempts}
    client.abort_group("job-2")
    assert other.state is TxnState.ABORTED


def test_commit_group_refuses_strangers_and_changes_nothing(open_broker):
    client = open_broker().client()
    mine = client.new_transaction(group="g")
    stranger = client.new_transaction(group="h")
    plain = client.new_transaction()
    for winners in ([stranger], [plain], [mine, stranger]):
        with pytest.raises(InvalidTxnStatus):
            client.commit_group("g", winners)
    with pytest.raises(TransactionNotFound):
        client.commit_group("g", [TxnID(0, 77)])
    assert {mine.state, stranger.state, plain.state} == {TxnState.OPEN}
    with pytest.raises(ValueError):
        client.commit_group("", [mine])
    with pytest.raises(ValueError):
        client.commit_group("g", [mine], idempotency_key=("app", -1))


def test_commit_group_idempotency_key_survives_restart(open_broker, tmp_path):
    broker = open_broker()
    client = broker.client()
    first = [client.new_transaction(group="batch") for _ in range(2)]
    assert not client.commit_group("batch", [first[0]], idempotency_key=("app", 7))["duplicate"]
    broker.close()
    broker = open_broker()
    client = broker.client()
    replay = client.new_transaction(group="batch")
    result = client.commit_group("batch", [replay], idempotency_key=("app", 7))
    assert result["duplicate"] and replay.state is TxnState.OPEN
    assert client.commit_group("batch", [replay], idempotency_key=("app", 6))["duplicate"]
    result = client.commit_group("batch", [replay], idempotency_key=("app", 8))
    assert result["committed"] == [replay.id] and replay.state is TxnState.COMMITTED


def test_limit_on_live_transactions(open_broker):
    client = open_broker(num_coordinators=1, max_active_txns_per_coordinator=3).client()
    txns = [client.new_transaction() for _ in range(3)]
    with pytest.raises(TooManyTransactions):
        client.new_transaction()
    txns[0].commit()
    client.new_transaction()


def test_recovery_keeps_open_deadlines_and_aborts_expired_ones(open_broker, participants):
    broker = open_broker(num_coordinators=2)
    client = broker.client(session="s1")  # its transactions outlive the close
    long_ = client.new_transaction(timeout_ms=60_000, coordinator_id=0)
    short = client.new_transaction(timeout_ms=300, coordinator_id=0)
    broker.txn.add_partitions(short.id, [P1])
    seen = broker.admin.coordinators()[0]["next_sequence"]
    broker.txn.close()  # stop the clock: the deadline passes while "down"
    broker.close()
    time.sleep(0.4)
    broker = open_broker(num_coordinators=2)
    client = broker.client()
    stats = broker.admin.coordinator_stats(0)
    assert stats["recovered_txns"] == 2 and stats["recovered_timed_out"] == 1
    assert wait_for(lambda: participants("partition", P1).outcomes() == {short.id: False})
    assert client.transaction(long_.id).state is TxnState.OPEN
    # The participant has it; the coordinator marks it finished right after.
    assert wait_for(lambda: client.transaction(short.id).state is TxnState.TIMEOUT)
    fresh = client.new_transaction(coordinator_id=0)
    assert fresh.id.sequence >= seen  # sequences are never handed out twice
    meta = broker.admin.transaction_metadata(long_.id)
    assert 59_000 < meta["timeout_ms"] <= 60_000 and meta["state"] == "OPEN"


def test_recovery_finalizes_committing_transactions(open_broker, participants):
    broker = open_broker()
    client = broker.client()
    p = participants("partition", P1)
    p.failures = 10**9  # never succeeds in this broker's lifetime
    t = client.new_transaction()
    broker.txn.add_partitions(t.id, [P1])
    t.commit()  # decided; its participant keeps failing
    assert t.state is TxnState.COMMITTING
    broker.close()
    p.failures = 0
    broker = open_broker()
    assert broker.admin.coordinator_stats(t.id.coordinator_id)["recovered_finalizing"] == 1
    assert wait_for(lambda: p.outcomes() == {t.id: True})
    client = broker.client()
    assert wait_for(lambda: client.transaction(t.id).state is TxnState.COMMITTED)
    assert wait_for(lambda: log_keys(broker, t.id.coordinator_id) == [])


def test_recovery_applies_a_group_decision(open_broker, participants):
    broker = open_broker()
    client = broker.client()
    p = participants("partition", P1)
    p.failures = 10**9
    txns = [client.new_transaction(group="g", coordinator_id=i % 4) for i in range(4)]
    for t in txns:
        broker.txn.add_partitions(t.id, [P1])
    done = threading.Thread(target=lambda: _swallow(client.commit_group, "g", txns[:2]))
    done.start()
    assert wait_for(lambda: p.failures < 10**9 - 3)  # the decision is logged, finalize failing
    broker.close()
    done.join()
    p.failures = 0
    broker = open_broker()
    assert wait_for(lambda: len(p.outcomes()) == 4)
    assert p.outcomes() == {t.id: i < 2 for i, t in enumerate(txns)}


def _swallow(fn, *args):
    try:
        fn(*args)
    except pulsartxn.PulsarTxnError:
        pass


def test_a_corrupt_log_stops_only_its_coordinator(open_broker, tmp_path):
    broker = open_broker()
    client = broker.client(session="s1")  # its transactions outlive the close
    t = client.new_transaction(coordinator_id=1)
    client.new_transaction(coordinator_id=2)
    broker.close()
    env = lmdb.open(str(tmp_path / "data"), max_dbs=64)
    db = env.open_db(b"txnlog/1")
    with env.begin(write=True) as txn:
        key = next(iter(txn.cursor(db=db)))[0]
        txn.put(key, b"\x00\x01\x02\x03garbage", db=db)
    env.close()
    broker = open_broker()
    stats = broker.admin.coordinator_stats(1)
    assert stats["state"] == "ERROR" and "cannot be read" in stats["error"]
    client = broker.client()
    assert {client.new_transaction().id.coordinator_id for _ in range(6)} == {0, 2, 3}
    with pytest.raises(CoordinatorUnavailable):
        client.new_transaction(coordinator_id=1)
    with pytest.raises(CoordinatorUnavailable):
        client.transaction(t.id)
    assert broker.admin.coordinator_stats(2)["recovered_open"] == 1


def test_scale_coordinators_grows_and_persists(open_broker):
    broker = open_broker(num_coordinators=2)
    admin = broker.admin
    admin.scale_coordinators(5)
    assert [c["coordinator_id"] for c in admin.coordinators()] == [0, 1, 2, 3, 4]
    assert broker.client().new_transaction(coordinator_id=4).id.coordinator_id == 4
    with pytest.raises(ValueError):
        admin.scale_coordinators(3)
    broker.close()
    assert len(open_broker(num_coordinators=2).admin.coordinators()) == 5


def test_the_first_blocks_of_sequences_are_reserved_in_one_write_at_open(open_broker):
    """Every coordinator's first block of sequences is reserved when the broker opens, all in
    one write: the first new_transaction() of each writes nothing of its own (it would wait
    for a synced write each), and a restart still never hands out a sequence twice."""
    broker = open_broker(sync=True, num_coordinators=6)
    commits = broker.storage.commits
    client = broker.client()
    groups = commits.groups
    first = [client.new_transaction(coordinator_id=c) for c in range(6)]
    assert commits.groups == groups  # the begins ride with a first write; no reservation
    with broker.storage.read() as txn:
        marks = [
            int.from_bytes(bytes(txn.get(log.hwm_key(c), db=broker.storage.meta)), "big")
            for c in range(6)
        ]
    assert all(t.id.sequence < marks[c] for c, t in enumerate(first))
    # Past the first block, a coordinator reserves the next one itself, durably.
    c0 = broker.txn.coordinators[0]
    while c0.allocator.next_sequence < marks[0]:
        c0.allocator.next()
    groups = commits.groups
    beyond = client.new_transaction(coordinator_id=0)
    assert beyond.id.sequence >= marks[0]
    assert commits.groups == groups + 1
    broker.admin.scale_coordinators(8)  # coordinators added live: theirs in one write too
    groups = commits.groups
    client.new_transaction(coordinator_id=6)
    client.new_transaction(coordinator_id=7)
    assert commits.groups == groups
    broker.close()
    again = open_broker(sync=True).client()
    for c in range(6):
        t = again.new_transaction(coordinator_id=c)
        assert t.id.sequence >= marks[c]
    assert again.new_transaction(coordinator_id=0).id.sequence > beyond.id.sequence


def test_concurrent_begin_and_end_from_threads(open_broker):
    broker = open_broker(num_coordinators=3)
    client = broker.client()
    ids, errors = [], []

    def work(k):
        try:
            for i in range(200):
                t = client.new_transaction()
                broker.txn.add_partitions(t.id, [P1 if i % 2 else P2])
                (t.commit if (i + k) % 3 else t.abort)()
                ids.append(t.id)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(set(ids)) == 1600
    stats = [broker.admin.coordinator_stats(i) for i in range(3)]
    assert sum(s["committed"] + s["aborted"] for s in stats) == 1600
    assert sum(s["active"] for s in stats) == 0
    outcomes = {**broker.txn.participants.resolve("partition", P1).outcomes()}
    outcomes.update(broker.txn.participants.resolve("partition", P2).outcomes())
    assert len(outcomes) == 1600


def test_slow_transactions_and_metadata(open_broker):
    broker = open_broker()
    client = broker.client()
    old = client.new_transaction(group="g")
    broker.txn.add_partitions(old.id, [P1])
    time.sleep(0.05)
    client.new_transaction()
    slow = broker.admin.slow_transactions(40)
    assert [s["txn_id"] for s in slow] == [str(old.id)]
    meta = slow[0]
    assert meta["produced_partitions"] == [P1] and meta["group"] == "g"
    assert meta["state"] == "OPEN"
    old.commit()
    assert broker.admin.transaction_metadata(old.id)["state"] == "COMMITTED"
    with pytest.raises(ValueError):
        broker.admin.slow_transactions(-1)


def test_log_appends_count_the_records_of_each_transaction(tmp_path):
    """coordinator_stats' log_appends (Pulsar's append_log_count): a begin, each new set of
    participants, an end with participants; a repeated registration adds nothing."""
    with pulsartxn.Broker(tmp_path / "d", num_coordinators=1, sync=False) as broker:
        client = broker.client()
        producer = client.create_producer("t")

        def appends() -> int:
            return broker.admin.coordinator_stats(0)["log_appends"]

        client.new_transaction().commit()  # its begin only: an empty end writes no record
        assert appends() == 1
        txn = client.new_transaction()
        producer.send(b"a", txn=txn)
        producer.send(b"b", txn=txn)  # the same partition: no new record
        txn.commit()
        assert appends() == 1 + 3
