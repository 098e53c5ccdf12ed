"""Pending acknowledgements of a subscription (Pulsar's PendingAckHandle): an ack in a
transaction holds the message for it until it ends (conflicting acks are refused and change
nothing); commit applies the held acks to the cursor, abort releases them. Logged in batches
(database ``pendingack``; Pulsar #19084), made durable before a commit is decided, deleted by
the end's own write: replay after a crash is exact."""

from __future__ import annotations

import logging
import struct
import time

from .._native import AckSet, PendingAckIndex, TxnID, crc32c
from ..errors import (
    AlreadyClosed,
    CorruptEntry,
    InvalidConfiguration,
    InvalidTxnStatus,
    TransactionConflict,
)
from ..storage import WriteOp
from .ack_conflicts import check_cumulative, check_individual, check_plain_cumulative
from .meta import abort_only
from .watermark import BySequence

_LOG = logging.getLogger("pulsartxn.pendingack")

_ACK = struct.Struct("<BqiI")  # kind (0 individual, 1 cumulative), entry, batch index, size
_U32 = struct.Struct("<I")
DB = b"pendingack"


class PendingAck:
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

    # -- the log ---------------------------------------------------------------------------

    def _take_unlogged(self, only: TxnID | None = None) -> tuple[list, list]:
        """(rows, registrations) not yet in the log, of `only` or of every transaction; a row
        is (txn, key, value), a registration (txn, apply)."""
        rows, regs = [], []
        for txn_id in [only] if only is not None else list(self.unlogged):
            acks = self.unlogged.pop(txn_id, None)
            regs.extend((txn_id, r) for r in self.registrations.pop(txn_id, ()))
            if not acks:
                continue
            n = self.records.get(txn_id, 0)
            self.records[txn_id] = n + 1
            body = txn_id.pack() + b"".join(acks)
            key = self._prefix + txn_id.pack() + _U32.pack(n)
            rows.append((txn_id, key, _U32.pack(crc32c(body)) + body))
        if not self.unlogged:
            self._flush_queued = False
        return rows, regs

    def _rows_op(self, rows, regs) -> WriteOp:
        """The log write of `rows` and `regs` (taken from the unlogged ones): if it does not
        land, they wait here to be logged again, ahead of anything newer (their record
        numbers stay unused; replay and cleanup go by the highest number, not the count)."""
        db = self.storage.open_db(DB)

        def apply(lmdb_txn):
            with self.lock:
                # Not the rows of a transaction that has ended here meanwhile: its end
                # deleted what it had logged, in a write this one comes after.
                live = [(k, v) for t, k, v in rows if t in self.counts]
            for _, registration in regs:
                registration(lmdb_txn)
            lmdb_txn.cursor(db=db).putmulti(live)

        def restore(fut) -> None:
            if fut.exception() is None:
                return
            with self.lock:
                for t, _, v in rows:
                    if t not in self.counts:
                        continue  # ended meanwhile
                    body = bytes(v)[20:]
                    acks = [body[i : i + _ACK.size] for i in range(0, len(body), _ACK.size)]
                    self.unlogged[t] = acks + self.unlogged.get(t, [])
                for t, reg in reversed(regs):
                    self.registrations[t] = [reg] + self.registrations.get(t, [])

        self.log_writes += 1
        # Durable by the commit, whose prepare or one-write end comes after it.
        op = WriteOp(
            apply,
            nbytes=sum(len(v) for _, _, v in rows),
            records=len(rows),
            durable=False,
        )
        op.future.add_done_callback(restore)
        return op

    def _write_rows(self, taken, wait: bool) -> None:
        rows, regs = taken
        if not rows and not regs:
            return
        storage = self.storage
        fut = storage.submit(self._rows_op(rows, regs), lazy=not wait)
        if wait:
            storage.wait(fut)

    def flush_if_older(self, seconds: float) -> bool:
        """The broker's flusher: write the waiting acks once they are `seconds` old. Taken
        and queued under the lock: a commit, which takes what is left under it, queues its
        write after this one, so its decision never lands before these acks."""
        with self.lock:
            if not self._flush_queued:
                return True
            if time.monotonic() - self._queued_at < seconds:
                return False
            self._write_rows(self._take_unlogged(), wait=False)
        return True

    def store(self, txn_id: TxnID) -> None:
        """Write txn's acks not yet in the log and wait until they are stored (not flushed:
        the commit's flush covers them): a network session's acks, answered only then, so
        that they outlive this process, as its transaction does."""
        with self.lock:
            taken = self._take_unlogged(txn_id)
        if taken[0] or taken[1]:
            self._write_rows(taken, wait=True)
        else:  # the flusher took them: its write (a lazy op) lands with this one
            self.storage.write(_nothing, nbytes=0, records=0, durable=False)

    def prepare(self, txn_id: TxnID, expected: int | None = None) -> None:
        """Before a commit is decided: this transaction's acks are durable in the log, and
        there are as many as the committer made (acks are answered before they are logged,
        so a broker restart in between loses them: then the transaction can only abort)."""
        with self.lock:
            self._check_count(txn_id, expected)
            taken = self._take_unlogged(txn_id)
        self._write_rows(taken, wait=True)

    def _check_count(self, txn_id: TxnID, expected: int | None) -> None:
        """Lock held: raise unless this holds every ack the committer made."""
        have = self.counts.get(txn_id, 0)
        if expected is not None and have < expected:
            raise abort_only(
                InvalidTxnStatus(
                    f"transaction {txn_id}: {expected - have} of its {expected} acknowledgements "
                    f"on {self.sub.partition.topic} {self.sub.name} were lost when its broker "
                    "stopped"
                )
            )

    def prepare_op(self, txn_id: TxnID, expected: int | None = None) -> WriteOp | None:
        """``prepare`` as an operation for the caller to write with its commit decision (one
        LMDB transaction): if that write fails, the acks wait here to be logged again."""
        with self.lock:
            self._check_count(txn_id, expected)
            rows, regs = self._take_unlogged(txn_id)
        if not rows and not regs:
            return None
        return self._rows_op(rows, regs)

    def flush(self) -> None:
        with self.lock:
            taken = self._take_unlogged()
        self._write_rows(taken, wait=True)

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

    # -- recovery and views ----------------------------------------------------------------

    def replay(self) -> None:
        """Rebuild the pending acks of live transactions from the log (on open)."""
        storage = self.storage
        db = storage.open_db(DB)
        ledger = self.sub.partition.ledger_id
        began = time.monotonic()
        with storage.read() as lmdb_txn:
            cursor = lmdb_txn.cursor(db=db)
            if not cursor.set_range(self._prefix):
                return
            records = 0
            for key, value in cursor:
                key = bytes(key)
                if not key.startswith(self._prefix):
                    break
                raw = bytes(value)
                if len(raw) < 20 or _U32.unpack_from(raw)[0] != crc32c(raw[4:]):
                    raise CorruptEntry(f"pending-ack record {key!r} fails its checksum")
                t = TxnID.unpack(raw[4:20])
                records += 1
                number = _U32.unpack_from(key, len(key) - 4)[0]
                self.records[t] = max(self.records.get(t, 0), number + 1)
                for off in range(20, len(raw), _ACK.size):
                    kind, entry_id, bi, size = _ACK.unpack_from(raw, off)
                    if t not in self.counts:
                        self._by_sequence.add(t)
                    self.counts[t] = self.counts.get(t, 0) + 1
                    if kind == 1:
                        prev = self.cumulative.get(t)
                        if prev is None or (entry_id, bi) > prev[:2]:
                            self.cumulative[t] = (entry_id, bi, size)
                    else:
                        ack_set = None
                        if bi >= 0 and size > 1:
                            ack_set = AckSet(size)
                            ack_set.set(bi)
                        self.index.add(ledger, entry_id, t, ack_set)
        if records:
            _LOG.info(
                "pending acks of %s on %s replayed in %.1f ms: %d records, %d acks of %d "
                "transactions",
                self.sub.name,
                self.sub.partition.topic,
                (time.monotonic() - began) * 1000.0,
                records,
                sum(self.counts.values()),
                len(self.counts),
            )

    def transactions(self) -> set:
        with self.lock:
            return set(self.index.transactions()) | set(self.cumulative)

    def delete_log(self, lmdb_txn) -> None:
        """Delete every record of this subscription's log, in the caller's write `txn` (an
        unsubscribe: a new subscription of the name replays none of them)."""
        cursor = lmdb_txn.cursor(db=self.storage.open_db(DB))
        cursor.set_range(self._prefix)
        key = bytes(cursor.key())
        while key.startswith(self._prefix):
            cursor.delete()
            key = bytes(cursor.key())

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


def _nothing(lmdb_txn) -> None:
    return None


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
