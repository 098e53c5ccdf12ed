"""Twin of ``_native/asyncwrite.pyx``: the same results, written synchronously at ``start``
(the native module's docstring states the contract)."""

from __future__ import annotations

import math
import os


class AsyncWriter:
    """The twin of ``AsyncWriter`` in asyncwrite.pyx: never asynchronous."""

    asynchronous = False
    bounded = True  # nothing to wait for: the write ran at start

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._busy = False
        self._done: int | OSError = 0

    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, buffer, offset: int) -> None:
        if self._busy:
            raise RuntimeError("a write is in flight: wait() for it first")
        if self._fd < 0:
            raise ValueError("the writer is closed")
        try:
            self._done = os.pwrite(self._fd, buffer, offset)
        except OSError as exc:
            self._done = OSError(exc.errno, os.strerror(exc.errno))
        self._busy = True

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None and (
            type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout < 0
        ):
            raise ValueError(f"timeout must be a finite number >= 0, not {timeout!r}")
        if not self._busy:
            raise RuntimeError("no write is in flight")
        self._busy = False
        done, self._done = self._done, 0
        if isinstance(done, OSError):
            raise done
        return done

    def close(self) -> None:
        self._busy = False
        self._fd = -1
