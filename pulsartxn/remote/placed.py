"""What a cluster client's per-partition producers and consumers share: calls at their
partition's owner, wherever it is served."""

from __future__ import annotations

import threading

from .. import errors
from .handles import Handle

__all__ = ["Placed", "quietly"]


class Placed:
    """A per-partition handle whose calls go to its partition's owner, wherever it is."""

    def _place(self, cluster, partition: str) -> None:
        self._cluster = cluster
        self._partition = partition
        self._place_lock = threading.Lock()

    def _follow(self, fn):
        def run(conn):
            with self._place_lock:
                if self._client is not conn:  # served elsewhere now: made again there
                    self._client = conn
                    self._handle = None
            return fn()

        return self._cluster._follow("partition", self._partition, run)

    def _ensure(self) -> int:
        return self._follow(lambda: Handle._ensure(self))


def quietly(close) -> None:
    try:
        close()
    except errors.PulsarTxnError:
        pass
