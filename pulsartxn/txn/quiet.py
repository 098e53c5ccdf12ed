"""A Condition whose notify costs nothing when nobody waits."""

from __future__ import annotations

import threading


class QuietCondition(threading.Condition):
    """``threading.Condition`` whose ``notify_all`` returns at once when no thread waits on
    it: the coordinator and the transaction buffers notify at every end, and almost every
    one has no waiter. (Waiters register under the lock, which the notifier holds.)"""

    def notify_all(self) -> None:
        if self._waiters:  # type: ignore[attr-defined]
            super().notify_all()
