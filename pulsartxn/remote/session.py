"""The remote client's session generations: a reopen of the session (after the broker lost
it) and the handles being made wait for each other, and no wait holds a lock across a call
to the broker (every one is bounded by the send deadline or reconnect_timeout_s)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from .. import errors
from ..server.protocol import SessionLost
from .handles import SendTimedOut, Unreachable


class SessionGate:
    """The part of RemoteClient that orders reopens and handle makes (a mixin: it uses the
    client's _hello, _deadline, _reconnect_s, _closing and service_url)."""

    def _init_gate(self) -> None:
        # _lock is never held across a call to the broker. Handles being made (_makes), each
        # in the session of the generation it read: a reopen (_reopening) waits for them, and
        # new ones wait for it, so no handle lands in a session newer than its generation.
        self._lock = threading.Lock()
        self._gate = threading.Condition(self._lock)
        self._makes = 0
        self._reopening = False
        self._generation = 0

    def _check_generation(self, seen: int) -> None:
        """SessionLost if the session was opened again since generation `seen` (a reopen
        under way finishes first, or the thread's send deadline passes)."""
        with self._lock:
            self._wait_for(lambda: not self._reopening, self._wait_bound())
            if seen != self._generation:
                raise SessionLost("the session was opened again")

    def _wait_bound(self) -> float:
        """When a wait for another thread's reopen gives up: at the thread's send deadline,
        else after reconnect_timeout_s (time.monotonic())."""
        by = time.monotonic() + self._reconnect_s
        at = self._deadline.at
        return by if at is None else min(at, by)

    def _wait_for(self, ready: Callable[[], bool], by: float) -> None:
        """Wait (_lock held) until ready(); SendTimedOut at the thread's send deadline, else
        Unreachable once `by` has passed (a reopen the broker does not answer)."""
        while not ready():
            left = by - time.monotonic()
            if left <= 0:
                what = f"broker at {self.service_url}: its session is being reopened"
                if self._deadline.at is not None and self._deadline.at <= by:
                    raise SendTimedOut(what)
                raise Unreachable(f"{what} (not answered within reconnect_timeout_s)")
            self._gate.wait(left)

    def _reopen(self, seen: int | None = None) -> None:
        """After SessionLost, seen by a call made at generation `seen`: open the session
        again. Handles are made again only if it is new there and nobody reopened it since
        (two threads that both saw it lost reopen it once)."""
        by = self._wait_bound()
        with self._lock:
            self._wait_for(lambda: not self._reopening, by)
            if seen is not None and seen != self._generation:
                return  # another thread opened it again since
            self._reopening = True
            try:
                self._wait_for(lambda: not self._makes, by)
            except BaseException:
                self._reopening = False
                self._gate.notify_all()
                raise
        new = False
        try:
            new = self._hello()  # not under _lock: every wait for it is bounded instead
        finally:
            with self._lock:
                if new:
                    self._generation += 1
                self._reopening = False
                self._gate.notify_all()

    @contextlib.contextmanager
    def _making(self) -> Iterator[int]:
        """Make a handle in this session: yields the generation it will belong to (a reopen
        under way finishes first, within the bound of _wait_for)."""
        if self._closing.is_set():  # a closing client re-creates nothing (its session ends)
            raise errors.AlreadyClosed("client is closed")
        by = self._wait_bound()
        with self._lock:
            self._wait_for(lambda: not self._reopening, by)
            self._makes += 1
            generation = self._generation
        try:
            yield generation
        finally:
            with self._lock:
                self._makes -= 1
                if not self._makes:
                    self._gate.notify_all()
