"""Bookkeeping that must not grow with a long run: BySequence against a plain model, the
participants' low-watermark work with one long transaction holding a coordinator's watermark
back while thousands of others come and go, the coordinators' outcome ring, and a producer's
batches of transactions that ended without them."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pulsartxn
from pulsartxn import TxnID
from pulsartxn.errors import InvalidTxnStatus
from pulsartxn.txn.watermark import BySequence
from tests.helpers import scanned

ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "drop", "below", "compact"]),
        st.integers(0, 2),
        st.integers(0, 40),
    ),
    max_size=200,
)


@given(ops)
def test_by_sequence_hands_out_exactly_the_held_ones_below(steps):
    index, held = BySequence(), set()
    for op, cid, seq in steps:
        txn = TxnID(cid, seq)
        if op == "add" and txn not in held:
            held.add(txn)
            index.add(txn)
        elif op == "drop":
            held.discard(txn)
        elif op == "compact":
            index.compact(held)
        elif op == "below":
            found = index.below(cid, seq)
            expected = {t for t in held if t.coordinator_id == cid and t.sequence < seq}
            assert set(found) & held == expected
            assert len(found) == len(set(found))
            for t in found:
                if t in held:
                    index.add(t)  # the caller puts back what it still holds
    for cid in range(3):
        assert set(index.below(cid, 1 << 30)) & held == {t for t in held if t.coordinator_id == cid}


def test_one_long_transaction_and_thousands_after_it(tmp_path):
    """Coordinator 0's low watermark stays at the long transaction while 3000 others produce,
    acknowledge and commit; the participants' bookkeeping stays in proportion to what is
    live, and ending the long one moves everything on."""
    with pulsartxn.Broker(tmp_path / "d", sync=False, num_coordinators=1) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        for i in range(3001):
            producer.send(b"in%d" % i)
        consumer = client.subscribe(
            "t",
            "s",
            subscription_type=pulsartxn.ConsumerType.Shared,
            receiver_queue_size=3001,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        msgs = consumer.batch_receive(3001, 1000)
        out = client.create_producer("out", batching_enabled=False)
        long = client.new_transaction(timeout_ms=600_000)
        out.send(b"long", txn=long)
        consumer.acknowledge(msgs[0], txn=long)
        for m in msgs[1:]:
            txn = client.new_transaction()
            out.send(m.data(), txn=txn)
            consumer.acknowledge(m, txn=txn)
            txn.commit()
        coordinator = broker.txn.coordinators[0]
        assert coordinator.low_watermark() == long.id.sequence
        assert len(coordinator._order) <= 2 * len(coordinator.txns) + 64
        part = broker.topics.partition(broker.topic_partitions("out")[0])
        assert part.buffer._ongoing_seq._size <= 2 * len(part.buffer.ongoing) + 64
        sub = broker.topics.partition(broker.topic_partitions("t")[0]).subscriptions["s"]
        assert sub.pending_ack._by_sequence._size <= 2 * len(sub.pending_ack.counts) + 64
        # read committed: nothing after the long one's first entry yet
        assert scanned(client, "out") == []
        long.commit()
        assert sorted(scanned(client, "out")) == sorted([b"long"] + [m.data() for m in msgs[1:]])
        assert broker.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 0
        with client.new_transaction() as txn:  # its end carries the new low watermark
            out.send(b"next", txn=txn)
        assert len(part.buffer.ended) <= 2  # the ended ones below it are forgotten


def test_ended_transactions_are_remembered_within_a_bound(tmp_path):
    """Behind a long transaction, a partition remembers the transactions that ended there (a
    late append of one is refused) up to max_ended, the oldest forgotten first."""
    with pulsartxn.Broker(tmp_path / "d", sync=False, num_coordinators=1) as broker:
        client = broker.client()
        out = client.create_producer("out", batching_enabled=False)
        long = client.new_transaction(timeout_ms=600_000)
        out.send(b"long", txn=long)
        part = broker.topics.partition(broker.topic_partitions("out")[0])
        part.buffer.max_ended = 50
        ended = []
        for i in range(200):
            with client.new_transaction() as txn:
                out.send(b"%d" % i, txn=txn)
            ended.append(txn.id)
        assert len(part.buffer.ended) <= 50
        assert set(part.buffer.ended) <= set(ended[-50:])
        with pytest.raises(InvalidTxnStatus):
            part.buffer.begin_append(ended[-1])  # a late append of a recent one
        long.commit()
        assert len(scanned(client, "out")) == 201


@pytest.mark.parametrize("page", [8, 3])
@given(
    st.lists(
        st.tuples(st.sampled_from(["begin", "finish", "get"]), st.integers(0, 40)),
        max_size=150,
    )
)
def test_outcomes_ring_against_a_dict(page, steps):
    """The coordinator's outcomes (8 sequences here, in pages of `page`) answer like a dict of
    the outcomes of the last 8 sequences of the window, over page drops and jumps, and hold
    no more pages than the window needs."""
    from pulsartxn.txn.meta import ABORTED, COMMITTED, Outcomes
    from pulsartxn.txn.state import EndReason

    ring, model, high, live = Outcomes(8, page), {}, -1, set()
    next_seq = 0
    for op, x in steps:
        if op == "begin":
            next_seq += x % 12  # sometimes a jump past the whole ring
            ring.begun(next_seq)
            live.add(next_seq)
            model.pop(next_seq, None)
            high = max(high, next_seq)
            next_seq += 1
        elif op == "finish" and live:
            seq = sorted(live)[x % len(live)]
            live.discard(seq)
            state = ABORTED if x % 2 else COMMITTED
            reason = (EndReason.CLIENT, EndReason.TIMEOUT, EndReason.GROUP)[x % 3]
            ring.finished(seq, state, reason, 1000 + x)
            if seq > high - 8:
                timeout = 1000 + x if state is ABORTED and reason == EndReason.TIMEOUT else 0
                model[seq] = (state, int(reason), timeout)
        else:
            seq = x
            expected = model.get(seq) if high - 8 < seq <= high else None
            assert ring.get(seq) == expected
        assert ring.nbytes <= (8 // page + 2) * page
    for seq in range(next_seq + 2):
        expected = model.get(seq) if high - 8 < seq <= high else None
        assert ring.get(seq) == expected


def test_an_end_with_a_zero_low_watermark_on_a_new_partition(tmp_path):
    """A participant may be told low watermark 0 by a coordinator it never heard from."""
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        client = broker.client()
        out = client.create_producer("out", batching_enabled=False)
        txn = client.new_transaction()
        out.send(b"x", txn=txn)
        part = broker.topics.partition(broker.topic_partitions("out")[0])
        part.buffer.end_txn(txn.id, True, 0)
        assert scanned(client, "out") == [b"x"]


def test_a_producer_drops_the_batches_of_transactions_that_ended_without_them(
    tmp_path, monkeypatch
):
    """Transactions left to their timeout with messages still waiting in the producer's
    batches: once such batches pile up, the producer fails those messages and lets them go
    instead of holding them until its next flush; open transactions keep theirs."""
    from pulsartxn.messaging import txn_batches

    monkeypatch.setattr(txn_batches, "_SWEEP_TXN_BATCHES_AT", 16)
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        client = broker.client()
        out = client.create_producer(
            "out", batching_max_messages=100, batching_max_publish_delay_ms=60_000
        )
        abandoned = []
        for i in range(20):
            txn = client.new_transaction(timeout_ms=50)
            abandoned.append(out.send_async(b"gone%d" % i, txn=txn))
        time.sleep(0.4)  # past their timeouts (the timer ticks every 100 ms)
        kept = [client.new_transaction() for _ in range(20)]
        futures = [out.send_async(b"kept%d" % i, txn=t) for i, t in enumerate(kept)]
        assert len(out._txn_batches) <= 20 + 1  # the ended ones' batches are gone
        for fut in abandoned:
            with pytest.raises(InvalidTxnStatus):
                fut.result(timeout=5)
        for t in kept:
            t.commit()
        assert all(f.result(timeout=5) for f in futures)
        assert sorted(scanned(client, "out")) == sorted(b"kept%d" % i for i in range(20))
