"""The edges of the protocol (DESIGN.md): de-duplication of aborted sends, unsubscribing while
transactions hold acks, and message ids that name a batch index without the batch size."""

from __future__ import annotations

import functools
import signal
import textwrap
import threading
import time

import pytest

from pulsartxn import Broker, ConsumerType, InitialPosition, MessageId, TxnState
from pulsartxn.errors import (
    AlreadyClosed,
    InvalidMessageId,
    InvalidTxnStatus,
    TransactionConflict,
    TransactionTimeout,
)
from pulsartxn.storage import WriteOp
from tests import helpers

drain = functools.partial(helpers.drain, timeout_ms=100)
scanned = functools.partial(helpers.scanned, sort=True)


def values(msgs) -> list[bytes]:
    return sorted(m.data() for m in msgs)


def backlog(broker, sub: str = "s") -> int:
    return broker.admin.topic_stats("t")["subscriptions"][sub]["backlog"]


# -- an end's arguments ----------------------------------------------------------------------


def test_an_end_with_a_bad_timeout_is_refused_and_changes_nothing(env):
    """commit/abort(timeout_ms=...) takes None or a number of 0..2^40 ms: a str, a bool,
    NaN, a negative or an infinite one is a ValueError before anything is done (a commit
    given "5" used to commit); the transaction stays OPEN and ends as asked after."""
    broker = env()
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    txn = client.new_transaction()
    producer.send(b"v", txn=txn)
    for bad in ("5", True, float("nan"), -1, float("inf"), 1e30):
        for end in (txn.commit, txn.abort):
            with pytest.raises(ValueError, match="timeout_ms must be a number"):
                end(timeout_ms=bad)
            assert txn.state is TxnState.OPEN
    assert scanned(client, "t") == []
    txn.commit(timeout_ms=0)  # no wait it needs: the decision is made all the same
    assert txn.state is TxnState.COMMITTED and scanned(client, "t") == [b"v"]


def test_a_decision_over_a_str_or_one_transaction_alone_is_refused(env):
    """commit_group(label, "0:5") walked the string and said "not a TxnID: '0'"; a
    transaction given alone to commit_all was "not iterable". Both name the argument now,
    and nothing is decided."""
    broker = env()
    client = broker.client()
    txn = client.new_transaction(group="g")
    for call in (
        lambda: client.commit_group("g", str(txn.id)),
        lambda: client.commit_group("g", txn),
        lambda: client.commit_all(txn),
        lambda: client.commit_all(txn.id),
        lambda: client.commit_all(5),
    ):
        with pytest.raises(TypeError, match="must be an iterable of transactions or TxnIDs"):
            call()
    assert txn.state is TxnState.OPEN
    client.commit_group("g", [txn])
    assert txn.state is TxnState.COMMITTED


# -- de-duplication counts only what is or will be visible --------------------------------------


def test_a_resend_of_an_aborted_send_is_stored_again(env):
    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p")
    t1 = client.new_transaction()
    aborted = p.send(b"v1", sequence_id=0, txn=t1)
    t1.abort()
    t2 = client.new_transaction()
    retried = p.send(b"v1-retry", sequence_id=0, txn=t2)
    assert retried.entry_id() > aborted.entry_id()
    t2.commit()
    assert scanned(client, "t") == [b"v1-retry"]
    # Committed now: a resend, in a transaction or not, is a duplicate and stores nothing.
    t3 = client.new_transaction()
    assert p.send(b"v1-third", sequence_id=0, txn=t3) == retried
    t3.commit()
    assert p.send(b"v1-plain", sequence_id=0) == retried
    assert scanned(client, "t") == [b"v1-retry"]


