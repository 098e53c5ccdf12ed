"""A write of the group commit and its answer: ``WriteOp`` (what a caller writes and what
runs once it is durable), ``OpFuture`` (the answer), ``combine`` (several ops as one, all or
none) and ``storage_error`` (a failed LMDB write as the API.md error)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import lmdb

from ..errors import StorageError, StorageFull

_FUTURE_LOCK = threading.Lock()  # state changes of every OpFuture: each holds it briefly
_LOG = logging.getLogger("pulsartxn.storage")


class OpFuture:
    """The answer to one write: a result or an error, once. The part of
    ``concurrent.futures.Future`` the storage's callers use (result, exception, done,
    add_done_callback, set_result, set_exception), without a Condition per future: a write
    costs the group commit a few of these, and a caller that commits its own write finds it
    done and never waits. Waiting creates an Event, only then."""

    __slots__ = ("_done", "_result", "_error", "_callbacks", "_event")

    def __init__(self) -> None:
        self._done = False
        self._result = None
        self._error: BaseException | None = None
        self._callbacks: list | None = None
        self._event: threading.Event | None = None

    def done(self) -> bool:
        return self._done

    def running(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        with _FUTURE_LOCK:
            if self._done:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout):
            raise TimeoutError(f"the write was not answered within {timeout} s")

    def result(self, timeout: float | None = None):
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def add_done_callback(self, fn) -> None:
        if not self._done:
            with _FUTURE_LOCK:
                if not self._done:
                    if self._callbacks is None:
                        self._callbacks = []
                    self._callbacks.append(fn)
                    return
        self._call(fn)

    def set_result(self, result) -> None:
        self._finish(result, None)

    def set_exception(self, error: BaseException) -> None:
        self._finish(None, error)

    def _finish(self, result, error) -> None:
        with _FUTURE_LOCK:
            if self._done:
                raise InvalidStateError(f"{self!r} is answered already")
            self._result, self._error = result, error
            self._done = True
            event, callbacks = self._event, self._callbacks
            self._callbacks = None
        if event is not None:
            event.set()
        if callbacks:
            for fn in callbacks:
                self._call(fn)

    def _call(self, fn) -> None:
        try:
            fn(self)
        except Exception:  # as Future does: a failing callback is logged, not raised
            _LOG.exception("a callback of %r raised", self)

    def __repr__(self) -> str:
        state = "pending" if not self._done else ("failed" if self._error else "done")
        return f"<OpFuture at {id(self):#x} {state}>"


@dataclass(eq=False)
class WriteOp:
    """One caller's part of a group: ``apply(txn)`` writes, its result answers the caller.

    ``on_commit(result)`` runs on the writer thread after the group is durable and before the
    caller is answered (publish in-memory state there); ``on_abort()`` runs when the write did not
    happen, so state reserved inside ``apply`` can be given back. ``durable=False``: the op is
    answered once stored (a process crash keeps it); a later flushed group makes it durable,
    and a group of such ops alone costs no device flush (a transaction's sends and acks, whose
    commit flushes). ``held`` (with durable=False): it may even die with the process until a
    later group's record carries it (an in-process transaction's data, which dies with it
    anyway): a group of such ops alone writes no record.
    """

    apply: Callable[[lmdb.Transaction], Any]
    nbytes: int = 0
    records: int = 1
    on_commit: Callable[[Any], None] | None = None
    on_abort: Callable[[], None] | None = None
    future: OpFuture = field(default_factory=OpFuture)
    lazy: bool = False  # submitted lazily: nobody waits for it
    durable: bool = True  # its group is flushed before it is answered
    held: bool = False  # not durable: its record may wait for a later group's

    def prepend(self, first: Callable[[lmdb.Transaction], Any]) -> None:
        """Run ``first(txn)`` before this op's own writes, in the same LMDB transaction."""
        apply = self.apply

        def both(lmdb_txn):
            first(lmdb_txn)
            return apply(lmdb_txn)

        self.apply = both


def combine(ops: list[WriteOp]) -> WriteOp:
    """One operation applying `ops` in order in one LMDB transaction: all of them land, or
    none. Each op's on_commit runs and its future is answered after the commit; if the
    combined op fails, every op's on_abort runs and its future gets the error."""
    nbytes = records = 0
    durable, held = False, True
    for op in ops:
        nbytes += op.nbytes
        records += op.records
        if op.durable:
            durable = True
        if not op.held:
            held = False

    def apply(lmdb_txn):
        return [op.apply(lmdb_txn) for op in ops]

    def on_commit(results):
        for op, result in zip(ops, results):
            try:
                if op.on_commit is not None:
                    op.on_commit(result)
            except BaseException as exc:  # noqa: BLE001 - that op's caller gets it
                op.future.set_exception(exc)
                continue
            op.future.set_result(result)

    def on_abort():
        for op in ops:
            if op.on_abort is not None:
                op.on_abort()

    combined = WriteOp(apply, nbytes, records, on_commit, on_abort, durable=durable, held=held)

    def answer(fut):
        exc = fut._error
        if exc is not None:
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(exc)

    combined.future.add_done_callback(answer)
    return combined


# Free bytes under which a failed write is taken for a full disk: LMDB reports a write that
# the disk cut short as an I/O error (EIO), not as ENOSPC.
NEARLY_FULL_BYTES = 16 << 20


def storage_error(exc: BaseException, path: str | None = None) -> BaseException:
    """The API.md error for a failed LMDB write: StorageFull for a full map or disk (a short
    write on a disk with almost no room left counts), StorageError for other I/O errors."""
    if isinstance(exc, lmdb.MapFullError):
        return StorageFull(f"LMDB map is full: {exc}")
    if isinstance(exc, lmdb.DiskError) or (isinstance(exc, OSError) and exc.errno == 28):
        return StorageFull(f"disk is full: {exc}")
    text = str(exc)
    if isinstance(exc, lmdb.Error) and "No space left" in text:
        return StorageFull(f"disk is full: {exc}")
    if isinstance(exc, lmdb.Error) and "Input/output error" in text:
        free = free_bytes(path)
        if free is not None and free < NEARLY_FULL_BYTES:
            return StorageFull(f"disk is full ({free} bytes free): {exc}")
        return StorageError(f"the disk failed the write: {exc}")
    return exc


def free_bytes(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class FailureLog:
    """Failed group commits on the ``pulsartxn.storage`` logger: the first at once, then one
    line per `every_s` at most with how many failed meanwhile (a full disk fails every group).
    A full store is a WARNING (freeing room resumes writes); any other failure an ERROR."""

    def __init__(self, path: str, every_s: float = 10.0) -> None:
        self._path = path
        self._every = every_s
        self._next = 0.0
        self._unshown = 0
        self.failures = 0

    def failed(self, error: BaseException, ops: int) -> None:
        self.failures += 1
        now = time.monotonic()
        if now < self._next:
            self._unshown += 1
            return
        level = logging.WARNING if isinstance(error, StorageFull) else logging.ERROR
        since = f" ({self._unshown} more since the last shown)" if self._unshown else ""
        _LOG.log(
            level,
            "a group commit in %s failed, its %d writes answered with the error%s: %s",
            self._path,
            ops,
            since,
            error,
        )
        self._next = now + self._every
        self._unshown = 0
