"""The group commit's queue of operations."""

from __future__ import annotations

import collections
import threading
import time


class OpQueue:
    """The group commit's queue: a deque, plus a Condition for the writer thread's sleep and
    for a leader gathering its group. ``put_quiet`` queues without waking the writer, for a
    caller that commits its op itself (``GroupCommit.wait_for``): no thread hand-off, no
    wake-up on the latency path."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._sleeping = False  # the writer thread waits for an item
        self._gather_at = 0  # a leader waits for this many items (0: none does)

    def put(self, item) -> None:
        self._items.append(item)
        # Read after the append: a sleeper about to wait sees the item, or we see it.
        if self._sleeping or (self._gather_at and len(self._items) >= self._gather_at):
            with self._cond:
                self._cond.notify_all()

    def put_quiet(self, item) -> None:
        self._items.append(item)
        if self._gather_at and len(self._items) >= self._gather_at:
            with self._cond:
                self._cond.notify_all()

    def wake_writer(self) -> None:
        """Wake the writer thread if it sleeps (quiet items do not)."""
        if self._sleeping:
            with self._cond:
                self._cond.notify_all()

    def pop(self):
        """The next item, or None when there is none (no exception: a leader's loop ends
        this way at every group)."""
        items = self._items
        return items.popleft() if items else None

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until an item is queued, at most `timeout` seconds; whether one is. The
        item stays queued: the writer thread takes it only once it holds the commit lock."""
        if self._items:
            return True
        with self._cond:
            self._sleeping = True
            try:
                if not self._items:
                    self._cond.wait(timeout)
            finally:
                self._sleeping = False
        return bool(self._items)

    def wait_size(self, n: int, timeout: float) -> None:
        """Sleep until `n` items are queued, at most `timeout` seconds. A real sleep: a loop
        of sleep(0) keeps the GIL from the very callers it waits for (CPython hands the GIL
        over to a waiting thread only after its switch interval, 5 ms)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._gather_at = n
            try:
                while len(self._items) < n:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            finally:
                self._gather_at = 0

    def qsize(self) -> int:
        return len(self._items)