def test_a_plain_resend_of_an_aborted_send_is_stored_again(env):
    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p")
    t1 = client.new_transaction()
    aborted = p.send(b"v1", sequence_id=0, txn=t1)
    t1.abort()
    retried = p.send(b"v1-retry", sequence_id=0)
    assert retried.entry_id() > aborted.entry_id()
    assert p.send(b"v1-again", sequence_id=0) == retried
    assert scanned(client, "t") == [b"v1-retry"]
    # A send of a transaction still open counts: its resend is a duplicate until it aborts.
    t2 = client.new_transaction()
    held = p.send(b"o", sequence_id=1, txn=t2)
    assert p.send(b"o-again", sequence_id=1) == held
    t2.abort()
    assert p.send(b"o-retry", sequence_id=1).entry_id() > held.entry_id()
    assert scanned(client, "t") == [b"o-retry", b"v1-retry"]


@pytest.mark.parametrize("end", ["abort", "timeout then flush", "timeout then abort"])
def test_sequence_ids_of_sends_waiting_at_an_end_without_commit_do_not_count(env, end):
    """Sends of a transaction still waiting in the producer (a long batching delay) when it
    ends without a commit. An abort takes them, as Pulsar's abort waits for the sends before
    it: answered at once, written aborted, never read. A timeout leaves them unwritten: they
    fail at the next flush or at the late abort (the remote client holds them until the
    broker refuses them). Either way their sequence ids do not count, before a restart,
    after it and in a new producer, though a later sequence id was stored plainly since."""
    broker = env()
    client = broker.client()
    options = {"batching_max_messages": 10, "batching_max_publish_delay_ms": 60_000}
    p = client.create_producer("t", producer_name="p", **options)
    if end == "abort":
        t1 = client.new_transaction()
        waiting = [p.send_async(b"w%d" % i, sequence_id=i, txn=t1) for i in range(5)]
        t1.abort()
        ids = [f.result(timeout=5) for f in waiting]  # not after the 60 s delay
        assert len(set(ids)) == 5 and all(m.entry_id() >= 0 for m in ids)
    else:
        t1 = client.new_transaction(timeout_ms=50)
        waiting = [p.send_async(b"w%d" % i, sequence_id=i, txn=t1) for i in range(5)]
        helpers.wait_for(lambda: t1.state.value == "TIMEOUT", what="the timeout")
        if end == "timeout then flush":
            p.flush()
        else:
            with pytest.raises(TransactionTimeout):
                t1.abort()
        assert all(isinstance(f.exception(timeout=5), TransactionTimeout) for f in waiting)
    ten = p.send(b"ten", sequence_id=10)
    w1 = p.send(b"w1-retry", sequence_id=1)
    assert w1.entry_id() > ten.entry_id()
    assert p.send(b"w1-again", sequence_id=1) == w1
    assert scanned(client, "t") == [b"ten", b"w1-retry"]
    broker.close()

    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p", **options)
    assert p.send(b"w1-again", sequence_id=1) == w1
    assert p.send(b"ten-again", sequence_id=10) == ten
    w3 = p.send(b"w3-retry", sequence_id=3)
    t2 = client.new_transaction()
    w4 = p.send(b"w4-retry", sequence_id=4, txn=t2)
    t2.commit()
    assert w4.entry_id() > w3.entry_id() > w1.entry_id()
    other = client.create_producer("t", producer_name="p2")
    assert other.send(b"unrelated", sequence_id=0).entry_id() > w4.entry_id()
    p.close()
    p = client.create_producer("t", producer_name="p", **options)
    assert p.send(b"w3-again", sequence_id=3) == w3
    assert p.send(b"w4-again", sequence_id=4) == w4
    assert p.send(b"w2-retry", sequence_id=2).entry_id() > w4.entry_id()
    assert scanned(client, "t") == [
        b"ten",
        b"unrelated",
        b"w1-retry",
        b"w2-retry",
        b"w3-retry",
        b"w4-retry",
    ]


@pytest.mark.parametrize("then", ["flush", "abort", "commit"])
def test_sends_waiting_for_a_transaction_that_timed_out_fail(env, then):
    """They fail at the next flush, or at a late end of the transaction (which raises)."""
    broker = env()
    client = broker.client()
    options = {"batching_max_messages": 3, "batching_max_publish_delay_ms": 60_000}
    p = client.create_producer("t", producer_name="p", **options)
    txn = client.new_transaction(timeout_ms=50)
    waiting = p.send_async(b"late", sequence_id=0, txn=txn)
    helpers.wait_for(lambda: txn.state.value == "TIMEOUT", what="the timeout")
    if then == "flush":
        p.flush()
    else:
        with pytest.raises(TransactionTimeout):
            getattr(txn, then)()
    assert isinstance(waiting.exception(timeout=5), TransactionTimeout)
    assert p.send(b"again", sequence_id=0).entry_id() >= 0
    assert scanned(client, "t") == [b"again"]


