"""The log of a subscription's pending acks (database ``pendingack``; Pulsar #19084): acks
written in batches, made durable before a commit is decided, replayed on open. Part of
:class:`pulsartxn.txn.pending_ack.PendingAck`."""

from __future__ import annotations

import logging
import struct
import time

from .._native import AckSet, TxnID, crc32c
from ..errors import CorruptEntry, InvalidTxnStatus
from ..storage import WriteOp
from .meta import abort_only

_LOG = logging.getLogger("pulsartxn.pendingack")

_ACK = struct.Struct("<BqiI")  # kind (0 individual, 1 cumulative), entry, batch index, size
_U32 = struct.Struct("<I")
DB = b"pendingack"


class PendingAckLog:
    """Writing, replaying and deleting the log of ``PendingAck`` (which holds what it logs)."""

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

    def delete_log(self, lmdb_txn) -> None:
        """Delete every record of this subscription's log, in the caller's write `txn` (an
        unsubscribe: a new subscription of the name replays none of them)."""
        cursor = lmdb_txn.cursor(db=self.storage.open_db(DB))
        cursor.set_range(self._prefix)
        key = bytes(cursor.key())
        while key.startswith(self._prefix):
            cursor.delete()
            key = bytes(cursor.key())


def _nothing(lmdb_txn) -> None:
    return None
