"""Twin of ``_native/flushtimer.pyx``: the batch flusher's timer (the native module's
docstring states the contract; this one takes the GIL at each wake-up)."""

from __future__ import annotations

import math
import threading
import time


class FlushTimer:
    """The twin of ``FlushTimer`` in flushtimer.pyx."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next = math.inf
        self._stopped = False

    def set(self, at: float) -> None:
        with self._cond:
            if at < self._next:
                self._cond.notify()
            self._next = float(at)

    def wait(self) -> bool:
        with self._cond:
            while not self._stopped:
                at = self._next
                now = time.monotonic()
                if at <= now:
                    break
                self._cond.wait(None if at == math.inf else at - now)
            return not self._stopped

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
