"""The journal's checkpoints, in a thread of their own."""

from __future__ import annotations

import threading
import time

from ..errors import StorageError
from .journal import Journal


class Checkpointer:
    """A thread that checkpoints once the journal's records since the last checkpoint pass a
    quarter of it (or `every_s` seconds have passed with some), so that a record always finds
    room and recovery has little to replay."""

    def __init__(self, journal: Journal, commit_lock: threading.Lock, every_s: float = 30.0):
        self._journal = journal
        self._lock = commit_lock
        self._every = every_s
        self._wake = threading.Event()
        self._stopped = False
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="pulsartxn-checkpoint", daemon=True)
        self._thread.start()

    def after_group(self) -> None:
        """Group commit lock held, between groups."""
        journal = self._journal
        if journal.used >= journal.region // 4:
            self._wake.set()

    def _run(self) -> None:
        journal = self._journal
        while not self._stopped:
            self._wake.wait(min(self._every, 1.0))
            self._wake.clear()
            if self._stopped or journal.failed is not None:
                continue
            due = journal.used >= journal.region // 4 or (
                journal.used and time.monotonic() - self._last >= self._every
            )
            if not due:
                continue
            try:
                with self._lock:
                    prepared = journal.prepare()
                journal.complete(prepared)  # the fdatasyncs, with the commit lock free
            except StorageError:
                continue  # journal.failed is set: later commits fail fast
            self._last = time.monotonic()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join()
