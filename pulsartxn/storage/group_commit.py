"""Group commit: one writer thread puts many callers' writes into one LMDB write transaction.

As BookKeeper's journal does: callers queue operations (:mod:`pulsartxn.storage.ops`) and
are answered only once the group that applied them is committed (durable when the store is
synced); a caller that waits for its write may commit the queue itself. An operation that
raises is retried alone. See docs/internals.md, "How a write becomes durable".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import lmdb

from ..errors import AlreadyClosed
from .figures import GROUP_RECORDS, LATENCY_S, Buckets
from .op_queue import OpQueue
from .ops import FailureLog, OpFuture, WriteOp, storage_error
from .recording import Recorder, RecordingTxn

_STOP = object()
CARRY_MAX = 1 << 20  # bytes of held groups' changes waiting for a record


class GroupCommit:
    def __init__(
        self,
        env: lmdb.Environment,
        *,
        max_records: int = 512,
        max_bytes: int = 4 * 1024 * 1024,
        linger_ms: float = 0.0,
        name: str = "pulsartxn-group-commit",
        sync: bool = False,
        lazy_max_ms: float = 20.0,
        after_group: Callable[[], None] | None = None,
        journal=None,
        names: dict | None = None,
        direct_bytes: int = 1 << 20,
    ) -> None:
        self._env = env
        # With a journal (journal.py), a group is durable once its record is: LMDB commits
        # without syncing. A group of direct_bytes or more skips the journal and is made
        # durable by a checkpoint instead (as large as a synced LMDB commit, with no copy).
        self._journal = journal
        self._names = names if names is not None else {}
        self._direct_bytes = direct_bytes
        self._path = env.path()
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._linger = linger_ms / 1000.0
        self._queue = OpQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self.groups = 0
        self.records = 0
        self.group_records = Buckets(GROUP_RECORDS)  # records per group
        self.commit_seconds = Buckets(LATENCY_S)  # a group's commit, its sync included
        self.failures = FailureLog(self._path)  # failed group commits, logged
        self._commit_lock = threading.Lock()
        self._linger_sync = bool(sync)
        self._last_group = 0
        self._last_commit_s = 0.0
        self._lazy: list[WriteOp] = []
        self._lazy_lock = threading.Lock()
        self._lazy_since = 0.0  # when the oldest lazy op waiting was submitted
        self._lazy_max = lazy_max_ms / 1000.0
        self._local = threading.local()
        self._after_group = after_group  # storage upkeep between groups (commit lock held)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def set_after_group(self, after_group: Callable[[], None] | None) -> None:
        self._after_group = after_group

    @property
    def writer_thread(self) -> threading.Thread:
        return self._thread

    @property
    def synced(self) -> bool:
        """Whether a commit fsyncs: then callers that can queue should (one commit answers
        many); without, a caller commits in its own thread sooner than hand it off."""
        return self._linger_sync

    @property
    def commit_lock(self) -> threading.Lock:
        """Held while a group is committed (and its after_group runs)."""
        return self._commit_lock

    def submit(self, op: WriteOp, lazy: bool = False, quiet: bool = False) -> OpFuture:
        """Queue `op`. A lazy op (background bookkeeping nobody waits for: log cleanup, cursor
        and snapshot writes) does not start a group, and so costs no fsync of its own: it rides
        with the next group, or is committed within `lazy_max_ms` if none comes. A quiet op
        does not wake the writer thread: its caller commits it with ``wait_for``."""
        if self._closed:
            raise AlreadyClosed("the broker's storage is closed")
        if lazy:
            op.lazy = True
            # From an on_commit callback too: it rides with the next group rather than
            # starting one (and an fsync) of its own while the commit lock is held.
            # The writer thread looks for lazy ops due every lazy_max_ms: no wake-up here.
            with self._lazy_lock:
                if not self._lazy:
                    self._lazy_since = time.monotonic()
                self._lazy.append(op)
            return op.future
        if getattr(self._local, "committing", False):
            # Called from an on_commit callback of a group this thread commits: run it in a
            # group of its own, now (the commit lock is ours).
            self._run_group([op])
            return op.future
        if quiet:
            self._queue.put_quiet(op)
        else:
            self._queue.put(op)
        return op.future

    def wait_for(self, fut) -> None:
        """Until `fut` (of a submitted op) is done, commit what is queued in this thread, the
        lazy ops too when nothing else is; when a group is being committed, sleep until `fut`
        is answered (the writer thread commits it if that group did not)."""

        def block(timeout: float) -> None:
            try:
                fut.exception(timeout)
            except TimeoutError:
                pass

        self.wait_until(fut.done, block)

    def wait_until(
        self, done: Callable[[], bool], block: Callable[[float], None] | None = None
    ) -> None:
        """``wait_for`` of whatever `done()` says has landed (ops submitted before the call);
        `block(timeout)`, if given, sleeps until it has, for when another thread commits."""
        while not done() and not self._closed:
            if getattr(self._local, "committing", False):
                return  # inside a commit callback: the op is committed after it
            if not self._commit_lock.acquire(blocking=block is None or not self._linger_sync):
                # With fsync, another thread commits a group. Do not queue on the lock: a
                # thread blocked in acquire() learns only once it holds the lock that its op
                # landed in that group, and the leader, back first, takes the lock again
                # before it, so groups shrink to one op. Sleep until the answer instead,
                # with the writer thread awake to commit what that group did not take.
                # (Without fsync a commit is short: wait for the lock and lead.)
                self._queue.wake_writer()
                block(0.05)
                continue
            try:
                if done():
                    return
                self._local.committing = True
                if not self._drain() and not done():
                    group = self._with_lazy([])  # it may be a lazy op's
                    if group:
                        self._run_group(group)
            finally:
                self._local.committing = False
                self._commit_lock.release()
            # Not done: the writer thread took it from the queue and waits for the lock.
            if not done():
                time.sleep(0)

    def flush_lazy(self, durable: bool = True, lead: bool = False, held: bool = False) -> None:
        """Commit the lazy ops now (a group of their own if nothing else is queued); with
        `lead`, in this thread when no group is being committed (no hand-off to the writer
        thread, and the call returns once they landed); with durable=False, flushed only if
        one of them asks for it; with `held` too, written only if one of them asks for it."""
        with self._lazy_lock:
            pending = bool(self._lazy)
        if pending and not self._closed:
            op = WriteOp(_nothing, nbytes=0, records=0, durable=durable, held=held)
            try:
                if lead:
                    self.run(op)
                else:
                    self.submit(op)
            except AlreadyClosed:
                pass

    def take_lazy(self, ops) -> list[WriteOp]:
        """Take back those of `ops` that are still waiting as lazy ops (in their order): the
        caller commits them in a write of its own. The others are committed or being so."""
        wanted = {id(op) for op in ops}
        if not wanted:
            return []
        with self._lazy_lock:
            taken = [op for op in self._lazy if id(op) in wanted]
            if taken:
                ids = {id(op) for op in taken}
                self._lazy = [op for op in self._lazy if id(op) not in ids]
        return taken

    def _with_lazy(self, group: list[WriteOp]) -> list[WriteOp]:
        """The lazy ops (submitted earlier) first, then the group."""
        if not self._lazy:
            return group
        with self._lazy_lock:
            lazy, self._lazy = self._lazy, []
        return lazy + group

    def help(self) -> None:
        """Commit what is queued now, in this thread, unless a group is being committed."""
        if self._closed or not self._commit_lock.acquire(blocking=False):
            return
        try:
            self._local.committing = True
            self._drain()
        finally:
            self._local.committing = False
            self._commit_lock.release()

    def _drain(self) -> bool:
        """Commit lock held: commit the queue in groups, leaving a stop to the writer thread;
        True when a group was committed."""
        ran = False
        while True:
            first = self._queue.pop()
            if first is None:
                return ran
            if first is _STOP:
                self._queue.put(_STOP)  # leave it for the writer thread
                return ran
            group, stop = self._collect(first, wait=False)
            self._run_group(self._with_lazy(group))
            ran = True
            if stop:
                self._queue.put(_STOP)
                return ran

    def write(self, apply: Callable[[lmdb.Transaction], Any], **kwargs) -> Any:
        """Submit one operation and wait until it is durable; return its result.

        When no group is being committed, the caller commits what is queued plus its own
        operation (after the queued ones: one thread's writes stay in order) without waking
        the writer thread.
        """
        return self.run(WriteOp(apply, **kwargs))

    def run(self, op: WriteOp) -> Any:
        """``write`` of a prepared operation: commit it (leading a group when none is being
        committed) and return its result once durable."""
        if self._closed:
            raise AlreadyClosed("the broker's storage is closed")
        if getattr(self._local, "committing", False) or not self._commit_lock.acquire(
            # Without fsync a commit costs microseconds: waiting for the lock and committing
            # in this thread beats a hand-off through the queue and a Condition. With fsync,
            # callers queue so that one commit answers many.
            blocking=not self._linger_sync
        ):
            fut = self.submit(op)
            if not fut.done():
                self.help()
            return fut.result()
        try:
            self._local.committing = True
            self._lead(op)
        finally:
            self._local.committing = False
            self._commit_lock.release()
        return op.future.result()

    def _lead(self, op: WriteOp) -> None:
        """Commit the queue and then `op` (commit lock held)."""
        if self._closed:
            self._fail(op, AlreadyClosed("the broker's storage is closed"))
            return
        if op.durable:  # a group that is not flushed is quick: nothing to wait for
            self._gather(self._last_group - 1)
        group: list[WriteOp] = []
        nbytes = records = 0
        stop = False
        while True:
            queued = self._queue.pop()
            if queued is None:
                break
            if queued is _STOP:
                stop = True
                break
            group.append(queued)
            nbytes += queued.nbytes
            records += queued.records
            if records >= self._max_records or nbytes >= self._max_bytes:
                self._run_group(group)
                group, nbytes, records = [], 0, 0
        group.append(op)
        self._run_group(self._with_lazy(group))
        if stop:
            self._queue.put(_STOP)

    def close(self) -> None:
        """Commit everything already submitted, then stop the writer. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)  # the writer commits the lazy ops with what is left
        self._thread.join()

    # -- the writer thread ------------------------------------------------------------------

    def _collect(self, first: WriteOp, wait: bool = True) -> tuple[list[WriteOp], bool]:
        group = [first]
        nbytes = first.nbytes
        records = first.records
        deadline = time.monotonic() + self._linger if self._linger and wait else 0.0
        stop = False
        while records < self._max_records and nbytes < self._max_bytes:
            if deadline:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._queue.wait(remaining):
                    break
            op = self._queue.pop()
            if op is None:
                break
            if op is _STOP:
                stop = True
                break
            group.append(op)
            nbytes += op.nbytes
            records += op.records
        return group, stop

    def _commit_due_lazy(self) -> None:
        """Writer thread, idle: commit the lazy ops once the oldest is lazy_max_ms old."""
        with self._lazy_lock:
            due = self._lazy and time.monotonic() - self._lazy_since >= self._lazy_max
        if due:
            with self._commit_lock:
                group = self._with_lazy([])
                if group:
                    self._run_group(group)

    def _gather(self, want: int) -> None:
        """With fsync on, wait briefly until `want` operations are queued.

        The callers answered by the last group are on their way back; committing before they
        have queued again would make them wait a whole fsync for the next group. The wait is
        bounded by half the last commit's duration (and 2 ms), so it never costs more than it
        can save; without fsync a commit is cheap and nothing waits.
        """
        if not self._linger_sync or want <= 0 or self._queue.qsize() >= want:
            return
        self._queue.wait_size(want, min(self._last_commit_s * 0.5, 0.002))

    def _run(self) -> None:
        self._local.committing = True
        while True:
            if not self._queue.wait(self._lazy_max):
                self._commit_due_lazy()
                continue
            with self._commit_lock:
                # Taken only now: an op taken before the lock could be overtaken by the next
                # ones, drained meanwhile by a caller that held it (a producer's batches
                # would then land out of order).
                first = self._queue.pop()
                if first is None:
                    continue  # a caller committed it meanwhile
                if first is not _STOP:
                    self._gather(self._last_group - 1)
                if first is _STOP:
                    stop = True
                    group: list[WriteOp] = []
                else:
                    group, stop = self._collect(first)
                group = self._with_lazy(group)
                if group:
                    self._run_group(group)
                if stop:
                    # Lazy ops queued by the last group's callbacks, then anything that raced
                    # with close(): answer it, never drop it silently.
                    while self._lazy:
                        self._run_group(self._with_lazy([]))
                    while (op := self._queue.pop()) is not None:
                        if op is not _STOP:
                            self._run_group([op])
                    return

    def _run_group(self, group: list[WriteOp]) -> None:
        try:
            results = self._commit(group)
        except _OpFailed:
            # Isolate the failing operation: each one alone.
            if len(group) == 1:
                return
            for op in group:
                self._run_group([op])
            return
        except BaseException as exc:  # the commit itself failed: nothing of the group was written
            error = storage_error(exc, self._path)
            self.failures.failed(error, len(group))
            for op in group:
                self._fail(op, error)
            return
        self.groups += 1
        records = waited = 0
        for op in group:
            records += op.records
            if op.records and not op.lazy:
                waited += 1
        self.records += records
        self.group_records.observe(records)
        # Callers that waited for this group: about as many will queue again (_gather).
        self._last_group = waited
        for op, result in zip(group, results):
            try:
                if op.on_commit is not None:
                    op.on_commit(result)
            except BaseException as exc:  # noqa: BLE001 - the caller gets it
                op.future.set_exception(exc)
                continue
            op.future.set_result(result)
        if self._after_group is not None:
            self._after_group()

    def _commit(self, group: list[WriteOp]) -> list[Any]:
        started = time.monotonic()
        journal = self._journal
        # Ops that are durable only by a later flush (durable=False) alone: their record is
        # written, not flushed; the next flushed record covers it. Held ones alone: their
        # changes wait for the next record, which carries them first (CARRY_MAX at most).
        nbytes = 0
        flush = False
        hold = True
        for op in group:
            nbytes += op.nbytes
            if op.durable:
                flush = True
            if not op.held:
                hold = False
        hold = hold and not flush
        if journal is not None:
            journal.check()
        lmdb_txn = self._env.begin(write=True)
        view = lmdb_txn
        rec = None
        if journal is not None and nbytes < self._direct_bytes:
            rec = Recorder(self._names)
            view = RecordingTxn(lmdb_txn, rec)
        results: list = []
        append = results.append
        try:
            try:
                for op in group:
                    append(op.apply(view))
            except BaseException as exc:
                lmdb_txn.abort()
                lmdb_txn = None
                for other in group:
                    if other.on_abort is not None:
                        other.on_abort()
                if len(group) == 1:
                    op.future.set_exception(storage_error(exc, self._path))
                raise _OpFailed() from exc
            if journal is None or (rec is not None and not rec.size):
                lmdb_txn.commit()
            elif rec is not None and hold and journal.carried + rec.size <= CARRY_MAX:
                lmdb_txn.commit()
                lmdb_txn = None
                journal.carry(rec.payload())
            elif rec is not None and journal.start(rec.payload(), lmdb_txn.id()):
                # While the device writes the record, commit LMDB (without syncing). Its
                # readers see the group now, but the broker publishes what a group did
                # (positions, answers: the ops' on_commit) only once it is durable, below.
                try:
                    lmdb_txn.commit()
                except BaseException:
                    journal.abandon()  # the group did not happen: never replay it
                    raise
                lmdb_txn = None
                # A record that cannot be made durable fails the group and the journal: the
                # store takes no more writes, and a reopen recovers to the last durable one.
                journal.finish(flush)
            else:
                lmdb_txn.commit()
                lmdb_txn = None
                journal.checkpoint()  # what it carried is in the checkpoint too
                journal.carried_over()
            lmdb_txn = None
            self._last_commit_s = time.monotonic() - started
            self.commit_seconds.observe(self._last_commit_s)
        finally:
            if lmdb_txn is not None:
                lmdb_txn.abort()
        return results

    @staticmethod
    def _fail(op: WriteOp, error: BaseException) -> None:
        if op.on_abort is not None:
            try:
                op.on_abort()
            except BaseException:  # noqa: BLE001 - the caller gets the original error
                pass
        op.future.set_exception(error)


class _OpFailed(Exception):
    pass


def _nothing(lmdb_txn) -> None:
    return None
