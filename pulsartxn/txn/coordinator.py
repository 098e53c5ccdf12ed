"""One transaction coordinator: its transactions, log, deadlines and low watermark. Every
operation is in the log before it is answered, and no lock is held while waiting for a write
(but to reserve a block of sequences). The log holds only live transactions: an end deletes
their records. The end itself is in :mod:`pulsartxn.txn.decision` and
:mod:`pulsartxn.txn.finalize`."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque

from .._native import TxnID, TxnIdAllocator
from ..errors import (
    AlreadyClosed,
    CoordinatorUnavailable,
    CorruptEntry,
    InvalidTxnStatus,
    NotOwner,
    TooManyTransactions,
    TransactionNotFound,
)
from ..storage import WriteOp
from . import log
from .decision import TransactionEnd
from .meta import (
    ABORTED,
    ABORTING,
    COMMITTED,
    COMMITTING,
    HISTOGRAM_MS,
    OPEN,
    OUTCOME_PAGE,
    RESERVE_BLOCK,
    Outcomes,
    TxnMeta,
    status_error,
)
from .quiet import QuietCondition
from .state import CoordinatorStatus, EndReason, TxnState

_LOG = logging.getLogger("pulsartxn.txn")

__all__ = ["Coordinator", "TxnMeta", "status_error", "OPEN", "COMMITTED", "ABORTED"]


# What a late registration was for, in the words the clients use too ("cannot produce in ...").
_OP = {log.PARTITIONS: "produce in", log.SUBSCRIPTIONS: "acknowledge in"}


class Coordinator(TransactionEnd):
    def __init__(self, service, coordinator_id: int) -> None:
        self.service = service
        self.id = coordinator_id
        self.storage = service.storage
        self.db = self.storage.open_db(log.log_db_name(coordinator_id))
        self.outcomes_db = self.storage.open_db(log.OUTCOMES_DB)
        self._outcomes_from = 0  # no outcome is kept below this sequence (once pruned)
        # Never held while waiting for a write: the group commit's callbacks take it.
        self.lock = threading.Lock()
        self.cond = QuietCondition(self.lock)
        self._alloc_lock = threading.Lock()  # the allocator (its reservations write)
        self.txns: dict[int, TxnMeta] = {}
        self.finished = Outcomes()  # seq -> (state, reason, timeout_ms) once finished
        self._order: deque = deque()  # live sequences, ascending (for the low watermark)
        # The sequence after the last one in _order's keeping (under self.lock): the low
        # watermark when none is live. Not the allocator's: it moves before the new
        # transaction is live, and a watermark above a transaction about to begin ends it.
        self._next_live = 0
        self._deadlines: list = []  # heap of (deadline, seq)
        self.allocator: TxnIdAllocator | None = None
        self.reserved_ahead = 0  # a durable high-water mark written for it at open
        self.status = CoordinatorStatus.RECOVERING
        self.error: str | None = None
        self.created = self.committed = self.aborted = self.timed_out = 0
        self.finalize_retries = self.append_failures = 0
        self.log_appends = 0  # records put in its log (NEW, participants, END)
        self.histogram = [0] * (len(HISTOGRAM_MS) + 1)
        self.recovery: dict = {}

    # -- recovery --------------------------------------------------------------------------

    def recover(self, decided: dict, clean: bool = True) -> list[TxnMeta]:
        """Replay the log; return the transactions to finalize (COMMITTING/ABORTING, and OPEN
        ones now ABORTING: those whose deadline passed while the broker was down, and those of
        an in-process client, whose process is gone). `clean`: the broker was closed, not
        stopped; else the OPEN ones left are unverified (TxnMeta.unverified)."""
        start = time.monotonic()
        try:
            metas = self._replay()
            with self.storage.read() as lmdb_txn:
                raw = lmdb_txn.get(log.hwm_key(self.id), db=self.storage.meta)
                hwm = int.from_bytes(bytes(raw), "big") if raw is not None else 0
        except (CorruptEntry, ValueError) as exc:
            self.status = CoordinatorStatus.ERROR
            self.error = f"transaction log of coordinator {self.id} cannot be read: {exc}"
            self.recovery = {"recover_time_ms": (time.monotonic() - start) * 1000.0}
            return []
        # Sequences start at 1: TxnID 0:0 is all zeros, what an entry header without a
        # transaction holds.
        next_seq = max([hwm, 1] + [m.seq + 1 for m in metas])
        self.allocator = TxnIdAllocator(
            self.id, next_seq, block_size=RESERVE_BLOCK, reserve=self._reserve
        )
        self._next_live = next_seq
        now_wall = time.time() * 1000.0
        now = time.monotonic()
        to_finalize, expired, orphaned = [], 0, 0
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
                elif meta.owner == log.IN_PROCESS:
                    # Its client died with the broker's process: nobody can end it.
                    meta.state = ABORTING
                    meta.reason = EndReason.ORPHANED
                    orphaned += 1
                else:
                    meta.unverified = not clean
                    self._deadlines.append((meta.deadline, meta.seq))
            if meta.state is not OPEN:
                to_finalize.append(meta)
            self.txns[meta.seq] = meta
            self._order.append(meta.seq)
        heapq.heapify(self._deadlines)
        self.status = CoordinatorStatus.READY
        self.recovery = {
            "recover_time_ms": round((time.monotonic() - start) * 1000.0, 3),
            "recovered_txns": len(metas),
            "recovered_open": len(metas) - len(to_finalize),
            "recovered_finalizing": len(to_finalize) - expired - orphaned,
            "recovered_timed_out": expired,
            "recovered_orphaned": orphaned,
            "recovered_unverified": sum(m.unverified for m in metas),
        }
        return to_finalize

    def _replay(self) -> list[TxnMeta]:
        metas: dict[int, TxnMeta] = {}
        with self.storage.read() as lmdb_txn:
            for key, value in lmdb_txn.cursor(db=self.db):
                seq, index = log.split_key(bytes(key))
                rec = log.decode(value)
                meta = metas.get(seq)
                if index == 0:
                    if rec.kind != log.NEW or meta is not None:
                        raise CorruptEntry(f"transaction {self.id}:{seq} has no NEW record first")
                    meta = TxnMeta(
                        TxnID(self.id, seq),
                        seq,
                        rec.timeout_ms,
                        rec.open_ms,
                        0.0,
                        rec.group,
                        rec.owner,
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
        if mark <= self.reserved_ahead:
            return  # reserved (durably) with the other coordinators' first blocks at open
        key, value = log.hwm_key(self.id), mark.to_bytes(16, "big")
        self.storage.write(lambda lmdb_txn: lmdb_txn.put(key, value, db=self.storage.meta))

    # -- lookups ---------------------------------------------------------------------------

    def check_ready(self) -> None:
        if self.status is CoordinatorStatus.ELSEWHERE:
            raise NotOwner(f"transaction coordinator {self.id} is owned by another broker")
        if self.status is not CoordinatorStatus.READY:
            raise CoordinatorUnavailable(
                f"transaction coordinator {self.id} is {self.status.value}: {self.error}"
            )

    def live(self, seq: int, op: str) -> TxnMeta:
        """The live transaction, or the error for a finished or unknown one (lock held)."""
        meta = self.txns.get(seq)
        if meta is not None:
            return meta
        self.check_ready()
        done = self._outcome(seq)
        if done is not None:
            return _raise(status_error(TxnID(self.id, seq), done[0], done[1], done[2], op))
        raise TransactionNotFound(f"transaction {self.id}:{seq} is unknown to its coordinator")

    def _outcome(self, seq: int) -> tuple[TxnState, int, int] | None:
        """(state, reason, timeout_ms) of a finished transaction: remembered since this broker
        started, else as kept in the store (one that wrote anything, among the last
        log.OUTCOMES_KEPT sequences), else None."""
        done = self.finished.get(seq)
        if done is not None:
            return done
        if seq < self._outcomes_from:
            return None
        with self.storage.read() as lmdb_txn:
            raw = lmdb_txn.get(log.outcome_key(self.id, seq), db=self.outcomes_db)
        if raw is None:
            return None
        commit, reason, timeout_ms = log.decode_outcome(raw)
        return (COMMITTED if commit else ABORTED), reason, timeout_ms

    def prune_outcomes(self) -> None:
        """Let the kept outcomes of sequences older than the last log.OUTCOMES_KEPT go (in
        steps of a page of them, riding with a later write)."""
        allocator = self.allocator
        if allocator is None:
            return
        cut = allocator.next_sequence - log.OUTCOMES_KEPT
        if cut - self._outcomes_from < OUTCOME_PAGE:
            return
        start, self._outcomes_from = self._outcomes_from, cut
        db = self.outcomes_db
        first, end = log.outcome_key(self.id, start), log.outcome_key(self.id, cut)

        def apply(lmdb_txn) -> None:
            cursor = lmdb_txn.cursor(db=db)
            if not cursor.set_range(first):
                return
            while bytes(cursor.key()) < end:
                if not cursor.delete():
                    break

        try:
            self.storage.submit(WriteOp(apply, nbytes=0, durable=False), lazy=True)
        except AlreadyClosed:
            pass

    def check_open(self, seq: int, op: str) -> None:
        """Raise unless the transaction is OPEN (what a participant asks before it takes an
        operation of the transaction: an ended one's is refused, never parked)."""
        meta = self.txns.get(seq)  # a dict read: no lock on the participants' hot path
        if meta is not None and meta.state is OPEN:
            return
        with self.lock:
            meta = self.live(seq, op)
            if meta.state is not OPEN:
                raise status_error(meta.txn_id, meta.state, meta.reason, meta.timeout_ms, op)

    def fail(self, seq: int, exc: BaseException) -> None:
        """A send or an ack of the transaction failed: it can only abort now."""
        with self.lock:
            meta = self.txns.get(seq)
            if meta is not None and meta.state is OPEN and meta.failed is None:
                meta.failed = exc

    def state_of(self, seq: int) -> tuple[TxnState, int]:
        with self.lock:
            meta = self.txns.get(seq)
            if meta is not None:
                return meta.state, meta.reason
            done = self._outcome(seq)
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
        if len(order) > 2 * len(txns) + 64:
            # One long transaction in front holds the finished ones behind it: keep the
            # deque in proportion to the live ones (ascending, as it was).
            self._order = order = deque(s for s in order if s in txns)
        if order:
            return order[0]
        return self._next_live

    # -- operations ------------------------------------------------------------------------

    def new(self, timeout_ms: int, group: str | None, owner: str | None) -> TxnMeta:
        now = time.monotonic()
        open_ms = int(time.time() * 1000)
        # The allocator may write (a block reservation): under its own lock, not self.lock,
        # which the group commit's callbacks take. Held until the sequence is in _order, so
        # that _order stays ascending.
        staged = not self.service.durable_begin
        with self._alloc_lock:
            self._check_room()
            txn_id = self.allocator.next()
            seq = txn_id.sequence
            deadline = now + timeout_ms / 1000.0
            meta = TxnMeta(txn_id, seq, timeout_ms, open_ms, deadline, group, owner)
            if staged:
                # The record rides with the transaction's first write: until then there is
                # nothing a crash could leave half done (the sequence is reserved already).
                meta.new_record = log.StagedNew(seq, timeout_ms, open_ms, group, owner)
                meta.durable = True
            with self.lock:
                self.finished.begun(seq)
                self.txns[seq] = meta
                self._order.append(seq)
                self._next_live = seq + 1
                heapq.heappush(self._deadlines, (deadline, seq))
                if staged:
                    self.created += 1
                    self.log_appends += 1  # rides with the transaction's first write
        if staged:
            return meta
        record = log.encode_new(timeout_ms, open_ms, group, owner)
        key = log.record_key(seq, 0)
        try:
            self._write(lambda t: t.put(key, record, db=self.db), len(record))
        except BaseException:
            with self.lock:
                self.txns.pop(seq, None)
            raise
        with self.lock:
            meta.durable = True
            self.created += 1
            self.log_appends += 1
        return meta

    def _check_room(self) -> None:
        """Under _alloc_lock: only new() adds live transactions, so the count read here can
        only have gone down by the time this one is added (no need for self.lock)."""
        if self.status is not CoordinatorStatus.READY:
            self.check_ready()
        limit = self.service.max_active
        if len(self.txns) >= limit:
            raise TooManyTransactions(
                f"coordinator {self.id} has {len(self.txns)} live transactions "
                f"(max_active_txns_per_coordinator={limit}); end some first"
            )

    def add(self, seq: int, kind: int, names: list) -> None:
        """Log partitions (kind PARTITIONS) or subscriptions the transaction touches."""
        op = _OP[kind]
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
            # Durable by the transaction's decision, whose flush covers it.
            self._write(apply, 64 * len(new), durable=False)
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
        op = _OP[kind]
        with self.lock:
            meta = self.live(seq, op)
            if meta.state is not OPEN:
                raise status_error(meta.txn_id, meta.state, meta.reason, meta.timeout_ms, op)
            index = meta.records
            meta.records += 1
            self.log_appends += 1
            (meta.partitions if kind == log.PARTITIONS else meta.subscriptions).update(names)
            if inflight:
                meta.inflight += 1
            first = meta.new_record
        record = log.encode_names(kind, list(names))
        key = log.record_key(seq, index)
        db = self.db

        def apply(lmdb_txn) -> None:
            if meta.atomic_end or meta.deleted:
                # Its end is in this write (every participant's part), or its records are
                # deleted already: a record now would outlive the transaction.
                return
            if first is not None:
                lmdb_txn.put(first.key, first.value, db=db)  # the same bytes whoever writes it
            lmdb_txn.put(key, record, db=db)

        def done(landed: bool) -> None:
            with self.lock:
                if landed and first is not None and meta.new_record is first:
                    meta.new_record = None
                if inflight:
                    meta.inflight -= 1
                    if meta.inflight == 0:
                        self.cond.notify_all()

        return apply, done

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
        meta = self.txns.get(seq)
        try:
            self.end(seq, False, EndReason.TIMEOUT)
        except (InvalidTxnStatus, TransactionNotFound, AlreadyClosed, CoordinatorUnavailable):
            return  # ended meanwhile, or the broker is closing
        if meta is not None:
            _LOG.info(
                "transaction %s timed out: aborted %.0f ms after it began (timeout %d ms)",
                meta.txn_id,
                time.time() * 1000.0 - meta.open_ms,
                meta.timeout_ms,
            )

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
                "state": self.status.value,
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
                "log_appends": self.log_appends,
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


def _raise(exc):
    raise exc
