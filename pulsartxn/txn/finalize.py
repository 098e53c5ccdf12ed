"""Finalize a decided transaction: every participant is told the outcome with the low
watermark, retried with backoff until it succeeds (a repeated call is a success); one failing
participant does not hold back the others. The transaction is COMMITTED or ABORTED once all
have answered; its records are deleted once their deferred writes have landed, so a crash
before that finalizes it again."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from typing import TYPE_CHECKING

from ..errors import AlreadyClosed
from ..storage import WriteOp
from . import log
from .meta import ABORTED, COMMITTED, HISTOGRAM_MS, MAX_BACKOFF_S, TxnMeta
from .participant import SUBSCRIPTION
from .state import EndReason

_LOG = logging.getLogger("pulsartxn.txn")


def retry_logged(meta: TxnMeta, part, exc: BaseException) -> None:
    """A participant failed its part of an end, retried: a WARNING at the 1st, 2nd, 4th, 8th...
    failure of the transaction, so a stuck participant does not flood the log."""
    n = meta.retries
    if n & (n - 1) == 0:
        _LOG.warning(
            "finalize of transaction %s (%s) failed at %s %s, attempt %d; retrying: %r",
            meta.txn_id,
            "commit" if meta.commit else "abort",
            part[0],
            part[1],
            n,
            exc,
        )


if TYPE_CHECKING:
    from ..storage import Storage
    from .coordinators import Coordinators
    from .meta import Outcomes


class Finalize:
    """Tell a decided transaction's participants its outcome (a Coordinator is one: what it
    uses of the coordinator is declared here, Coordinator defines it)."""

    id: int
    lock: threading.Lock
    cond: threading.Condition
    storage: Storage
    db: object  # the coordinator's log database
    service: Coordinators
    txns: dict[int, TxnMeta]
    finished: Outcomes
    _deadlines: list
    committed: int
    aborted: int
    timed_out: int
    finalize_retries: int
    append_failures: int
    log_appends: int
    histogram: list[int]

    def _lwm(self) -> int:
        """The low watermark (lock held)."""
        raise NotImplementedError

    def _delete_records(self, meta: TxnMeta, count: int):
        """Apply function deleting the transaction's first `count` records and keeping its
        outcome (log.OUTCOMES_DB) in their place; from then on a registration applied
        (later, in the group commit's order) writes nothing."""
        db, outcomes = self.db, self.outcomes_db
        keys = [log.record_key(meta.seq, i) for i in range(count)]
        key = log.outcome_key(self.id, meta.seq)
        outcome = log.encode_outcome(meta.commit, meta.reason, meta.timeout_ms)

        def apply(lmdb_txn):
            for k in keys:
                lmdb_txn.delete(k, db=db)
            lmdb_txn.put(key, outcome, db=outcomes)
            meta.deleted = True

        return apply

    def _delete_op(self, meta: TxnMeta, count: int, durable: bool = True) -> WriteOp:
        def on_abort() -> None:
            meta.deleted = False

        return WriteOp(
            self._delete_records(meta, count), nbytes=16, on_abort=on_abort, durable=durable
        )

    def finalize(self, meta: TxnMeta, done=()) -> None:
        """Tell every participant the outcome (but those in `done`, whose part was written
        with the decision); retry failures with backoff until they succeed. One failing
        participant does not hold back the others."""
        with self.lock:
            if len(done) == len(meta.partitions) + len(meta.subscriptions):
                parts = []  # every part was in the decision's write (done holds only those)
            else:
                parts = [p for p in meta.participants() if p not in done]
            meta.pending = set(parts)
        if not parts:
            self._complete(meta)
            return
        deferred, waiting = [], []
        for part in parts:
            try:
                participant, here = self.service.participants.find(*part)
            except Exception:  # noqa: BLE001 - _call retries it
                participant, here = None, False
            if here and part[0] == SUBSCRIPTION:
                deferred.append((part, participant))
            else:
                waiting.append(part)
        # Participants that write synchronously are told at once (all but one on the pool):
        # their writes (markers, cursors) then share one group commit instead of one fsync
        # after the other. Those that defer their write are quick: told here.
        for part in waiting[1:]:
            self.service.timer.submit(self._call, meta, part, 0)
        for part, participant in deferred:
            self._call(meta, part, 0, participant)
        if waiting:
            self._call(meta, waiting[0], 0)

    def _call(self, meta: TxnMeta, part, attempt: int, participant=None) -> None:
        """Tell one participant the outcome (`participant`: just looked up, else looked up
        here, as every retry does)."""
        service = self.service
        if service.closed:
            return  # recovery finishes it after a restart
        write = None
        try:
            with self.lock:
                lwm = self._lwm()
            here = participant is not None
            if participant is None:
                participant, here = service.participants.find(*part)
            if here and part[0] == SUBSCRIPTION:
                # The decision is durable: a pending ack's write may ride with the next
                # group; the records stay until it has landed (_complete).
                write = participant.end_later(meta.txn_id, meta.commit, lwm)
            else:
                participant.end_txn(meta.txn_id, meta.commit, lwm)
        except Exception as exc:  # noqa: BLE001 - retried until it succeeds
            with self.lock:
                meta.retries += 1
                meta.last_error = f"{part[0]} {part[1]}: {exc!r}"
                self.finalize_retries += 1
                self.cond.notify_all()  # a commit waiting for it returns (wait_settled)
            retry_logged(meta, part, exc)
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
        elif len(writes) == 1:
            writes[0].add_done_callback(lambda fut: self._landed(meta, fut.exception()))
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
                if last:
                    self._landed(meta, failed[0] if failed else None)

            for fut in writes:
                fut.add_done_callback(landed)
        self._finished(meta)

    def _landed(self, meta: TxnMeta, error: BaseException | None) -> None:
        """The participants' deferred writes have all landed (`error`: the first that
        failed)."""
        if error is None:
            self._cleanup(meta)
        else:
            # The records stay: after a restart, recovery finalizes it again.
            meta.last_error = f"a participant's write failed: {error!r}"
            self.append_failures += 1

    def _cleanup(self, meta: TxnMeta) -> None:
        storage = self.storage
        if meta.records and not storage.closed:
            try:
                storage.submit(
                    self._delete_op(meta, meta.records, durable=False),
                    lazy=True,
                )
            except AlreadyClosed:
                pass  # recovery finalizes it again (participants treat that as success)
        self.service.groups.release(meta)

    def _finished(self, meta: TxnMeta) -> None:
        elapsed_ms = (time.monotonic() - meta.started) * 1000.0
        with self.lock:
            commit = meta.commit
            meta.state = COMMITTED if commit else ABORTED
            self.txns.pop(meta.seq, None)
            self.finished.finished(meta.seq, meta.state, meta.reason, meta.timeout_ms)
            if commit:
                self.committed += 1
            else:
                self.aborted += 1
                if meta.reason == EndReason.TIMEOUT:
                    self.timed_out += 1
            self.histogram[bisect.bisect_left(HISTOGRAM_MS, elapsed_ms)] += 1
            self.cond.notify_all()
        self.service.groups.left(meta)

    def wait_settled(self, meta: TxnMeta, deadline: float | None) -> bool:
        """Until the transaction is COMMITTED or ABORTED, or one of its participants has
        failed its part (retried in the background from then on); False at the deadline."""
        state = meta.state
        if state is COMMITTED or state is ABORTED:
            return True  # the usual case: the end finished in the caller's thread
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        with self.lock:
            return self.cond.wait_for(
                lambda: meta.state in (COMMITTED, ABORTED) or meta.retries or self.service.closed,
                timeout,
            )

    def wait(self, meta: TxnMeta, timeout_s: float | None) -> bool:
        """Wait until the transaction is COMMITTED or ABORTED; False on timeout."""
        with self.lock:
            if meta.state is COMMITTED or meta.state is ABORTED:
                return True  # the usual case: the end finished in the caller's thread
            return self.cond.wait_for(
                lambda: meta.state in (COMMITTED, ABORTED) or self.service.closed, timeout_s
            ) and meta.state in (COMMITTED, ABORTED)
