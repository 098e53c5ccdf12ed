"""Delayed delivery (Pulsar's ``deliverAt``) on a Shared subscription: messages read before
their time wait here, by position, until it comes; then they go back to the read-ahead.

Only positions and times are held (the payload is read again from the entry when due), and
nothing is persisted: the time is in the stored entry, so a restart finds them again when it
reads the ledger from the cursor on. Used under the subscription's lock.
"""

from __future__ import annotations

import heapq
import time


class DelayedDelivery:
    """Positions (entry, batch_index) held until their time (ms since the epoch)."""

    __slots__ = ("_heap", "_keys", "woke")

    def __init__(self) -> None:
        self._heap: list[tuple[int, tuple[int, int]]] = []
        self._keys: set[tuple[int, int]] = set()
        # Set when a message came in due before every other one held: receives parked with
        # a later wake-up must look again (the subscription rouses them and clears it).
        self.woke = False

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: tuple[int, int], deliver_at: int) -> None:
        """Hold `key` until `deliver_at` (a key read again while held is held once)."""
        if key in self._keys:
            return
        if not self._heap or deliver_at < self._heap[0][0]:
            self.woke = True
        self._keys.add(key)
        heapq.heappush(self._heap, (deliver_at, key))

    def pop_due(self, now_ms: int | None = None) -> list[tuple[int, int]]:
        """The positions whose time has come, in position order; they are no longer held."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        heap, due = self._heap, []
        while heap and heap[0][0] <= now_ms:
            _, key = heapq.heappop(heap)
            self._keys.discard(key)
            due.append(key)
        due.sort()
        return due

    def next_due(self) -> float | None:
        """When the next held message is due, on the time.monotonic() clock; None if none."""
        if not self._heap:
            return None
        return time.monotonic() + max(0.0, self._heap[0][0] / 1000.0 - time.time())

    def clear(self) -> None:
        """Forget every held message (a seek: reading again finds them)."""
        self._heap.clear()
        self._keys.clear()

    def use(self, read_ahead, cursor, delays: bool) -> None:
        """Delay (a Shared subscription, as Pulsar) or not: a change reads again from the
        cursor, so that what was held is delivered at once, or what was read is held."""
        if delays == (read_ahead.delay is not None):
            return
        read_ahead.delay = self.add if delays else None
        self.clear()
        read_ahead.rewind(cursor.mark_delete + 1)

    def release_due(self, read_ahead) -> None:
        """Messages whose time has come go to the front of the read-ahead, read again from
        their entries (one no longer delivered, aborted or acknowledged, is dropped there)."""
        for key in reversed(self.pop_due()):
            payload = read_ahead.reread(key)
            if payload is not None:
                read_ahead.delivered(key)
                read_ahead.buffer.appendleft((key, payload))
