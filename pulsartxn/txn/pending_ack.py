"""Pending acknowledgements of a subscription (Pulsar's PendingAckHandle): an ack in a
transaction holds the message for it until it ends (conflicting acks are refused and change
nothing); commit applies the held acks to the cursor, abort releases them. Logged in batches
(database ``pendingack``; Pulsar #19084), made durable before a commit is decided, deleted by
the end's own write: replay after a crash is exact. The log is
:mod:`pulsartxn.txn.pending_ack_log`."""

from __future__ import annotations

import time

from .._native import AckSet, PendingAckIndex, TxnID
from ..errors import AlreadyClosed, InvalidConfiguration, TransactionConflict
from ..storage import WriteOp
from .ack_conflicts import check_cumulative, check_individual, check_plain_cumulative
from .pending_ack_log import _ACK, _U32, DB, PendingAckLog
from .watermark import BySequence


class PendingAck(PendingAckLog):
    """A subscription's pending acks: its transactions' acks, logged, until they end (the
    participant.PendingAckHandle contract)."""

    def __init__(self, sub) -> None:
        self.sub = sub
        self.lock = sub.lock
        self.index = PendingAckIndex()
        self.cumulative: dict[TxnID, tuple[int, int, int]] = {}  # txn -> (entry, bi, size)
        self.unlogged: dict[TxnID, list[bytes]] = {}  # acks not yet in the log
        # The coordinator's record that names this subscription for a transaction: it rides
        # in the write of the transaction's first acks here (Coordinator.stage).
        self.registrations: dict[TxnID, list] = {}
        self.records: dict[TxnID, int] = {}  # records in the log per transaction
        # Acks accepted per transaction (after a restart: those that reached the log). A
        # commit states how many it made; fewer here means some were lost with the broker.
        self.counts: dict[TxnID, int] = {}
        # The transactions holding acks here by sequence: an end finds those below the low
        # watermark without looking at every open transaction.
        self._by_sequence = BySequence()
        self.acks = 0
        self.committed = 0
        self.aborted = 0
        self.log_writes = 0
        self._flush_queued = False
        self._queued_at = 0.0
        self._prefix = sub.key + b"\0"

    @property
    def storage(self):
        return self.sub.partition.storage

    # -- holding ---------------------------------------------------------------------------

    def holds(self, entry_id: int, batch_index: int) -> bool:
        """Is this message held by a transaction (lock held)?"""
        if self.cumulative:
            for e, bi, size in self.cumulative.values():
                if entry_id < e or (entry_id == e and (bi < 0 or size <= 1 or batch_index <= bi)):
                    return True
        if not len(self.index):
            return False
        return self.index.is_pending(self.sub.partition.ledger_id, entry_id, batch_index)

    def check_plain_ack(self, entry_id: int, batch_index: int, cumulative: bool) -> None:
        """A plain ack of a held message is refused (lock held)."""
        if self.holds(entry_id, batch_index):
            raise TransactionConflict(
                f"entry {entry_id} batch index {batch_index} on {self.sub.partition.topic} is "
                "held by a transaction's pending acknowledgement"
            )
        if cumulative and (len(self.index) or self.cumulative):
            check_plain_cumulative(self.index, self.cumulative, entry_id)

    def ack(
        self,
        txn_id: TxnID,
        entry_id: int,
        batch_index: int,
        batch_size: int,
        cumulative: bool,
        registration=None,
    ) -> None:
        sub = self.sub
        ledger = sub.partition.ledger_id
        check = sub.partition.buffer.txn_check
        with self.lock:
            if sub.unsubscribed:
                raise AlreadyClosed(
                    f"subscription {sub.name!r} on {sub.partition.topic} was unsubscribed: "
                    "its messages can no longer be acknowledged"
                )
            if check is not None:
                check(txn_id, "acknowledge in")  # an ended transaction's ack is refused
            cursor = sub.cursor
            if cursor.is_acked(entry_id, batch_index):
                raise TransactionConflict(
                    f"entry {entry_id} batch index {batch_index} on {sub.partition.topic} is "
                    f"already acknowledged on subscription {sub.name}"
                )
            if sub.dead_lettering(entry_id, batch_index):
                raise TransactionConflict(
                    f"entry {entry_id} batch index {batch_index} on {sub.partition.topic} is "
                    f"being moved to its dead letter topic from subscription {sub.name}"
                )
            batched = batch_index >= 0 and batch_size > 1
            if cumulative:
                if sub.type not in (0, 2, None):
                    raise InvalidConfiguration(
                        "cumulative acknowledgement in a transaction needs an Exclusive or "
                        f"Failover subscription, not {sub.name}'s"
                    )
                check_cumulative(self.index, self.cumulative, txn_id, entry_id, sub.name)
                prev = self.cumulative.get(txn_id)
                if prev is None or (entry_id, batch_index) > prev[:2]:
                    self.cumulative[txn_id] = (entry_id, batch_index, batch_size)
                kind = 1
            else:
                check_individual(self.cumulative, txn_id, entry_id, batch_index)
                ack_set = None
                if batched:
                    ack_set = AckSet(batch_size)
                    ack_set.set(batch_index)
                self.index.add(ledger, entry_id, txn_id, ack_set)  # raises TransactionConflict
                kind = 0
            sub.hold(entry_id, batch_index)
            self.unlogged.setdefault(txn_id, []).append(
                _ACK.pack(kind, entry_id, batch_index, batch_size)
            )
            if registration is not None:
                self.registrations.setdefault(txn_id, []).append(registration)
            self.acks += 1
            if txn_id not in self.counts:
                self._by_sequence.add(txn_id)
            self.counts[txn_id] = self.counts.get(txn_id, 0) + 1
            queue = not self._flush_queued
            if queue:
                self._flush_queued = True
                self._queued_at = time.monotonic()
        if queue:
            flusher = sub.partition.broker_flusher
            flusher.watch(self, self._queued_at + flusher.delay)

    # -- ending ----------------------------------------------------------------------------

    def end_op(self, txn_id: TxnID, commit: bool, low_watermark: int, expected: int | None = None):
        """txn's end here as part of its coordinator's one-write end (every participant's part
        in one LMDB transaction, no decision record): a commit writes the cursor with txn's
        acks applied; either way txn's logged acks are deleted. What is only in memory
        (release, redelivery, the transactions below the low watermark) follows once the
        write has landed (``end_txn``), and so do the cursor's acks: until then the records of
        this cursor carry them (``Subscription.committing``). A write that does not land
        gives the acks not yet logged back; the cursor never changed. None when this
        subscription cannot take part (a damaged log: it is finalized the logged way, retried
        until it is repaired)."""
        sub = self.sub
        if sub.error is not None:
            return None
        if commit:
            with self.lock:
                self._check_count(txn_id, expected)
        storage = self.storage
        db, cursors = storage.open_db(DB), storage.open_db(b"cursors")
        sub_key = sub.key
        undo: dict = {}

        def apply(t) -> None:
            with self.lock:
                # Never logged now: the write that would have logged them (and the
                # subscription's registration riding in it) is this one.
                undo["acks"] = (
                    self.unlogged.pop(txn_id, None),
                    self.registrations.pop(txn_id, None),
                )
                n = self.records.get(txn_id, 0)
                if commit:
                    # The cursor changes once this write has landed (end_txn); the record
                    # written here, and any written after it meanwhile, hold txn's acks.
                    sub.committing[txn_id] = (
                        list(self.index.entries_of(txn_id)),
                        self.cumulative.get(txn_id),
                    )
                    t.put(sub_key, sub.cursor_record(), db=cursors)
            for i in range(n):
                t.delete(self._prefix + txn_id.pack() + _U32.pack(i), db=db)

        def on_abort() -> None:
            with self.lock:
                sub.committing.pop(txn_id, None)
                acks, regs = undo.pop("acks", (None, None))
                if acks:
                    self.unlogged[txn_id] = acks + self.unlogged.get(txn_id, [])
                if regs:
                    self.registrations[txn_id] = regs + self.registrations.get(txn_id, [])

        def on_commit(_) -> None:
            with self.lock:
                # Deleted by this write; and a log write of its acks still on its way (taken
                # by the flusher) leaves them out (_rows_op), whatever happens below.
                self.records.pop(txn_id, None)
            try:
                # txn's acks reach the cursor (already written: `committing` gives way to
                # them under the same lock) and its messages are forgotten; the transactions
                # below the low watermark end too, with a write of their own if they need one.
                self.end_txn(txn_id, commit, low_watermark, wait=False, written=True)
            finally:
                with self.lock:
                    sub.committing.pop(txn_id, None)

        return WriteOp(apply, nbytes=256, on_commit=on_commit, on_abort=on_abort)

    def end_later(self, txn_id: TxnID, commit: bool, low_watermark: int):
        """``end_txn`` whose write rides with the next group commit: its future, or None."""
        return self.end_txn(txn_id, commit, low_watermark, wait=False)

    def end_txn(
        self,
        txn_id: TxnID,
        commit: bool,
        low_watermark: int,
        wait: bool = True,
        written: bool = False,
    ):
        """Commit (acks to the cursor) or abort (release, redeliver) txn_id here; abort what
        the low watermark says has finished. Idempotent.

        With wait=False the write (cursor, cleanup) rides with the next group commit and its
        future is returned (None when there is nothing to write): for a caller whose decision
        is already durable, so that a crash before it lands only means doing it again.
        `written`: txn's part is in LMDB already (end_op): only the others need a write."""
        sub = self.sub
        if sub.error is not None:  # a damaged log: retried until it is repaired
            raise sub.error
        with self.lock:
            todo = [(txn_id, commit)] + [(t, False) for t in self._below(txn_id, low_watermark)]
            changed = False
            released = []
            keys = []
            for t, c in todo:
                entries = self.index.release(t)
                cum = self.cumulative.pop(t, None)
                self.unlogged.pop(t, None)
                self.registrations.pop(t, None)
                self.counts.pop(t, None)
                n_records = self.records.pop(t, 0)
                keys.extend(self._prefix + t.pack() + _U32.pack(i) for i in range(n_records))
                if not entries and cum is None:
                    continue
                if c:
                    self.committed += 1
                    acked = _ack_cursor(sub.cursor, entries, cum)
                    changed |= acked and not (written and t == txn_id)
                    sub.forget_acked(cum, entries)
                else:
                    self.aborted += 1
                    released.extend(entries)
                    if cum is not None:
                        released.append((None, -1, None))
            if written:
                sub.committing.pop(txn_id, None)  # in the cursor itself now
            if released:
                sub.release_held(released)
            if not self.unlogged:
                self._flush_queued = False
        if not changed and not keys:
            if released:
                sub.notify()
            return None
        storage = self.storage
        db, cursors = storage.open_db(DB), storage.open_db(b"cursors")
        sub_key = sub.key

        def apply(t):
            if changed:
                # Serialized when applied, as every cursor write is: the latest state wins
                # whatever order concurrent cursor writes are applied in.
                with sub.lock:
                    data = None if sub.unsubscribed else sub.cursor_record()
                if data is not None:
                    t.put(sub_key, data, db=cursors)
            for k in keys:
                t.delete(k, db=db)

        fut = None
        if wait:
            storage.write(apply, nbytes=64 + 32 * len(keys))
        else:
            op = WriteOp(apply, nbytes=64 + 32 * len(keys), durable=False)
            fut = storage.submit(op, lazy=True)
        if released:
            sub.notify()
        return fut

    def advance(self, coordinator_id: int, low_watermark: int) -> None:
        """The low watermark of a coordinator, pushed by its timer: transactions of it below
        the watermark that still hold acks here have ended at the coordinator without their
        end reaching this subscription; they end here as aborted (their acks released)."""
        if self.sub.error is not None:
            return
        with self.lock:
            found = self._by_sequence.below(coordinator_id, low_watermark)
            left = [t for t in found if t in self.counts]
            for t in left:
                self._by_sequence.add(t)  # end_txn takes them out again, all at once
            self._by_sequence.compact(self.counts)
        if left:
            self.end_txn(left[0], False, low_watermark, wait=False)

    def _below(self, txn_id: TxnID, low_watermark: int) -> list:
        """The other transactions of txn's coordinator below its low watermark that still
        hold acks here: the coordinator has finished them, so they end here as aborted
        (lock held; they and txn leave at once, so none goes back)."""
        found = self._by_sequence.below(txn_id.coordinator_id, low_watermark)
        out = [t for t in found if t != txn_id and t in self.counts]
        self._by_sequence.compact(self.counts)
        return out

    # -- views -----------------------------------------------------------------------------

    def transactions(self) -> set:
        with self.lock:
            return set(self.index.transactions()) | set(self.cumulative)

    def stats(self) -> dict:
        with self.lock:
            txns = set(self.index.transactions()) | set(self.cumulative)
            return {
                "ongoing_txn_size": len(txns),
                "pending_ack_entries": len(self.index),
                "cumulative_holds": len(self.cumulative),
                "acks": self.acks,
                "committed": self.committed,
                "aborted": self.aborted,
                "log_records": sum(self.records.values()),
                "log_writes": self.log_writes,
                "unlogged_acks": sum(len(v) for v in self.unlogged.values()),
            }


def _ack_cursor(cursor, entries, cumulative) -> bool:
    """Apply a transaction's pending acks (its held entries and its cumulative ack, if any)
    to `cursor`, subscription lock held; whether it changed. Applying them again changes
    nothing."""
    changed = False
    for _, entry_id, ack_set in entries:
        if ack_set is None:
            changed |= cursor.ack(entry_id)
        else:
            changed |= cursor.ack_set(entry_id, ack_set)
    if cumulative is not None:
        changed |= cursor.ack_cumulative(*cumulative)
    return changed
