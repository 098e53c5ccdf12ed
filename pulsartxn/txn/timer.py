"""One background thread per broker that drives transaction deadlines and finalize retries.

Deadlines live in each coordinator's heap (O(log n) per transaction); every tick (Pulsar:
100 ms) the thread asks each coordinator to expire what is due. Retries of participants that
failed to finalize are one-shot tasks on a heap of their own, run when due. Work that writes
(aborting a timed-out transaction, retrying a participant) is handed to a small pool so that a
slow write never delays the clock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class TxnTimer:
    def __init__(self, tick_ms: float, expire_all, workers: int = 2) -> None:
        self._tick = tick_ms / 1000.0
        self._expire_all = expire_all  # called with time.monotonic() every tick
        self._tasks: list = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pulsartxn-txn")
        self._thread = threading.Thread(target=self._run, name="pulsartxn-txn-timer", daemon=True)
        self._thread.start()

    def call_later(self, delay_s: float, fn, *args) -> None:
        """Run fn(*args) in the pool once delay_s has passed."""
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._tasks, (time.monotonic() + delay_s, next(self._order), fn, args))
            self._cond.notify()

    def submit(self, fn, *args) -> None:
        """Run fn(*args) in the pool now (errors are logged, never lost silently)."""
        if self._stopped:
            return
        try:
            self.pool.submit(_logged, fn, *args)
        except RuntimeError:  # the pool is shutting down
            pass

    def _run(self) -> None:
        next_tick = time.monotonic()
        while True:
            due = []
            with self._cond:
                while not self._stopped:
                    now = time.monotonic()
                    if now >= next_tick:
                        break
                    if self._tasks and self._tasks[0][0] <= now:
                        break
                    wake = next_tick
                    if self._tasks:
                        wake = min(wake, self._tasks[0][0])
                    self._cond.wait(wake - now)
                if self._stopped:
                    return
                now = time.monotonic()
                while self._tasks and self._tasks[0][0] <= now:
                    _, _, fn, args = heapq.heappop(self._tasks)
                    due.append((fn, args))
            for fn, args in due:
                self.submit(fn, *args)
            if now >= next_tick:
                _logged(self._expire_all, now)
                next_tick = now + self._tick

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._tasks.clear()
            self._cond.notify()
        self._thread.join()
        self.pool.shutdown(wait=True, cancel_futures=True)


def _logged(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - a background task must not kill its thread
        log.exception("transaction background task %r failed", fn)
