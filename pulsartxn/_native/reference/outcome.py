"""Pure-Python twin of pulsartxn._native.outcome: a batch's shared ``Outcome``, each message's
``MessageFuture`` over it, and the send path's ``Lock``."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from .message import MessageId

__all__ = ["MessageFuture", "Outcome", "Lock"]

# The states concurrent.futures.wait() and as_completed() read from a future's _state.
_RUNNING = "RUNNING"
_FINISHED = "FINISHED"
LOGGER = logging.getLogger("concurrent.futures")  # where Future reports a failing callback

Lock = threading.Lock


class Outcome:
    """What happened to one batch, shared by the futures of its messages: durable (with its
    entry id) or failed (with the error). The futures wait on its one Condition."""

    __slots__ = (
        "condition",
        "done",
        "error",
        "partition",
        "entry_id",
        "count",
        "watched",
        "on_wait",
    )

    def __init__(self) -> None:
        # Reentrant, as a Future's own: wait() and as_completed() lock every future they watch.
        self.condition = threading.Condition()
        self.done = False
        self.error: BaseException | None = None
        self.partition = None
        self.entry_id = -1
        self.count = 0
        self.watched: list[MessageFuture] | None = None  # futures with waiters or callbacks
        self.on_wait = None  # on_wait(block): write the batch now (a transaction's)

    def ask(self, block: bool) -> None:
        """Somebody waits for the batch: its on_wait, if any, writes it now (once). Blocking:
        in the waiter's thread, no lock held; else it only hands the write off."""
        hook = self.on_wait
        if hook is not None and not self.done:
            self.on_wait = None
            hook(block)

    def message_id(self, index: int) -> MessageId:
        p = self.partition
        if self.count > 1:
            return MessageId(p.ledger_id, self.entry_id, p.index, index, self.count)
        return MessageId(p.ledger_id, self.entry_id, p.index)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the batch is durable or has failed; TimeoutError after `timeout` s."""
        with self.condition:
            if not self.done:
                self.condition.wait(timeout)
            if not self.done:
                raise FutureTimeout()

    def landed(self, partition, entry_id: int, count: int) -> None:
        """The batch of `count` messages is durable as entry `entry_id` of `partition`:
        answer its futures (batches made outside this module: transactional ones)."""
        self.partition = partition
        self.entry_id = entry_id
        self.count = count
        self.settle(None)

    def failed(self, error: BaseException) -> None:
        """The batch was not written: its futures raise `error`."""
        self.settle(error)

    def settle(self, error: BaseException | None) -> None:
        """End the batch: one flag for every future, then the waiters and callbacks of the
        futures that have any."""
        with self.condition:
            if self.done:
                return
            self.error = error
            self.done = True
            self.on_wait = None  # it may refer back to the batch
            watched, self.watched = self.watched, None
            for f in watched or ():
                for waiter in f._waiter_list or ():
                    if error is None:
                        waiter.add_result(f)
                    else:
                        waiter.add_exception(f)
            self.condition.notify_all()
        for f in watched or ():
            f._run_callbacks()


class MessageFuture:
    """The future of one message: ``result()`` gives its MessageId once it is durable.

    Implements what callers use of concurrent.futures.Future (result, exception, done,
    add_done_callback, cancel, cancelled, running) and the fields concurrent.futures.wait()
    and as_completed() read, and reports ``concurrent.futures.Future`` as its ``__class__``,
    so ``isinstance(fut, Future)`` holds (as for a unittest.mock spec); ``type(fut)`` is this
    class. A queued message cannot be taken back: cancel() is False and running() is True
    until the batch ends."""

    __slots__ = ("_outcome", "_index", "_message_id", "_waiter_list", "_callbacks", "_watched")

    def __init__(self, outcome: Outcome, index: int) -> None:
        self._outcome = outcome
        self._index = index
        self._message_id = None
        self._waiter_list: list | None = None
        self._callbacks: list | None = None
        self._watched = False

    @property
    def __class__(self):  # noqa: PLE0101 - isinstance(fut, Future), as the native one
        return Future

    def _watch(self) -> None:
        # Called under the outcome's condition.
        outcome = self._outcome
        if self._watched or outcome.done:
            return
        if outcome.watched is None:
            outcome.watched = []
        outcome.watched.append(self)
        self._watched = True

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, None  # each runs once
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:
                LOGGER.exception("exception calling callback for %r", self)

    def result(self, timeout: float | None = None) -> MessageId:
        outcome = self._outcome
        if not outcome.done:
            outcome.ask(True)
            outcome.wait(timeout)
        if outcome.error is not None:
            raise outcome.error
        if self._message_id is None:
            self._message_id = outcome.message_id(self._index)
        return self._message_id

    def exception(self, timeout: float | None = None) -> BaseException | None:
        outcome = self._outcome
        if not outcome.done:
            outcome.ask(True)
            outcome.wait(timeout)
        return outcome.error

    def done(self) -> bool:
        return self._outcome.done

    def running(self) -> bool:
        return not self._outcome.done

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def add_done_callback(self, fn) -> None:
        """Call fn(future) when the message is durable or has failed (now, if it has)."""
        outcome = self._outcome
        with outcome.condition:
            if not outcome.done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                self._watch()
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
    def _state(self) -> str:
        return _FINISHED if self._outcome.done else _RUNNING

    @property
    def _waiters(self) -> list:
        # Read under the condition (by concurrent.futures.wait): the write is handed off.
        with self._outcome.condition:
            if self._waiter_list is None:
                self._waiter_list = []
            self._watch()
            self._outcome.ask(False)
        return self._waiter_list

    def __repr__(self) -> str:
        outcome = self._outcome
        if not outcome.done:
            return f"<MessageFuture at {id(self):#x} state=running>"
        if outcome.error is not None:
            return (
                f"<MessageFuture at {id(self):#x} state=finished raised "
                f"{type(outcome.error).__name__}>"
            )
        return f"<MessageFuture at {id(self):#x} state=finished returned MessageId>"
