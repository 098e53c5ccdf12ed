# cython: language_level=3
"""The futures of the per-message send path: a batch's shared ``Outcome``, each message's
``MessageFuture`` (two C fields over it) and the ``Lock`` the send path takes from C. Their C
fields and methods are declared in outcome.pxd, for the producer module to cimport.
"""

cimport cython
from cpython.pythread cimport PyThread_allocate_lock, PyThread_free_lock
from libc.stdint cimport int64_t

from .message cimport new_message_id

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

__all__ = ["MessageFuture", "Outcome", "Lock"]

# The states concurrent.futures.wait() and as_completed() read from a future's _state.
_RUNNING = "RUNNING"
_FINISHED = "FINISHED"
LOGGER = logging.getLogger("concurrent.futures")  # where Future reports a failing callback


cdef extern from "Python.h":
    int PyObject_GC_IsTracked(object op)
    void PyObject_GC_Track(object op)


cdef inline void _track(object op) noexcept:
    """Let the garbage collector see `op` again (a future made untracked by the send path,
    once it holds a callback or a waiter: those may refer back to it)."""
    if not PyObject_GC_IsTracked(op):
        PyObject_GC_Track(op)


@cython.final
cdef class Lock:
    """A plain lock that the send path takes from C; ``with lock:`` works from Python.

    Not reentrant, like threading.Lock. A blocked acquire releases the GIL."""

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock is NULL:
            raise MemoryError("cannot allocate a lock")

    def __dealloc__(self):
        if self._lock is not NULL:
            PyThread_free_lock(self._lock)

    def acquire(self):
        self.take()
        return True

    def release(self):
        self.give()

    def __enter__(self):
        self.take()
        return True

    def __exit__(self, *exc):
        self.give()
        return False


@cython.final
cdef class Outcome:
    """What happened to one batch, shared by the futures of its messages: durable (with its
    entry id) or failed (with the error). The futures wait on its one Condition."""

    def __init__(self):
        # Reentrant, as a Future's own: wait() and as_completed() lock every future they watch.
        self.condition = threading.Condition()
        self.done = False
        self.error = None
        self.partition = None
        self.entry_id = -1
        self.count = 0
        self.watched = None
        self.on_wait = None

    cdef int ask(self, bint block) except -1:
        """Somebody waits for the batch: its on_wait, if any, writes it now (once). Blocking:
        in the waiter's thread, no lock held; else it only hands the write off."""
        hook = self.on_wait
        if hook is not None and not self.done:
            self.on_wait = None
            hook(block)
        return 0

    cdef object message_id(self, Py_ssize_t index):
        p = self.partition
        if self.count > 1:
            return new_message_id(p.ledger_id, self.entry_id, p.index, index, self.count)
        return new_message_id(p.ledger_id, self.entry_id, p.index, -1, 0)

    cdef int wait_done(self, object timeout) except -1:
        with self.condition:
            if not self.done:
                self.condition.wait(timeout)
            if not self.done:
                raise FutureTimeout()
        return 0

    def wait(self, timeout=None):
        """Wait until the batch is durable or has failed; TimeoutError after `timeout` s."""
        self.wait_done(timeout)

    def landed(self, partition, int64_t entry_id, Py_ssize_t count):
        """The batch of `count` messages is durable as entry `entry_id` of `partition`:
        answer its futures (batches made outside this module: transactional ones)."""
        self.partition = partition
        self.entry_id = entry_id
        self.count = count
        self.settle(None)

    def failed(self, error):
        """The batch was not written: its futures raise `error`."""
        self.settle(error)

    cdef int settle(self, object error) except -1:
        """End the batch: one flag for every future, then the waiters and callbacks of the
        futures that have any."""
        cdef MessageFuture f
        with self.condition:
            if self.done:
                return 0
            self.error = error
            self.done = True
            self.on_wait = None  # it may refer back to the batch
            watched = self.watched
            self.watched = None
            if watched is not None:
                for f in watched:
                    if f._waiter_list:
                        for waiter in f._waiter_list:
                            if error is None:
                                waiter.add_result(f)
                            else:
                                waiter.add_exception(f)
            self.condition.notify_all()
        if watched is not None:
            for f in watched:
                f.run_callbacks()
        return 0


@cython.freelist(64)
@cython.final
cdef class MessageFuture:
    """The future of one message: ``result()`` gives its MessageId once it is durable.

    Implements what callers use of concurrent.futures.Future (result, exception, done,
    add_done_callback, cancel, cancelled, running) and the fields concurrent.futures.wait()
    and as_completed() read, and reports ``concurrent.futures.Future`` as its ``__class__``,
    so ``isinstance(fut, Future)`` holds (as for a unittest.mock spec); ``type(fut)`` is this
    class. A queued message cannot be taken back: cancel() is False and running() is True
    until the batch ends."""

    def __init__(self, Outcome outcome, Py_ssize_t index):
        self._outcome = outcome
        self._index = index

    @property
    def __class__(self):
        return Future

    cdef int watch(self) except -1:
        # Called under the outcome's condition.
        if self._watched or self._outcome.done:
            return 0
        if self._outcome.watched is None:
            self._outcome.watched = []
        self._outcome.watched.append(self)
        self._watched = True
        return 0

    cdef int run_callbacks(self) except -1:
        callbacks = self._callbacks
        self._callbacks = None  # each runs once, and a callback holding its future is let go
        if callbacks:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:
                    LOGGER.exception("exception calling callback for %r", self)
        return 0

    def result(self, timeout=None):
        cdef Outcome outcome = self._outcome
        if not outcome.done:
            outcome.ask(True)
            outcome.wait_done(timeout)
        if outcome.error is not None:
            raise outcome.error
        if self._message_id is None:
            self._message_id = outcome.message_id(self._index)
        return self._message_id

    def exception(self, timeout=None):
        cdef Outcome outcome = self._outcome
        if not outcome.done:
            outcome.ask(True)
            outcome.wait_done(timeout)
        return outcome.error

    def done(self):
        return self._outcome.done

    def running(self):
        return not self._outcome.done

    def cancel(self):
        return False

    def cancelled(self):
        return False

    def add_done_callback(self, fn):
        """Call fn(future) when the message is durable or has failed (now, if it has)."""
        cdef Outcome outcome = self._outcome
        with outcome.condition:
            if not outcome.done:
                if self._callbacks is None:
                    self._callbacks = []
                    _track(self)
                self._callbacks.append(fn)
                self.watch()
                return
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    # What concurrent.futures.wait() and as_completed() use, under _condition.
    @property
    def _condition(self):
        return self._outcome.condition

    @property
    def _state(self):
        return _FINISHED if self._outcome.done else _RUNNING

    @property
    def _waiters(self):
        # Read under the condition (by concurrent.futures.wait): the write is handed off.
        with self._outcome.condition:
            if self._waiter_list is None:
                self._waiter_list = []
                _track(self)
            self.watch()
            self._outcome.ask(False)
        return self._waiter_list

    def __repr__(self):
        outcome = self._outcome
        if not outcome.done:
            return f"<MessageFuture at {id(self):#x} state=running>"
        if outcome.error is not None:
            return (f"<MessageFuture at {id(self):#x} state=finished raised "
                    f"{type(outcome.error).__name__}>")
        return f"<MessageFuture at {id(self):#x} state=finished returned MessageId>"