def test_sends_racing_an_abort_from_another_thread_are_each_written_aborted_or_refused(env):
    """A thread sends into a batching producer while another aborts the transaction: each
    send is answered (written aborted) or fails, none is left waiting once the abort has
    returned and the sender has seen it, none is read, and a resend of any sequence id the
    sender used is stored anew, after a restart too."""
    broker = env()
    client = broker.client()
    options = {"batching_max_messages": 7, "batching_max_publish_delay_ms": 60_000}
    p = client.create_producer("t", producer_name="p", **options)
    txn = client.new_transaction()
    futures: list = []

    def sender() -> None:
        for seq in range(5_000):
            try:
                futures.append(p.send_async(b"x%d" % seq, sequence_id=seq, txn=txn))
            except InvalidTxnStatus:
                return

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    helpers.wait_for(lambda: len(futures) >= 50, what="the first sends")
    txn.abort()
    thread.join(30)
    assert not thread.is_alive()
    used = len(futures)
    outcomes = [f.exception(timeout=10) for f in futures]
    assert all(e is None or isinstance(e, InvalidTxnStatus) for e in outcomes), set(outcomes)
    assert outcomes.count(None) >= 50  # those before the abort: written aborted
    assert scanned(client, "t") == []
    later = p.send(b"later", sequence_id=used + 10)
    broker.close()

    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p", **options)
    again = [p.send(b"r%d" % seq, sequence_id=seq) for seq in range(0, used, max(1, used // 25))]
    assert all(m.entry_id() > later.entry_id() for m in again)
    assert len(scanned(client, "t")) == len(again) + 1


def test_a_transaction_batch_written_before_its_callback_is_added_does_not_hang(tmp_path):
    """In process, a transaction batch's write is submitted lazily with its producer's
    partition lock held, then its callback is added. A group committed by another thread in
    between (the 64-thread load test hung so: a commit racing its transaction's timeout)
    had answered the write already, so the callback ran at once, in the sending thread, and
    took the lock that thread held: a hang for good. Here every lazy write is made to land
    before its submit returns."""
    broker = Broker(tmp_path / "d", sync=False)
    storage = broker.storage
    submit = storage.submit

    def landed_at_once(op, lazy=False):
        fut = submit(op, lazy=lazy)
        if lazy:
            storage.commits.flush_lazy()
            fut.exception(timeout=10)  # answered: as by another thread's group
        return fut

    storage.submit = landed_at_once
    client = broker.client()
    p = client.create_producer("t", batching_enabled=False)

    def transactions():
        for i in range(3):
            txn = client.new_transaction()
            p.send(b"v%d" % i, txn=txn)
            txn.commit()

    sender = threading.Thread(target=transactions, daemon=True)
    sender.start()
    sender.join(20)
    assert not sender.is_alive(), "the send hung"  # (the broker left open: its close would too)
    del storage.submit
    assert scanned(client, "t") == [b"v0", b"v1", b"v2"]
    broker.close()


def test_a_resend_waiting_in_its_transaction_batch_is_a_duplicate(env):
    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p", batching_max_publish_delay_ms=60_000)
    txn = client.new_transaction()
    first = p.send_async(b"x", sequence_id=3, txn=txn)
    again = p.send_async(b"x-again", sequence_id=3, txn=txn)
    p.flush()
    txn.commit()
    assert again.result() == first.result()
    assert scanned(client, "t") == [b"x"]


def test_a_resend_waiting_in_another_transactions_batch_is_its_duplicate(env):
    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p", batching_max_publish_delay_ms=60_000)
    t1, t2 = client.new_transaction(), client.new_transaction()
    first = p.send_async(b"x", sequence_id=3, txn=t1)
    # Answered once t1's batch is written, not when t1 ends (which this thread does next).
    again = []
    sender = threading.Thread(
        target=lambda: again.append(p.send(b"x-again", sequence_id=3, txn=t2)), daemon=True
    )
    sender.start()
    sender.join(10)
    assert again == [first.result(timeout=5)]
    t1.commit()
    t2.commit()
    assert scanned(client, "t") == [b"x"]


def test_a_transactional_resend_of_a_plain_send_still_waiting_is_its_duplicate(env):
    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p", batching_max_publish_delay_ms=60_000)
    first = p.send_async(b"x", sequence_id=3)
    txn = client.new_transaction()
    again = []
    sender = threading.Thread(
        target=lambda: again.append(p.send(b"x-again", sequence_id=3, txn=txn)), daemon=True
    )
    sender.start()
    sender.join(10)
    assert again == [first.result(timeout=5)]
    txn.commit()
    assert scanned(client, "t") == [b"x"]


def test_each_aborted_sequence_of_an_entry_is_stored_again_alone_and_after_a_restart(env):
    """An aborted entry held sequences 0..9; resending 0 alone must not hide 1..9 (5 is not
    a gap), and neither the broker's highest sequence nor the producer's goes down (10, sent
    plain after them, stays a duplicate), before and after a restart."""
    broker = env()
    client = broker.client()
    options = {"batching_max_messages": 10, "batching_max_publish_delay_ms": 60_000}
    p = client.create_producer("t", producer_name="p", **options)
    t1 = client.new_transaction()
    sent = [p.send_async(b"a%d" % i, sequence_id=i, txn=t1) for i in range(10)]
    p.flush()
    assert len({f.result().entry_id() for f in sent}) == 1
    t1.abort()
    ten = p.send(b"ten", sequence_id=10)
    r0 = p.send(b"r0", sequence_id=0)
    r5 = p.send(b"r5", sequence_id=5)
    assert r5.entry_id() > r0.entry_id() > ten.entry_id()
    assert p.send(b"ten-again", sequence_id=10) == ten
    assert p.send(b"r5-again", sequence_id=5) == r5
    assert scanned(client, "t") == [b"r0", b"r5", b"ten"]
    broker.close()

    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p", **options)
    assert p.send(b"ten-again", sequence_id=10) == ten
    assert p.send(b"r0-again", sequence_id=0) == r0
    assert p.send(b"r5-again", sequence_id=5) == r5
    t2 = client.new_transaction()
    r7 = p.send(b"r7", sequence_id=7, txn=t2)
    t2.commit()
    assert r7.entry_id() > r5.entry_id()
    assert p.send(b"r7-again", sequence_id=7) == r7
    p.send(b"eleven")  # after the highest sequence, 10
    assert p.send(b"eleven-again", sequence_id=11).entry_id() > r7.entry_id()
    assert p.send(b"eleven-again", sequence_id=11) != r7
    assert scanned(client, "t") == [b"eleven", b"r0", b"r5", b"r7", b"ten"]


def test_each_dropped_sequence_is_stored_again_alone_and_after_a_restart(env):
    """Dropped sends held sequences 3..7: storing 5 alone must not hide 3, 4, 6 or 7, and a
    sequence the producer never took (8, 9) stays a gap, before and after a restart."""
    broker = env()
    client = broker.client()
    options = {"batching_max_messages": 10, "batching_max_publish_delay_ms": 60_000}
    p = client.create_producer("t", producer_name="p", **options)
    for i in range(3):
        p.send(b"s%d" % i, sequence_id=i)
    txn = client.new_transaction(timeout_ms=50)
    waiting = [p.send_async(b"w%d" % i, sequence_id=i, txn=txn) for i in range(3, 8)]
    helpers.wait_for(lambda: txn.state.value == "TIMEOUT", what="the timeout")
    p.flush()
    assert all(isinstance(f.exception(timeout=5), TransactionTimeout) for f in waiting)
    r5 = p.send(b"r5", sequence_id=5)
    ten = p.send(b"ten", sequence_id=10)
    assert p.send(b"r5-again", sequence_id=5) == r5
    broker.close()

    broker = env()
    client = broker.client()
    p = client.create_producer("t", producer_name="p", **options)
    assert p.send(b"r5-again", sequence_id=5) == r5
    assert p.send(b"ten-again", sequence_id=10) == ten
    assert p.send(b"gap", sequence_id=8).entry_id() < 0
    stored = {i: p.send(b"r%d" % i, sequence_id=i) for i in (7, 3, 6, 4)}
    assert all(m.entry_id() > ten.entry_id() for m in stored.values())
    assert all(p.send(b"again", sequence_id=i) == m for i, m in stored.items())
    assert p.send(b"s1-again", sequence_id=1).entry_id() < ten.entry_id()
    assert p.send(b"eleven").entry_id() > ten.entry_id()  # after the highest, 10
    assert scanned(client, "t") == [
        b"eleven",
        b"r3",
        b"r4",
        b"r5",
        b"r6",
        b"r7",
        b"s0",
        b"s1",
        b"s2",
        b"ten",
    ]


DROPPED_THEN_KILLED = textwrap.dedent(
    """
    import sys
    import pulsartxn

    broker = pulsartxn.Broker(sys.argv[1], sync=True, txn_timeout_tick_ms=10)
    client = broker.client()
    p = client.create_producer(
        "t", producer_name="p", batching_max_messages=10, batching_max_publish_delay_ms=60_000
    )
    txn = client.new_transaction(timeout_ms=50)
    waiting = [p.send_async(b"w%d" % i, sequence_id=i, txn=txn) for i in range(5)]
    print(p.send(b"ten", sequence_id=10).entry_id(), flush=True)
    while txn.state.value != "TIMEOUT":
        pass
    p.flush()
    print(sorted({type(f.exception()).__name__ for f in waiting}), flush=True)
    sys.stdin.readline()
    """
)


def test_dropped_sequences_are_on_record_when_their_sends_fail(tmp_path):
    """A SIGKILL right after the sends of a timed-out transaction failed: their sequence ids
    were on record by then, so after the restart a resend is stored anew, though sequence 10
    was stored before them."""
    data = str(tmp_path / "d")
    proc = helpers.python_child(tmp_path, DROPPED_THEN_KILLED, data)
    try:
        ten = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "['TransactionTimeout']"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with Broker(data, sync=True) as broker:
        client = broker.client()
        p = client.create_producer("t", producer_name="p")
        assert p.send(b"ten-again", sequence_id=10).entry_id() == ten
        w3 = p.send(b"w3-retry", sequence_id=3)
        assert w3.entry_id() > ten
        assert p.send(b"w3-again", sequence_id=3) == w3
        assert scanned(client, "t") == [b"ten", b"w3-retry"]


# -- unsubscribing while transactions hold acks ------------------------------------------------


def _three_on_s(client):
    producer = client.create_producer("t", batching_enabled=False)
    for i in range(3):
        producer.send(b"m%d" % i)
    consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
    msgs = drain(consumer)
    assert values(msgs) == [b"m0", b"m1", b"m2"]
    return consumer, msgs


def test_unsubscribe_is_refused_while_a_transaction_holds_acks(env):
    broker = env()
    client = broker.client()
    consumer, (m0, m1, m2) = _three_on_s(client)
    holder = client.new_transaction()
    consumer.acknowledge(m0, txn=holder)
    with pytest.raises(TransactionConflict) as refused:
        consumer.unsubscribe()
    assert "'s'" in str(refused.value) and str(holder.id) in str(refused.value)
    # Nothing changed: the consumer is attached and usable, the hold is in place.
    consumer.acknowledge(m1)
    consumer.redeliver_unacknowledged_messages()
    assert values(drain(consumer)) == [b"m2"]
    holder.commit()
    assert backlog(broker) == 1
    consumer.unsubscribe()
    fresh = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
    assert values(drain(fresh)) == [b"m0", b"m1", b"m2"]
    assert broker.admin.pending_ack_stats("t", "s")["ongoing_txn_size"] == 0


def test_unsubscribe_after_the_holder_aborts_leaves_nothing_held(env):
    broker = env()
    client = broker.client()
    consumer, msgs = _three_on_s(client)
    holder = client.new_transaction()
    for m in msgs[:2]:
        consumer.acknowledge(m, txn=holder)
    holder.abort()
    consumer.unsubscribe()
    fresh = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
    got = drain(fresh)
    assert values(got) == [b"m0", b"m1", b"m2"]
    later = client.new_transaction()
    for m in got:
        fresh.acknowledge(m, txn=later)  # none is held by the aborted transaction
    later.commit()
    assert backlog(broker) == 0


def test_a_transactional_ack_after_the_unsubscribe_is_refused(env):
    """An ack that reaches the subscription once the unsubscribe has checked it is refused:
    it is neither dropped silently nor inherited by a new subscription of the name."""
    broker = env()
    client = broker.client()
    consumer, (m0, _, _) = _three_on_s(client)
    _, (partition,) = broker.topics.resolve("t", create=False)
    old = partition.subscriptions["s"]
    consumer.unsubscribe()
    txn = client.new_transaction()
    with pytest.raises(AlreadyClosed, match="unsubscribed"):
        old.pending_ack.ack(txn.id, m0.message_id().entry_id(), -1, 0, False)
    with pytest.raises(AlreadyClosed, match="unsubscribed"):
        old.acknowledge(m0.message_id())
    fresh = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
    assert values(drain(fresh)) == [b"m0", b"m1", b"m2"]
    txn.commit()


def test_unsubscribe_is_refused_while_a_commit_of_its_acks_is_being_written(tmp_path):
    """A transaction whose end write is being applied still holds its acks there: an
    unsubscribe in the middle of that write is refused and changes nothing; the commit then
    lands with its acks, and the unsubscribe succeeds after it."""
    with Broker(tmp_path / "data", sync=True, num_coordinators=1) as broker:
        client = broker.client()
        consumer, (m0, m1, _) = _three_on_s(client)
        _, (partition,) = broker.topics.resolve("t", create=False)
        sub = partition.subscriptions["s"]
        txn = client.new_transaction()
        consumer.acknowledge(m0, txn=txn)
        consumer.acknowledge_cumulative(m1, txn=txn)
        sub.pending_ack.store(txn.id)  # logged now: the commit's write is the next one
        with sub.lock:
            before = sub.cursor.serialize()
        seen: dict = {}

        def attempt(t):  # applied right after the commit's write, in its LMDB transaction
            with sub.lock:
                seen["committing"] = set(sub.committing)
                seen["cursor"] = sub.cursor.serialize()
            try:
                consumer.unsubscribe()
            except TransactionConflict as exc:
                seen["refused"] = str(exc)

        commits = broker.storage.commits
        committed: list = []
        committer = threading.Thread(target=lambda: committed.append(txn.commit()))
        with commits.commit_lock:  # nothing is committed until both writes are queued
            committer.start()
            deadline = time.monotonic() + 10
            while commits._queue.qsize() < 1 and time.monotonic() < deadline:
                time.sleep(0.002)
            assert commits._queue.qsize() == 1, "the commit's write was not queued"
            broker.storage.submit(WriteOp(attempt), quiet=True)
        committer.join(10)
        assert committed == [None]
        assert seen["committing"] == {txn.id}
        assert seen["cursor"] == before
        assert "cannot unsubscribe 's'" in seen["refused"] and str(txn.id) in seen["refused"]
        # The commit landed with its acks; the consumer and its subscription are as they were.
        assert not sub.unsubscribed and partition.subscriptions["s"] is sub
        assert backlog(broker) == 1
        consumer.redeliver_unacknowledged_messages()
        assert values(drain(consumer)) == [b"m2"]
        consumer.unsubscribe()
        assert "s" not in partition.subscriptions
        fresh = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
        assert values(drain(fresh)) == [b"m0", b"m1", b"m2"]


# -- a batch index without the batch size ------------------------------------------------------


def _one_entry_of_four(client, sub_type=ConsumerType.Exclusive):
    producer = client.create_producer(
        "t", batching_max_messages=4, batching_max_publish_delay_ms=60_000
    )
    for i in range(4):
        producer.send_async(b"m%d" % i)
    producer.flush()
    consumer = client.subscribe(
        "t", "s", subscription_type=sub_type, initial_position=InitialPosition.Earliest
    )
    msgs = drain(consumer)
    ids = [m.message_id() for m in msgs]
    assert len({i.entry_id() for i in ids}) == 1
    assert [i.batch_index() for i in ids] == [0, 1, 2, 3]
    return consumer, ids[0]


def _bare(mid: MessageId, batch_index: int, batch_size: int = 0) -> MessageId:
    return MessageId(mid.ledger_id(), mid.entry_id(), mid.partition(), batch_index, batch_size)


def _redelivered(consumer) -> list[bytes]:
    consumer.redeliver_unacknowledged_messages()
    return values(drain(consumer))


@pytest.mark.parametrize("in_txn", [False, True], ids=["plain", "txn"])
def test_a_batch_index_without_the_batch_size_acks_that_message_only(env, in_txn):
    broker = env()
    client = broker.client()
    consumer, mid = _one_entry_of_four(client, ConsumerType.Shared)
    txn = client.new_transaction() if in_txn else None
    consumer.acknowledge(_bare(mid, 0), txn=txn)
    if txn is not None:
        txn.commit()
    assert backlog(broker) == 3
    assert _redelivered(consumer) == [b"m1", b"m2", b"m3"]
    consumer.close()
    again = client.subscribe(
        "t", "s", subscription_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest
    )
    assert values(drain(again)) == [b"m1", b"m2", b"m3"]


@pytest.mark.parametrize("in_txn", [False, True], ids=["plain", "txn"])
def test_a_cumulative_ack_without_the_batch_size_stops_at_its_batch_index(env, in_txn):
    broker = env()
    client = broker.client()
    consumer, mid = _one_entry_of_four(client)
    txn = client.new_transaction() if in_txn else None
    consumer.acknowledge_cumulative(_bare(mid, 1), txn=txn)
    if txn is not None:
        txn.commit()
    assert backlog(broker) == 2
    assert _redelivered(consumer) == [b"m2", b"m3"]
    consumer.close()
    again = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
    assert values(drain(again)) == [b"m2", b"m3"]


def test_a_negative_ack_of_a_lone_message_by_batch_index_zero(env):
    broker = env()
    client = broker.client()
    client.create_producer("t", batching_enabled=False).send(b"lone")
    consumer = client.subscribe(
        "t", "s", negative_ack_redelivery_delay_ms=0, initial_position=InitialPosition.Earliest
    )
    (m,) = drain(consumer)
    mid = m.message_id()
    assert mid.batch_index() == -1
    consumer.negative_acknowledge(_bare(mid, 0))
    (again,) = drain(consumer)
    assert again.data() == b"lone" and again.redelivery_count() == 1


def test_a_batch_index_outside_the_entry_or_a_contradicting_size_changes_nothing(env):
    broker = env()
    client = broker.client()
    consumer, mid = _one_entry_of_four(client)
    txn = client.new_transaction()
    for bad in (_bare(mid, 4), _bare(mid, 0, 3), _bare(mid, -2)):
        with pytest.raises(InvalidMessageId):
            consumer.acknowledge(bad)
        with pytest.raises(InvalidMessageId):
            consumer.acknowledge_cumulative(bad)
        with pytest.raises(InvalidMessageId):
            consumer.acknowledge(bad, txn=txn)
        with pytest.raises(InvalidMessageId):
            consumer.negative_acknowledge(bad)
    assert broker.admin.pending_ack_stats("t", "s")["acks"] == 0
    txn.commit()
    assert backlog(broker) == 4
    assert _redelivered(consumer) == [b"m0", b"m1", b"m2", b"m3"]
