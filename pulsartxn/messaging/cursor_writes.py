"""A subscription's cursor writes: acknowledgements grouped into one lazy write per flush
interval, each record carrying the acks of the commits being written with it."""

from __future__ import annotations

import time

from ..storage import WriteOp


class CursorWrites:
    """Mixed into Subscription, whose attributes it uses: lock, cursor, key, partition,
    committing, riders, unsubscribed, durable, _persist_queued, _persist_requested,
    _last_persist."""

    def _persist(self) -> None:
        """Persist the cursor soon: acks within one flush interval share one write, as
        Pulsar's clients group acknowledgements (plain acks are asynchronous there too)."""
        if self._persist_queued or not self.durable:
            return
        self._persist_queued = True
        self._persist_requested = time.monotonic()
        flusher = self.partition.broker_flusher
        flusher.watch(self, self._persist_requested + flusher.delay)

    def flush_if_older(self, seconds: float) -> bool:
        """Called by the broker's flusher: write the cursor once the interval has passed."""
        with self.lock:
            if not self._persist_queued:
                return True
            if time.monotonic() - self._persist_requested < seconds:
                return False
        self._write_cursor()
        return True

    def cursor_record(self) -> bytes:
        """The cursor's record as a write made now must hold it (lock held): the cursor,
        with the acks of the commits being written (``committing``) applied."""
        committing = self.committing
        return self.cursor.serialize(tuple(committing.values()) if committing else ())

    def ride(self, write) -> None:
        """``write(lmdb_txn)`` goes with every cursor record written from now on until one of
        them has landed (lock held): in the write that makes the cursor's present state
        durable, or an earlier one (a once-call's row, messaging/once.py)."""
        self.riders.append(write)

    def _write_cursor(self):
        storage = self.partition.storage
        db = storage.open_db(b"cursors")
        carried: list = []

        def apply(lmdb_txn):
            with self.lock:
                self._persist_queued = False
                data = None if self.unsubscribed else self.cursor_record()
                carried[:] = self.riders
            if data is not None:
                lmdb_txn.put(self.key, data, db=db)
            for write in carried:
                write(lmdb_txn)

        def landed(_result):
            if carried:
                with self.lock:
                    self.riders = [w for w in self.riders if w not in carried]

        op = WriteOp(apply, nbytes=64, on_commit=landed)
        self._last_persist = storage.submit(op, lazy=True)
        return self._last_persist

    def wait_persisted(self) -> None:
        """Write any acknowledgement not yet persisted and wait until it is durable."""
        with self.lock:
            queued = self._persist_queued
        fut = self._write_cursor() if queued else self._last_persist
        if fut is not None:
            if not fut.done():
                self.partition.storage.commits.flush_lazy()
            fut.result()
