"""Model-based fuzzing: random sequences of public API calls on a real broker on disk, checked
against a small in-memory model after every step.

The model knows every message produced (per partition, in ledger order), which transaction
produced or acknowledged what, and what each subscription's consumer holds. It checks
read-committed (a scan shows exactly the plain and committed messages below each partition's
max read position, in order) and exactly-once (a message acknowledged and committed is never
delivered again; a message whose transactional ack was aborted comes back; nothing the model
expects to be delivered is missing: a receive that times out while the model holds a
deliverable message fails).

HYPOTHESIS_PROFILE=thorough runs many more and longer sequences.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

import pulsartxn
from pulsartxn import InitialPosition, TxnState
from pulsartxn.errors import (
    InvalidTxnStatus,
    Timeout,
    TransactionConflict,
    TransactionNotFound,
    TransactionTimeout,
)

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
TOPICS = {"a": 2, "b": 0}  # name -> partitions (0: non-partitioned)
SUBSCRIPTIONS = [("a", "s1"), ("a", "s2"), ("b", "s1")]
LONG_TIMEOUT_MS = 600_000  # never reached in a run: only expire() times a transaction out
SHORT_TIMEOUT_MS = 100
WAIT_S = 15.0  # bound of every poll: far above what a healthy broker needs
PICK = st.integers(0, 7)  # which open transaction a step uses (0: a new one)


@dataclass
class Msg:
    data: bytes
    part: tuple  # (topic, partition index)
    txn: int | None  # model transaction number, None for a plain send


@dataclass
class Txn:
    n: int
    handle: object
    state: str = "open"  # open | committed | aborted
    produced: list = field(default_factory=list)  # Msg
    acks: list = field(default_factory=list)  # (subscription key, data)


def _wait_timed_out(handle) -> None:
    deadline = time.monotonic() + WAIT_S
    while handle.state is not TxnState.TIMEOUT:
        assert time.monotonic() < deadline, f"{handle.id} never timed out: {handle.state}"
        time.sleep(0.01)


class BrokerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="pulsartxn-model-")
        self.broker = None
        self.counter = 0
        self.ledger: dict[tuple, list[Msg]] = {}  # partition -> messages in entry order
        self.by_data: dict[bytes, Msg] = {}
        self.txn_list: list[Txn] = []
        # Per subscription: data acknowledged for good, held by a transaction's pending ack,
        # delivered to the consumer and not yet acked (data -> Message), and per partition the
        # highest message delivered for the first time since the last (re)start.
        self.acked = {s: set() for s in SUBSCRIPTIONS}
        self.pending = {s: {} for s in SUBSCRIPTIONS}
        self.held_msgs = {s: {} for s in SUBSCRIPTIONS}  # data -> the Message a txn acked
        self.outstanding = {s: {} for s in SUBSCRIPTIONS}
        self.fresh_high = {s: {} for s in SUBSCRIPTIONS}
        self.seen = {s: set() for s in SUBSCRIPTIONS}  # delivered since the last (re)start
        # Per topic: sequence ids of sends an abort took from a batching producer's waiting
        # batch, to be sent again later (after other sends, maybe after a restart).
        self.to_resend: dict[str, list[int]] = {t: [] for t in TOPICS}

    # -- plumbing --------------------------------------------------------------------------

    def _open(self, create: bool = False) -> None:
        self.broker = pulsartxn.Broker(
            self.dir, sync=False, num_coordinators=2, txn_timeout_tick_ms=10
        )
        if create:
            for topic, n in TOPICS.items():
                self.broker.create_topic(topic, n)
        self.client = self.broker.client()
        self.producers = {t: self.client.create_producer(t, batching_enabled=False) for t in TOPICS}
        # Named, for sends with explicit sequence ids (de-duplication); a partition key keeps
        # each on one partition, where its sequence ids are counted.
        self.sequenced = {
            t: self.client.create_producer(t, producer_name=f"seq-{t}", batching_enabled=False)
            for t in TOPICS
        }
        # Batching with a long delay: a transaction's sends wait in it until its end.
        self.batching = {
            t: self.client.create_producer(
                t, producer_name=f"batching-{t}", batching_max_publish_delay_ms=60_000
            )
            for t in TOPICS
        }
        self.consumers = {
            (t, s): self.client.subscribe(t, s, initial_position=InitialPosition.Earliest)
            for t, s in SUBSCRIPTIONS
        }
        for key in SUBSCRIPTIONS:
            # What was delivered and not acked goes back: it is deliverable again.
            self.outstanding[key].clear()
            self.fresh_high[key].clear()
            self.seen[key].clear()
            # Held by an open transaction's pending ack: delivered before the restart, and
            # back after an abort as a redelivery, outside ledger order.
            self.seen[key].update(self.pending[key])

    def teardown(self) -> None:
        if self.broker is not None:
            self.broker.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _next(self) -> bytes:
        self.counter += 1
        return b"m%d" % self.counter

    def _ongoing_on(self, part) -> int | None:
        """Index of the first entry of an ongoing transaction on the partition (its max read
        position), None when there is none."""
        for i, m in enumerate(self.ledger.get(part, [])):
            if m.txn is not None and self.txn_list[m.txn].state == "open":
                return i
        return None

    def _visible(self, part) -> list[Msg]:
        entries = self.ledger.get(part, [])
        stop = self._ongoing_on(part)
        if stop is not None:
            entries = entries[:stop]
        return [m for m in entries if m.txn is None or self.txn_list[m.txn].state == "committed"]

    def _parts(self, topic):
        n = TOPICS[topic]
        return [(topic, i) for i in range(n)] if n else [(topic, -1)]

    def _deliverable(self, key) -> set[bytes]:
        topic = key[0]
        out = set()
        for part in self._parts(topic):
            for m in self._visible(part):
                d = m.data
                if (
                    d not in self.acked[key]
                    and d not in self.pending[key]
                    and d not in self.outstanding[key]
                ):
                    out.add(d)
        return out

    def _record_send(self, topic, data, msg_id, txn: Txn | None) -> None:
        part = (topic, msg_id.partition())
        assert part in self._parts(topic), (part, msg_id)
        assert data not in self.by_data, f"the model sent {data!r} twice"
        m = Msg(data, part, txn.n if txn else None)
        self.ledger.setdefault(part, []).append(m)
        self.by_data[data] = m
        if txn is not None:
            txn.produced.append(m)

    def _end(self, txn: Txn, commit: bool) -> None:
        txn.state = "committed" if commit else "aborted"
        for key, data in txn.acks:
            del self.pending[key][data]
            del self.held_msgs[key][data]
            if commit:
                self.acked[key].add(data)

    # -- rules -----------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self._open(create=True)
        for topic in TOPICS:  # something to consume from the first step on
            self.send_plain(topic, 3)
        for topic, n in TOPICS.items():
            assert len(self.broker.topic_partitions(topic)) == max(n, 1)

    @rule(topic=st.sampled_from(sorted(TOPICS)), count=st.integers(1, 3))
    def send_plain(self, topic, count) -> None:
        for _ in range(count):
            data = self._next()
            self._record_send(topic, data, self.producers[topic].send(data), None)

    def _open_txn(self, pick: int) -> Txn:
        """One of the open transactions (a new one when none is open, or on pick 0)."""
        live = [t for t in self.txn_list if t.state == "open"]
        if not live or pick == 0:
            handle = self.client.new_transaction(timeout_ms=LONG_TIMEOUT_MS)
            assert handle.state is TxnState.OPEN
            txn = Txn(len(self.txn_list), handle)
            self.txn_list.append(txn)
            return txn
        return live[pick % len(live)]

    @rule(pick=PICK, topic=st.sampled_from(sorted(TOPICS)), count=st.integers(1, 3))
    def send_in_txn(self, pick, topic, count) -> None:
        txn = self._open_txn(pick)
        for _ in range(count):
            data = self._next()
            msg_id = self.producers[topic].send(data, txn=txn.handle)
            self._record_send(topic, data, msg_id, txn)

    def _receive_one(self, sub) -> bool:
        """Receive one message where the model expects one (checked), else check that nothing
        comes; False when nothing was expected."""
        expected = self._deliverable(sub)
        consumer = self.consumers[sub]
        if not expected:
            with pytest.raises(Timeout):
                got = consumer.receive(timeout_millis=30)
                pytest.fail(f"{sub}: delivered {got.data()!r}, the model expects nothing")
            return False
        try:
            msg = consumer.receive(timeout_millis=int(WAIT_S * 1000))
        except Timeout:
            pytest.fail(f"{sub}: nothing delivered, the model expects one of {sorted(expected)}")
        data = msg.data()
        assert data not in self.acked[sub], f"{sub}: {data!r} was acknowledged and committed"
        assert data not in self.pending[sub], f"{sub}: {data!r} is held by a pending ack"
        assert data in expected, f"{sub}: delivered {data!r}, expected one of {sorted(expected)}"
        m = self.by_data[data]
        part = (m.part[0], msg.message_id().partition())
        assert part == m.part
        if data not in self.seen[sub]:
            # First delivery since the (re)start: in ledger order within its partition.
            index = self.ledger[part].index(m)
            assert index > self.fresh_high[sub].get(part, -1), f"{sub}: {data!r} out of order"
            self.fresh_high[sub][part] = index
            self.seen[sub].add(data)
        self.outstanding[sub][data] = msg
        return True

    @rule(sub=st.sampled_from(SUBSCRIPTIONS), count=st.integers(1, 3))
    def receive(self, sub, count) -> None:
        for _ in range(count):
            if not self._receive_one(sub):
                return

    @rule(sub=st.sampled_from(SUBSCRIPTIONS))
    def drain(self, sub) -> None:
        """Everything the model holds deliverable arrives, then nothing more."""
        while self._receive_one(sub):
            pass

    def _pick_outstanding(self, sub, which):
        """A message delivered and not acked (one is received first if there is none)."""
        held = self.outstanding[sub]
        if not held and not self._receive_one(sub):
            return None
        data = sorted(held)[which % len(held)]
        return data, held.pop(data)

    @rule(sub=st.sampled_from(SUBSCRIPTIONS), which=st.integers(0, 50), count=st.integers(1, 3))
    def ack_plain(self, sub, which, count) -> None:
        for _ in range(count):
            picked = self._pick_outstanding(sub, which)
            if picked is None:
                return
            data, msg = picked
            self.consumers[sub].acknowledge(msg)
            self.acked[sub].add(data)

    @rule(
        pick=PICK,
        sub=st.sampled_from(SUBSCRIPTIONS),
        which=st.integers(0, 50),
        count=st.integers(1, 3),
    )
    def ack_in_txn(self, pick, sub, which, count) -> None:
        txn = self._open_txn(pick)
        for _ in range(count):
            picked = self._pick_outstanding(sub, which)
            if picked is None:
                return
            data, msg = picked
            self.consumers[sub].acknowledge(msg, txn=txn.handle)
            self.pending[sub][data] = txn.n
            self.held_msgs[sub][data] = msg
            txn.acks.append((sub, data))

    @rule(pick=PICK, commit=st.booleans())
    def end(self, pick, commit) -> None:
        """Commit or abort an open transaction; a second end is refused."""
        live = [t for t in self.txn_list if t.state == "open"]
        if not live:
            return
        txn = live[pick % len(live)]
        if commit:
            txn.handle.commit()
            assert txn.handle.state is TxnState.COMMITTED
        else:
            txn.handle.abort()
            assert txn.handle.state is TxnState.ABORTED
        self._end(txn, commit)
        with pytest.raises(InvalidTxnStatus):
            txn.handle.commit()

    @rule(
        sub=st.sampled_from(SUBSCRIPTIONS),
        out=st.sampled_from(sorted(TOPICS)),
        commit=st.booleans(),
    )
    def process(self, sub, out, commit) -> None:
        """Consume-process-produce in one transaction: ack an input, produce its output,
        commit or abort (an aborted ack's input must come back)."""
        picked = self._pick_outstanding(sub, 0)
        if picked is None:
            return
        data, msg = picked
        txn = self._open_txn(0)
        result = self._next() + b"<-" + data  # unique: two subscriptions may process one input
        self._record_send(out, result, self.producers[out].send(result, txn=txn.handle), txn)
        self.consumers[sub].acknowledge(msg, txn=txn.handle)
        self.pending[sub][data] = txn.n
        self.held_msgs[sub][data] = msg
        txn.acks.append((sub, data))
        (txn.handle.commit if commit else txn.handle.abort)()
        self._end(txn, commit)

    @rule(
        produce=st.lists(st.sampled_from(sorted(TOPICS)), max_size=3),
        sub=st.sampled_from(SUBSCRIPTIONS),
        ack=st.booleans(),
        go=st.integers(0, 5),
    )
    def expire(self, produce, sub, ack, go) -> None:
        """A transaction with a short timeout produces and acks, then is left to time out.
        (One draw in six: waiting for a timeout is the slowest step.)"""
        if go:
            return
        handle = self.client.new_transaction(timeout_ms=SHORT_TIMEOUT_MS)
        txn = Txn(len(self.txn_list), handle)
        self.txn_list.append(txn)
        for topic in produce:
            data = self._next()
            try:
                msg_id = self.producers[topic].send(data, txn=handle)
            except InvalidTxnStatus:
                break  # timed out already (a slow machine): nothing more to add
            self._record_send(topic, data, msg_id, txn)
        picked = self._pick_outstanding(sub, 0) if ack else None
        if picked is not None:
            data, msg = picked
            try:
                self.consumers[sub].acknowledge(msg, txn=handle)
                self.pending[sub][data] = txn.n
                self.held_msgs[sub][data] = msg
                txn.acks.append((sub, data))
            except InvalidTxnStatus:
                self.outstanding[sub][data] = msg  # the ack was refused: still ours
        _wait_timed_out(handle)
        with pytest.raises(TransactionTimeout):
            handle.commit()
        self._end(txn, False)

    @rule(which=st.integers(0, 50), sub=st.sampled_from(SUBSCRIPTIONS), op=st.booleans())
    def late_op(self, which, sub, op) -> None:
        """An ack or a send in a transaction that has ended (committed, aborted, timed out),
        through a handle that does not know it ended: refused, nothing changes."""
        ended = [t for t in self.txn_list if t.state != "open" and t.handle is not None]
        if not ended:
            return
        txn = ended[which % len(ended)]
        try:
            late = self.client.transaction(txn.handle.id)
        except TransactionNotFound:
            return  # forgotten by a restart: unknown is a refusal too
        event("late op")
        if op:
            picked = self._pick_outstanding(sub, which)
            if picked is None:
                return
            data, msg = picked
            with pytest.raises(InvalidTxnStatus):
                self.consumers[sub].acknowledge(msg, txn=late)
            self.outstanding[sub][data] = msg  # not taken: still the consumer's
        else:
            topic = sub[0]
            with pytest.raises(InvalidTxnStatus):
                self.producers[topic].send(self._next(), txn=late)

    @rule(pick=PICK, sub=st.sampled_from(SUBSCRIPTIONS), which=st.integers(0, 50))
    def conflict(self, pick, sub, which) -> None:
        """A second transaction acks a message another holds: TransactionConflict; it can
        only abort now, and its commit aborts it (what it held and produced is released)."""
        held = sorted(self.pending[sub])
        if not held:
            return
        data = held[which % len(held)]
        loser = self._open_txn(0)
        msg = self.held_msgs[sub][data]
        event("conflicting ack")
        with pytest.raises(TransactionConflict):
            self.consumers[sub].acknowledge(msg, txn=loser.handle)
        with pytest.raises(TransactionConflict, match="aborted"):
            loser.handle.commit()
        assert loser.handle.state is TxnState.ABORTED
        self._end(loser, False)

    @rule(topic=st.sampled_from(sorted(TOPICS)), plain=st.booleans())
    def resend_after_abort(self, topic, plain) -> None:
        """A send with an explicit sequence id in a transaction that aborts, then the same
        sequence id again (plainly, or in a transaction that commits): an aborted send does
        not count for de-duplication, so the resend is stored and shows once."""
        producer = self.sequenced[topic]
        seq = producer.last_sequence_id() + 1
        first = self._open_txn(0)
        data = self._next()
        mid = producer.send(data, sequence_id=seq, partition_key="k", txn=first.handle)
        self._record_send(topic, data, mid, first)
        first.handle.abort()
        self._end(first, False)
        event("resend after an abort")
        retry = self._next()
        if plain:
            again = producer.send(retry, sequence_id=seq, partition_key="k")
            assert again != mid
            self._record_send(topic, retry, again, None)
            return
        second = self._open_txn(0)
        again = producer.send(retry, sequence_id=seq, partition_key="k", txn=second.handle)
        assert again != mid
        self._record_send(topic, retry, again, second)
        second.handle.commit()
        self._end(second, True)

    @rule(topic=st.sampled_from(sorted(TOPICS)), count=st.integers(1, 3))
    def abort_waiting_sends(self, topic, count) -> None:
        """Sends of a transaction still waiting in a batching producer when it aborts: the
        abort takes them (answered, written aborted). Then a plain send with a higher
        sequence id; the aborted ones are sent again later (resend_aborted)."""
        producer = self.batching[topic]
        first = producer.last_sequence_id() + 1
        txn = self._open_txn(0)
        sent = [(self._next(), seq) for seq in range(first, first + count)]
        futures = [
            producer.send_async(data, sequence_id=seq, partition_key="k", txn=txn.handle)
            for data, seq in sent
        ]
        txn.handle.abort()
        for (data, _), fut in zip(sent, futures):
            self._record_send(topic, data, fut.result(timeout=WAIT_S), txn)
        self._end(txn, False)
        event("sends waiting at an abort")
        data = self._next()
        later = producer.send(data, sequence_id=first + count, partition_key="k")
        self._record_send(topic, data, later, None)
        self.to_resend[topic].extend(seq for _, seq in sent)

    @rule(topic=st.sampled_from(sorted(TOPICS)), count=st.integers(1, 3), go=st.integers(0, 5))
    def time_out_waiting_sends(self, topic, count, go) -> None:
        """Sends of a transaction still waiting in a batching producer when it times out:
        never written, they fail at the next flush. Then a plain send with a higher sequence
        id; the failed ones are sent again later (resend_aborted). (One draw in six.)"""
        if go:
            return
        producer = self.batching[topic]
        first = producer.last_sequence_id() + 1
        handle = self.client.new_transaction(timeout_ms=SHORT_TIMEOUT_MS)
        self.txn_list.append(Txn(len(self.txn_list), handle))
        futures = []
        for seq in range(first, first + count):
            try:
                futures.append(
                    producer.send_async(
                        self._next(), sequence_id=seq, partition_key="k", txn=handle
                    )
                )
            except InvalidTxnStatus:
                break  # timed out already (a slow machine): this id was not taken
        seqs = range(first, first + len(futures))
        _wait_timed_out(handle)
        producer.flush()
        assert all(isinstance(f.exception(timeout=WAIT_S), TransactionTimeout) for f in futures)
        self._end(self.txn_list[-1], False)
        event("sends waiting at a timeout")
        data = self._next()
        later = producer.send(data, sequence_id=seqs.stop, partition_key="k")
        self._record_send(topic, data, later, None)
        self.to_resend[topic].extend(seqs)

    @rule(topic=st.sampled_from(sorted(TOPICS)))
    def resend_aborted(self, topic) -> None:
        """What abort_waiting_sends aborted (or time_out_waiting_sends dropped), sent again
        plainly: stored, though a higher sequence id of the producer is (and whatever
        restarts came between)."""
        seqs, self.to_resend[topic] = self.to_resend[topic], []
        if seqs:
            event("resend of sends aborted while waiting")
        for seq in seqs:
            data = self._next()
            mid = self.batching[topic].send(data, sequence_id=seq, partition_key="k")
            assert mid.entry_id() >= 0, f"the resend of aborted sequence id {seq} was dropped"
            self._record_send(topic, data, mid, None)

    @rule(sub=st.sampled_from(SUBSCRIPTIONS))
    def unsubscribe_with_holds(self, sub) -> None:
        """Unsubscribing while transactions hold acks on the subscription is refused and
        changes nothing (the consumer stays, the holds stay)."""
        if not self.pending[sub]:
            return
        event("unsubscribe with holds")
        with pytest.raises(TransactionConflict):
            self.consumers[sub].unsubscribe()

    @rule(sub=st.sampled_from(SUBSCRIPTIONS), how=st.sampled_from(["seek", "reset", "clear"]))
    def move_cursor(self, sub, how) -> None:
        """A consumer's seek to the earliest, the admin's reset_cursor to it, or the admin's
        clear_backlog. While transactions hold acks on the subscription each is refused and
        changes nothing; else the first two make every visible message deliverable again
        (acknowledged or not, in ledger order), the third acknowledges every visible one."""
        topic = sub[0]
        admin = self.client.admin
        move = {
            "seek": lambda: self.consumers[sub].seek(pulsartxn.MessageId.earliest),
            "reset": lambda: admin.reset_cursor(topic, sub[1], pulsartxn.MessageId.earliest),
            "clear": lambda: admin.clear_backlog(topic, sub[1]),
        }[how]
        if self.pending[sub]:
            event(f"{how} refused for holds")
            with pytest.raises(TransactionConflict):
                move()
            return
        move()
        event(how)
        self.outstanding[sub].clear()
        if how == "clear":
            for part in self._parts(topic):
                self.acked[sub].update(m.data for m in self._visible(part))
            return
        self.acked[sub].clear()
        self.seen[sub].clear()
        self.fresh_high[sub].clear()

    @rule(topic=st.sampled_from(sorted(TOPICS)))
    def delete_topic_with_open_txns(self, topic) -> None:
        """Deleting a topic an open transaction wrote to or holds acks on is refused, even
        with force, and changes nothing: its producers and consumers stay open."""
        subs = [key for key in SUBSCRIPTIONS if key[0] == topic]
        wrote = any(
            m.part[0] == topic for t in self.txn_list if t.state == "open" for m in t.produced
        )
        if not wrote and not any(self.pending[key] for key in subs):
            return
        event("delete refused for open transactions")
        with pytest.raises(TransactionConflict):
            self.client.admin.delete_topic(topic, force=True)

    @rule(go=st.integers(0, 2))
    def restart(self, go) -> None:
        """Close the broker and open it again (one draw in three: the slowest step)."""
        if go:
            return
        self.broker.close()
        # Its open transactions were this process's: the close aborted them (nobody could
        # end them after it). After the reopen one that wrote messages reads ABORTED (how
        # it ended is kept); one the store kept nothing of is unknown.
        gone = [t for t in self.txn_list if t.state == "open"]
        for txn in gone:
            self._end(txn, False)
        self._open()
        for txn in gone:
            try:
                state = self.client.transaction(txn.handle.id).state
            except TransactionNotFound:
                assert not txn.produced, "a transaction whose sends returned was forgotten"
                continue
            assert state is TxnState.ABORTED

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def read_committed(self) -> None:
        if self.broker is None:
            return
        for topic in TOPICS:
            got: dict[int, list[bytes]] = {}
            for batch in self.client.scan(topic):
                parts = batch.column("partition").to_pylist()
                for p, v in zip(parts, batch.column("value").to_pylist()):
                    got.setdefault(p, []).append(v)
            for part in self._parts(topic):
                want = [m.data for m in self._visible(part)]
                assert got.get(part[1], []) == want, f"scan of {part}"

    @invariant()
    def nothing_delivered_twice_after_a_committed_ack(self) -> None:
        for key in SUBSCRIPTIONS:
            assert not (self.acked[key] & set(self.outstanding[key]))
            assert not (self.acked[key] & set(self.pending[key]))


BrokerModel.TestCase.settings = settings(
    max_examples=200 if THOROUGH else 40,
    stateful_step_count=60 if THOROUGH else 30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_broker_model = pytest.mark.slow(BrokerModel.TestCase)
