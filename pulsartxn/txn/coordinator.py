"""One transaction coordinator: its transactions, log, deadlines, low watermark and finalize.

Every operation is in the log before it is answered: the caller builds a record, the group
commit writes it (with the records of other callers and other coordinators, one LMDB write
transaction per group) and only then is the in-memory state published. Locks are never held
while waiting for a write, except for the rare reservation of a block of sequences.

States (seeds, TC deep dive): OPEN -> COMMITTING -> COMMITTED, OPEN -> ABORTING -> ABORTED,
OPEN -> (deadline) -> ABORTING -> ABORTED. COMMITTED/ABORTED are not records: the end of a
transaction is the deletion of its records, so the log holds only live transactions.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import time
from collections import OrderedDict, deque

from .._native import TxnID, TxnIdAllocator
from ..errors import (
    AlreadyClosed,
    CoordinatorUnavailable,
    CorruptEntry,
    InvalidTxnStatus,
    TooManyTransactions,
    TransactionNotFound,
    TransactionTimeout,
)
from ..storage import WriteOp, combine
from . import log
from .state import EndReason, TxnState

# Pulsar's pulsar_txn_execution_latency buckets (ms); the last bucket is "overflow".
HISTOGRAM_MS = (10, 20, 50, 100, 500, 1000, 5000, 15000, 30000, 60000, 300000, 1500000, 3000000)
RECENT_FINISHED = 100_000  # outcomes kept in memory after a transaction's records are gone
RESERVE_BLOCK = 4096  # sequences reserved per durable high-water mark write
MAX_BACKOFF_S = 5.0

OPEN, COMMITTING, ABORTING = TxnState.OPEN, TxnState.COMMITTING, TxnState.ABORTING
COMMITTED, ABORTED = TxnState.COMMITTED, TxnState.ABORTED


class TxnMeta:
    """A live transaction as its coordinator knows it."""

    __slots__ = (
        "txn_id",
        "seq",
        "state",
        "reason",
        "timeout_ms",
        "open_ms",
        "deadline",
        "group",
        "partitions",
        "subscriptions",
        "records",
        "durable",
        "inflight",
        "pending",
        "decision",
        "started",
        "retries",
        "last_error",
        "writes",
        "new_record",
    )

    def __init__(self, txn_id, seq, timeout_ms, open_ms, deadline, group) -> None:
        self.txn_id = txn_id
        self.seq = seq
        self.state = OPEN
        self.reason = 0
        self.timeout_ms = timeout_ms
        self.open_ms = open_ms
        self.deadline = deadline  # time.monotonic() seconds
        self.group = group
        self.partitions: set = set()
        self.subscriptions: set = set()
        self.records = 1  # the NEW record is index 0
        self.durable = False  # begun: its NEW record written, or riding with its first write
        self.inflight = 0  # add-participant writes not yet answered
        self.pending: set | None = None  # participants not yet finalized
        self.decision: int | None = None
        self.started = time.monotonic()
        self.retries = 0
        self.last_error: str | None = None
        self.writes: list | None = None  # participants' deferred writes (futures)
        # (key, value) of the NEW record while it is not known to be in the log: every write
        # of the transaction carries it until one has landed (Coordinator.stage).
        self.new_record: tuple | None = None

    @property
    def commit(self) -> bool:
        return self.state in (COMMITTING, COMMITTED)

    def participants(self) -> list:
        return [("partition", p) for p in sorted(self.partitions)] + [
            ("subscription", s) for s in sorted(self.subscriptions)
        ]


def status_error(txn_id, state: TxnState, reason: int, timeout_ms: int, op: str):
    if state in (ABORTING, ABORTED) and reason == EndReason.TIMEOUT:
        return TransactionTimeout(
            f"cannot {op} transaction {txn_id}: it timed out after {timeout_ms} ms and was aborted"
        )
    return InvalidTxnStatus(f"cannot {op} transaction {txn_id}: it is {state.value}")


class Coordinator:
    def __init__(self, service, coordinator_id: int) -> None:
        self.service = service
        self.id = coordinator_id
        self.storage = service.storage
        self.db = self.storage.open_db(log.log_db_name(coordinator_id))
        # Never held while waiting for a write: the group commit's callbacks take it.
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self._alloc_lock = threading.Lock()  # the allocator (its reservations write)
        self.txns: dict[int, TxnMeta] = {}
        self.finished: OrderedDict = OrderedDict()  # seq -> (state, reason, timeout_ms)
        self._order: deque = deque()  # live sequences, ascending (for the low watermark)
        self._deadlines: list = []  # heap of (deadline, seq)
        self.allocator: TxnIdAllocator | None = None
        self.status = "RECOVERING"
        self.error: str | None = None
        self.created = self.committed = self.aborted = self.timed_out = 0
        self.finalize_retries = self.append_failures = 0
        self.histogram = [0] * (len(HISTOGRAM_MS) + 1)
        self.recovery: dict = {}

    # -- recovery --------------------------------------------------------------------------

    def recover(self, decided: dict) -> list[TxnMeta]:
        """Replay the log; return the transactions to finalize (COMMITTING/ABORTING, and OPEN
        ones whose deadline passed while the broker was down, now ABORTING)."""
        start = time.monotonic()
        try:
            metas = self._replay()
            with self.storage.read() as txn:
                raw = txn.get(log.hwm_key(self.id), db=self.storage.meta)
                hwm = int.from_bytes(bytes(raw), "big") if raw is not None else 0
        except (CorruptEntry, ValueError) as exc:
            self.status = "ERROR"
            self.error = f"transaction log of coordinator {self.id} cannot be read: {exc}"
            self.recovery = {"recover_time_ms": (time.monotonic() - start) * 1000.0}
            return []
        # Sequences start at 1: TxnID 0:0 is all zeros, what an entry header without a
        # transaction holds.
        next_seq = max([hwm, 1] + [m.seq + 1 for m in metas])
        self.allocator = TxnIdAllocator(
            self.id, next_seq, block_size=RESERVE_BLOCK, reserve=self._reserve
        )
        now_wall = time.time() * 1000.0
        now = time.monotonic()
        to_finalize, expired = [], 0
        for meta in metas:  # ascending sequence
            meta.durable = True
            outcome = decided.get(meta.txn_id)
            if meta.state is OPEN and outcome is not None:
                decision_id, commit = outcome
                meta.state = COMMITTING if commit else ABORTING
                meta.reason = EndReason.GROUP
                meta.decision = decision_id
            if meta.state is OPEN:
                remaining_ms = meta.open_ms + meta.timeout_ms - now_wall
                meta.deadline = now + remaining_ms / 1000.0
                if remaining_ms <= 0:
                    # Pulsar #19200: a transaction whose deadline passed while the broker was
                    # down is aborted now, or it would hold back its partitions for good.
                    meta.state = ABORTING
                    meta.reason = EndReason.TIMEOUT
                    expired += 1
                else:
                    self._deadlines.append((meta.deadline, meta.seq))
            if meta.state is not OPEN:
                to_finalize.append(meta)
            self.txns[meta.seq] = meta
            self._order.append(meta.seq)
        heapq.heapify(self._deadlines)
        self.status = "READY"
        self.recovery = {
            "recover_time_ms": round((time.monotonic() - start) * 1000.0, 3),
            "recovered_txns": len(metas),
            "recovered_open": len(metas) - len(to_finalize),
            "recovered_finalizing": len(to_finalize) - expired,
            "recovered_timed_out": expired,
        }
        return to_finalize

    def _replay(self) -> list[TxnMeta]:
        metas: dict[int, TxnMeta] = {}
        with self.storage.read() as txn:
            for key, value in txn.cursor(db=self.db):
                seq, index = log.split_key(bytes(key))
                rec = log.decode(value)
                meta = metas.get(seq)
                if index == 0:
                    if rec.kind != log.NEW or meta is not None:
                        raise CorruptEntry(f"transaction {self.id}:{seq} has no NEW record first")
                    meta = TxnMeta(
                        TxnID(self.id, seq), seq, rec.timeout_ms, rec.open_ms, 0.0, rec.group
                    )
                    metas[seq] = meta
                elif meta is None:
                    # Its NEW record was deleted first: the transaction was finishing.
                    continue
                elif rec.kind == log.PARTITIONS:
                    meta.partitions.update(rec.names)
                elif rec.kind == log.SUBSCRIPTIONS:
                    meta.subscriptions.update(tuple(n) for n in rec.names)
                elif rec.kind == log.END:
                    meta.state = COMMITTING if rec.commit else ABORTING
                    meta.reason = rec.reason
                else:
                    raise CorruptEntry(
                        f"transaction {self.id}:{seq} has a record of kind {rec.kind}"
                    )
                meta.records = max(meta.records, index + 1)
        return [metas[s] for s in sorted(metas)]

    def _reserve(self, mark: int) -> None:
        key, value = log.hwm_key(self.id), mark.to_bytes(16, "big")
        self.storage.write(lambda txn: txn.put(key, value, db=self.storage.meta))

    # -- lookups ---------------------------------------------------------------------------

    def check_ready(self) -> None:
        if self.status != "READY":
            raise CoordinatorUnavailable(
                f"transaction coordinator {self.id} is {self.status}: {self.error}"
            )

    def live(self, seq: int, op: str) -> TxnMeta:
        """The live transaction, or the error for a finished or unknown one (lock held)."""
        meta = self.txns.get(seq)
        if meta is not None:
            return meta
        self.check_ready()
        done = self.finished.get(seq)
        if done is not None:
            return _raise(status_error(TxnID(self.id, seq), done[0], done[1], done[2], op))
        raise TransactionNotFound(f"transaction {self.id}:{seq} is unknown to its coordinator")

    def state_of(self, seq: int) -> tuple[TxnState, int]:
        with self.lock:
            meta = self.txns.get(seq)
            if meta is not None:
                return meta.state, meta.reason
            done = self.finished.get(seq)
            if done is not None:
                return done[0], done[1]
        self.check_ready()
        raise TransactionNotFound(f"transaction {self.id}:{seq} is unknown to its coordinator")

    def low_watermark(self) -> int:
        """The lowest sequence not yet finished (every lower one is COMMITTED or ABORTED)."""
        with self.lock:
            return self._lwm()

    def _lwm(self) -> int:
        order, txns = self._order, self.txns
        while order and order[0] not in txns:
            order.popleft()
        if order:
            return order[0]
        return self.allocator.next_sequence if self.allocator is not None else 0

    # -- operations ------------------------------------------------------------------------

    def new(self, timeout_ms: int, group: str | None) -> TxnMeta:
        now = time.monotonic()
        open_ms = int(time.time() * 1000)
        # The allocator may write (a block reservation): under its own lock, not self.lock,
        # which the group commit's callbacks take. Held until the sequence is in _order, so
        # that _order stays ascending.
        with self._alloc_lock:
            self._check_room()
            txn_id = self.allocator.next()
            seq = txn_id.sequence
            meta = TxnMeta(txn_id, seq, timeout_ms, open_ms, now + timeout_ms / 1000.0, group)
            with self.lock:
                self.txns[seq] = meta
                self._order.append(seq)
                heapq.heappush(self._deadlines, (meta.deadline, seq))
        record = log.encode_new(timeout_ms, open_ms, group)
        key = log.record_key(seq, 0)
        if not self.service.durable_begin:
            # The record rides with the transaction's first write: until then there is
            # nothing a crash could leave half done (the sequence is reserved already).
            with self.lock:
                meta.new_record = (key, record)
                meta.durable = True
                self.created += 1
            return meta
        try:
            self._write(lambda t: t.put(key, record, db=self.db), len(record))
        except BaseException:
            with self.lock:
                self.txns.pop(seq, None)
            raise
        with self.lock:
            meta.durable = True
            self.created += 1
        return meta

    def _check_room(self) -> None:
        with self.lock:
            self.check_ready()
            limit = self.service.max_active
            if len(self.txns) >= limit:
                raise TooManyTransactions(
                    f"coordinator {self.id} has {len(self.txns)} live transactions "
                    f"(max_active_txns_per_coordinator={limit}); end some first"
                )

    def add(self, seq: int, kind: int, names: list) -> None:
        """Log partitions (kind PARTITIONS) or subscriptions the transaction touches."""
        op = "add partitions to" if kind == log.PARTITIONS else "add subscriptions to"
        with self.lock:
            meta = self.live(seq, op)
            if meta.state is not OPEN:
                raise status_error(meta.txn_id, meta.state, meta.reason, meta.timeout_ms, op)
            target = meta.partitions if kind == log.PARTITIONS else meta.subscriptions
            new = list(dict.fromkeys(n for n in names if n not in target))
            if not new:
                return
        # A staged record written on its own, waited for.
        apply, done = self.stage(seq, kind, new, inflight=True)
        try:
            self._write(apply, 64 * len(new))
        except BaseException:
            done(False)
            with self.lock:
                if meta.state is OPEN:
                    target.difference_update(new)
            raise
        done(True)

    def stage(self, seq: int, kind: int, names: list, inflight: bool):
        """Register partitions or subscriptions in a record that rides in the caller's own
        write (the data or the pending acks it covers), so that record and data land in one
        LMDB transaction: no write of its own, no fsync of its own.

        Returns ``(apply, done)``: ``apply(txn)`` puts the record; ``done(landed)`` is called
        with whether that write landed (with `inflight`, an end waits for that call).
        Until the transaction's NEW record is known to be in the log, the record carries it.
        The names count as participants at once: a finalize that reaches one which never saw
        the transaction is a no-op there.
        """
        op = "add partitions to" if kind == log.PARTITIONS else "add subscriptions to"
        with self.lock:
            meta = self.live(seq, op)
            if meta.state is not OPEN:
                raise status_error(meta.txn_id, meta.state, meta.reason, meta.timeout_ms, op)
            index = meta.records
            meta.records += 1
            (meta.partitions if kind == log.PARTITIONS else meta.subscriptions).update(names)
            if inflight:
                meta.inflight += 1
            first = meta.new_record
        record = log.encode_names(kind, list(names))
        key = log.record_key(seq, index)
        db = self.db

        def apply(txn) -> None:
            if first is not None:
                txn.put(first[0], first[1], db=db)  # the same bytes whoever writes it
            txn.put(key, record, db=db)

        def done(landed: bool) -> None:
            with self.lock:
                if landed and first is not None and meta.new_record is first:
                    meta.new_record = None
                if inflight:
                    meta.inflight -= 1
                    if meta.inflight == 0:
                        self.cond.notify_all()

        return apply, done

    def end(self, seq: int, commit: bool, reason: int, expected_acks=None, riding=()) -> TxnMeta:
        """Decide the end of one transaction (logged), then finalize its participants.

        The decision is one write: the END record, with what the participants that live in
        this broker can write in the same LMDB transaction (the pending acks a commit needs
        durable, and the partitions' markers), after the transaction's own data batches that
        were still waiting to ride with a group commit (`riding`: (op, carries a staged
        registration, partition)). Only the subscriptions' cursor updates follow, deferred:
        the END record stays until they have landed, so a crash before that finalizes them
        again."""
        op = "commit" if commit else "abort"
        taken = self.storage.commits.take_lazy([r[0] for r in riding]) if riding else []
        if taken and not commit:
            # An abort does not need them written: they never are.
            _fail_ops(taken, InvalidTxnStatus(f"transaction {self.id}:{seq} was aborted"))
            taken = []
        try:
            per_partition, staged = self._riding(riding, taken, commit)
            with self.lock:
                meta = self.live(seq, op)
                if meta.state is not OPEN or not meta.durable:
                    raise status_error(meta.txn_id, meta.state, meta.reason, meta.timeout_ms, op)
                meta.state = COMMITTING if commit else ABORTING
                meta.reason = reason
                while meta.inflight > staged:  # the taken ones land with the decision
                    self.cond.wait()
                empty = not meta.partitions and not meta.subscriptions and not taken
                index = meta.records
                if not empty:
                    meta.records += 1
                lwm = self._lwm()
                first = meta.new_record
        except BaseException as exc:
            _fail_ops(taken, exc)
            raise
        done: set = set()
        try:
            if commit:
                for name, n in (expected_acks or {}).items():
                    if n and tuple(name) not in meta.subscriptions:
                        # Its registration rode with acks that never reached the log.
                        raise InvalidTxnStatus(
                            f"transaction {meta.txn_id}: its {n} acknowledgements on "
                            f"{name[0]} {name[1]} were lost in a broker restart; it can only "
                            "abort"
                        )
            if empty and first is not None:
                pass  # it never wrote anything: there is nothing to decide or undo
            elif empty:
                # Nothing to finalize: deleting the records is the whole end.
                self._write(self._delete_records(meta, index), 16 * index)
            else:
                try:
                    ops = self._decision_ops(meta, index, expected_acks, lwm, done, per_partition)
                except BaseException as exc:
                    _fail_ops(taken, exc)
                    raise
                ops[:0] = taken
                if first is not None:
                    ops.insert(0, self._put_op(first[0], first[1]))
                try:
                    decision = combine(ops)
                except BaseException as exc:
                    _fail_ops(ops, exc)
                    raise
                try:
                    self.storage.run(decision)
                except Exception:  # noqa: BLE001 - decided below without the participants
                    if taken:
                        raise  # its data failed with it: it cannot commit
                    # A participant's part failed with it (nothing was written): decide
                    # alone, then finalize every participant the slow way, retried until
                    # each succeeds.
                    done.clear()
                    self._decide_alone(meta, index, expected_acks, first)
        except BaseException:
            self.reopen(meta)
            raise
        if empty:
            self._finished(meta)
        else:
            self.finalize(meta, done)
        return meta

    def _riding(self, riding, taken, commit: bool) -> tuple[dict, int]:
        """Of the transaction's lazily submitted batches: wait for those not taken back (they
        are being committed); return the taken ones per partition and how many of those
        carry a staged registration (counted in the transaction's inflight writes)."""
        taken_ids = {id(o) for o in taken}
        for o, _, topic in riding:
            if id(o) in taken_ids:
                continue
            try:
                o.future.result()
            except Exception as exc:  # noqa: BLE001 - a failed send: abort only
                if commit:
                    raise InvalidTxnStatus(
                        f"cannot commit: a send of the transaction to {topic} failed: {exc}"
                    ) from exc
        per_partition: dict = {}
        staged = 0
        for o, carries, topic in riding:
            if id(o) in taken_ids:
                per_partition[topic] = per_partition.get(topic, 0) + 1
                staged += bool(carries)
        return per_partition, staged

    def _put_op(self, key: bytes, value: bytes) -> WriteOp:
        db = self.db
        return WriteOp(lambda t: t.put(key, value, db=db), nbytes=len(value))

    def _decide_alone(self, meta: TxnMeta, index: int, expected_acks, first) -> None:
        if meta.commit:
            self.prepare(meta, expected_acks)
        ops = [
            self._put_op(log.record_key(meta.seq, index), log.encode_end(meta.commit, meta.reason))
        ]
        if first is not None:
            ops.insert(0, self._put_op(first[0], first[1]))
        self.storage.run(combine(ops))

    def _decision_ops(
        self, meta: TxnMeta, index: int, expected_acks, lwm: int, done: set, riding=None
    ):
        """The END record and what local participants write with it; `done` gets the
        participants whose part is in those ops."""
        ops: list[WriteOp] = []
        commit = meta.commit
        try:
            if commit:
                expected_acks = expected_acks or {}
                for name in sorted(meta.subscriptions):
                    participant = self.service.participant("subscription", name)
                    prepare_op = getattr(participant, "prepare_op", None)
                    if prepare_op is not None:
                        o = prepare_op(meta.txn_id, expected_acks.get(tuple(name)))
                        if o is not None:
                            ops.append(o)
                    elif hasattr(participant, "prepare"):
                        participant.prepare(meta.txn_id, expected_acks.get(tuple(name)))
            ops.append(
                self._put_op(log.record_key(meta.seq, index), log.encode_end(commit, meta.reason))
            )
            for name in sorted(meta.partitions):
                try:
                    participant = self.service.participant("partition", name)
                except Exception:  # noqa: BLE001 - finalize retries it
                    continue
                end_op = getattr(participant, "end_op", None)
                if end_op is None:
                    continue
                n = (riding or {}).get(name, 0)
                o = end_op(meta.txn_id, commit, lwm, n) if n else end_op(meta.txn_id, commit, lwm)
                if o is not None:
                    ops.append(o)
                done.add(("partition", name))
        except BaseException as exc:
            _fail_ops(ops, exc)
            raise
        return ops

    def prepare(self, meta: TxnMeta, expected_acks: dict | None = None) -> None:
        """Before a commit is decided: participants that batch their own logs (pending acks)
        make this transaction's part durable, so the decision never outruns them, and check
        that they hold every ack the committer made (expected_acks: (partition, subscription)
        -> count)."""
        expected_acks = expected_acks or {}
        for name in sorted(meta.subscriptions):
            prepare = getattr(self.service.participant("subscription", name), "prepare", None)
            if prepare is not None:
                prepare(meta.txn_id, expected_acks.get(tuple(name)))

    def reopen(self, meta: TxnMeta) -> None:
        """Undo a decision whose record could not be written (nothing was decided)."""
        with self.lock:
            meta.state = OPEN
            meta.reason = 0
            meta.decision = None
            heapq.heappush(self._deadlines, (meta.deadline, meta.seq))
            self.append_failures += 1

    def _write(self, apply, nbytes: int) -> None:
        self.storage.write(apply, nbytes=nbytes)

    def _delete_records(self, meta: TxnMeta, count: int):
        db = self.db
        keys = [log.record_key(meta.seq, i) for i in range(count)]

        def apply(txn):
            for key in keys:
                txn.delete(key, db=db)

        return apply

    # -- finalize --------------------------------------------------------------------------

    def finalize(self, meta: TxnMeta, done=()) -> None:
        """Tell every participant the outcome (but those in `done`, whose part was written
        with the decision); retry failures with backoff until they succeed. One failing
        participant does not hold back the others."""
        with self.lock:
            parts = [p for p in meta.participants() if p not in done]
            meta.pending = set(parts)
        if not parts:
            self._complete(meta)
            return
        deferred, waiting = [], []
        for part in parts:
            try:
                participant = self.service.participant(*part)
            except Exception:  # noqa: BLE001 - _call retries it
                participant = None
            (deferred if getattr(participant, "deferred_end", False) else waiting).append(part)
        # Participants that write synchronously are told at once (all but one on the pool):
        # their writes (markers, cursors) then share one group commit instead of one fsync
        # after the other. Those that defer their write are quick: told here.
        for part in waiting[1:]:
            self.service.timer.submit(self._call, meta, part, 0)
        for part in deferred:
            self._call(meta, part, 0)
        if waiting:
            self._call(meta, waiting[0], 0)

    def _call(self, meta: TxnMeta, part, attempt: int) -> None:
        service = self.service
        if service.closed:
            return  # recovery finishes it after a restart
        write = None
        try:
            with self.lock:
                lwm = self._lwm()
            participant = service.participant(*part)
            if getattr(participant, "deferred_end", False):
                # The decision is durable: the participant's write may ride with the next
                # group; the records stay until it has landed (_complete).
                write = participant.end_txn(meta.txn_id, meta.commit, lwm, wait=False)
            else:
                participant.end_txn(meta.txn_id, meta.commit, lwm)
        except Exception as exc:  # noqa: BLE001 - retried until it succeeds
            with self.lock:
                meta.retries += 1
                meta.last_error = f"{part[0]} {part[1]}: {exc!r}"
                self.finalize_retries += 1
            delay = min(0.01 * (2**attempt), MAX_BACKOFF_S)
            service.timer.call_later(delay, self._call, meta, part, attempt + 1)
            return
        with self.lock:
            if write is not None:
                if meta.writes is None:
                    meta.writes = []
                meta.writes.append(write)
            meta.pending.discard(part)
            done = not meta.pending
        if done:
            self._complete(meta)

    def _complete(self, meta: TxnMeta) -> None:
        """All participants are done: the transaction is COMMITTED or ABORTED. Its records
        (and its share of a decision record) are deleted once the participants' deferred
        writes have landed."""
        with self.lock:
            writes, meta.writes = meta.writes or [], None
        if not writes:
            self._cleanup(meta)
        else:
            left = [len(writes)]
            failed: list = []
            count_lock = threading.Lock()  # not self.lock: this runs in commit callbacks

            def landed(fut) -> None:
                with count_lock:
                    if fut.exception() is not None:
                        failed.append(fut.exception())
                    left[0] -= 1
                    last = left[0] == 0
                if last and not failed:
                    self._cleanup(meta)
                elif last:
                    # The records stay: after a restart, recovery finalizes it again.
                    meta.last_error = f"a participant's write failed: {failed[0]!r}"
                    self.append_failures += 1

            for fut in writes:
                fut.add_done_callback(landed)
        self._finished(meta)

    def _cleanup(self, meta: TxnMeta) -> None:
        storage = self.storage
        if not storage.closed:
            try:
                storage.submit(
                    WriteOp(self._delete_records(meta, meta.records), nbytes=16), lazy=True
                )
            except AlreadyClosed:
                pass  # recovery finalizes it again (participants treat that as success)
        self.service.release_decision(meta)

    def _finished(self, meta: TxnMeta) -> None:
        elapsed_ms = (time.monotonic() - meta.started) * 1000.0
        with self.lock:
            commit = meta.commit
            meta.state = COMMITTED if commit else ABORTED
            self.txns.pop(meta.seq, None)
            self.finished[meta.seq] = (meta.state, meta.reason, meta.timeout_ms)
            if len(self.finished) > RECENT_FINISHED:
                self.finished.popitem(last=False)
            if commit:
                self.committed += 1
            else:
                self.aborted += 1
                if meta.reason == EndReason.TIMEOUT:
                    self.timed_out += 1
            self.histogram[bisect.bisect_left(HISTOGRAM_MS, elapsed_ms)] += 1
            self.cond.notify_all()
        self.service.on_finished(meta)

    def wait(self, meta: TxnMeta, timeout_s: float | None) -> bool:
        """Wait until the transaction is COMMITTED or ABORTED; False on timeout."""
        with self.lock:
            return self.cond.wait_for(
                lambda: meta.state in (COMMITTED, ABORTED) or self.service.closed, timeout_s
            ) and meta.state in (COMMITTED, ABORTED)

    # -- deadlines -------------------------------------------------------------------------

    def expire(self, now: float) -> list[int]:
        """Sequences of OPEN transactions whose deadline has passed (timer thread)."""
        due = []
        with self.lock:
            heap, txns = self._deadlines, self.txns
            while heap and heap[0][0] <= now:
                _, seq = heapq.heappop(heap)
                meta = txns.get(seq)
                if meta is None or meta.state is not OPEN:
                    continue
                if not meta.durable:  # its NEW record is still being written
                    heapq.heappush(heap, (now + 0.01, seq))
                    break
                due.append(seq)
            if len(heap) > 2 * len(txns) + 1024:
                # Entries of ended transactions are dropped lazily; rebuild when they dominate.
                self._deadlines = [(m.deadline, s) for s, m in txns.items() if m.state is OPEN]
                heapq.heapify(self._deadlines)
        return due

    def timeout(self, seq: int) -> None:
        try:
            self.end(seq, False, EndReason.TIMEOUT)
        except (InvalidTxnStatus, TransactionNotFound, AlreadyClosed, CoordinatorUnavailable):
            pass  # ended meanwhile, or the broker is closing

    # -- views -----------------------------------------------------------------------------

    def stats(self) -> dict:
        with self.lock:
            states = {OPEN: 0, COMMITTING: 0, ABORTING: 0}
            finalizing = []
            for meta in self.txns.values():
                states[meta.state] = states.get(meta.state, 0) + 1
                if meta.pending:
                    finalizing.append(
                        {
                            "txn_id": str(meta.txn_id),
                            "state": meta.state.value,
                            "pending_participants": len(meta.pending),
                            "retries": meta.retries,
                            "last_error": meta.last_error,
                        }
                    )
            buckets = {f"le_{b}": n for b, n in zip(HISTOGRAM_MS, self.histogram)}
            buckets["overflow"] = self.histogram[-1]
            return {
                "coordinator_id": self.id,
                "state": self.status,
                "error": self.error,
                "low_watermark": self._lwm(),
                "next_sequence": self.allocator.next_sequence if self.allocator else None,
                "ongoing_txn_size": len(self.txns),
                "open": states[OPEN],
                "committing": states[COMMITTING],
                "aborting": states[ABORTING],
                "created": self.created,
                "committed": self.committed,
                "aborted": self.aborted,
                "timed_out": self.timed_out,
                "active": len(self.txns),
                "append_failures": self.append_failures,
                "finalize_retries": self.finalize_retries,
                "finalizing": finalizing,
                "max_active_txns": self.service.max_active,
                "execution_latency_ms": buckets,
                **self.recovery,
            }

    def metadata(self, meta: TxnMeta) -> dict:
        return {
            "txn_id": str(meta.txn_id),
            "coordinator_id": self.id,
            "sequence": meta.seq,
            "state": meta.state.value,
            "end_reason": EndReason(meta.reason).name if meta.reason else None,
            "timeout_ms": meta.timeout_ms,
            "open_timestamp_ms": meta.open_ms,
            "open_ms": round((time.monotonic() - meta.started) * 1000.0, 3),
            "group": meta.group,
            "produced_partitions": sorted(meta.partitions),
            "acked_subscriptions": [list(s) for s in sorted(meta.subscriptions)],
            "pending_participants": len(meta.pending) if meta.pending else 0,
            "finalize_retries": meta.retries,
            "last_error": meta.last_error,
        }


def _fail_ops(ops, exc) -> None:
    """Ops built but never submitted: answer them with `exc` (their callbacks undo)."""
    for op in ops:
        if not op.future.done():
            op.future.set_exception(exc)


def _raise(exc):
    raise exc
