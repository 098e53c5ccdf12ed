"""Consumers parked in a receive on one subscription, woken by what they can take."""

from __future__ import annotations

import threading
from collections import OrderedDict


class Parked:
    """Oldest first: a wake-up for k messages rouses k of them. Its own lock, apart from the
    subscription's: publishers never wait for a dispatch to rouse a consumer. While any wait,
    `owner` is in `awaited` (its partition's set): a publish wakes those subscriptions only,
    not every idle one of the topic."""

    def __init__(self, owner=None, awaited: set | None = None) -> None:
        self._lock = threading.Lock()
        self._waiting: OrderedDict = OrderedDict()
        self._owner = owner
        self._awaited = set() if awaited is None else awaited

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, consumer) -> None:
        with self._lock:
            self._waiting[consumer] = None
            self._awaited.add(self._owner)  # before the consumer polls once more

    def discard(self, consumer) -> None:
        with self._lock:
            self._waiting.pop(consumer, None)
            self._idle()

    def _idle(self) -> None:
        if not self._waiting:
            self._awaited.discard(self._owner)

    def rouse(self, k: int | None) -> None:
        """Wake k parked consumers (a consumer no longer waiting does not count), or every
        one when k is None; the roused ones leave."""
        with self._lock:
            waiting = self._waiting
            if k is None:
                self._waiting = OrderedDict()
                self._idle()
                for consumer in waiting:
                    consumer._wake_parked()
                return
            while waiting and k > 0:
                consumer, _ = waiting.popitem(last=False)
                if consumer._wake_parked():
                    k -= 1
            self._idle()
