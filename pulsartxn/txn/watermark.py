"""Transactions ordered by sequence per coordinator, for participants that act on a low
watermark: an end that carries one must find the transactions of that coordinator below it
(to abort leftovers, or to forget ended ones) without looking at every transaction it holds.
With one long transaction holding a coordinator's low watermark back, the others pile up above
it; a scan per end then costs the whole pile, so that each end is slower than the last.
"""

from __future__ import annotations

import heapq

from .._native import TxnID


class BySequence:
    """A heap of (sequence, TxnID) per coordinator. Entries are not removed when their
    transaction goes away: ``below`` hands them out once, and the caller puts back those it
    still holds. ``compact`` keeps the heaps in proportion to what the caller holds."""

    __slots__ = ("_heaps", "_size")

    def __init__(self) -> None:
        self._heaps: dict[int, list] = {}
        self._size = 0

    def add(self, txn_id: TxnID) -> None:
        heapq.heappush(self._heaps.setdefault(txn_id.coordinator_id, []), (txn_id.sequence, txn_id))
        self._size += 1

    def below(self, coordinator_id: int, low_watermark: int) -> list[TxnID]:
        """Take out the entries of `coordinator_id` below `low_watermark` (each once)."""
        heap = self._heaps.get(coordinator_id)
        out: list[TxnID] = []
        while heap and heap[0][0] < low_watermark:
            _, txn_id = heapq.heappop(heap)
            if not out or out[-1] != txn_id:
                out.append(txn_id)
            self._size -= 1
        return out

    def compact(self, held) -> None:
        """Drop the entries of transactions not in `held` (a set or dict of TxnIDs) once they
        outnumber the held ones: amortized, each entry is looked at a bounded number of
        times."""
        if self._size > 2 * len(held) + 64:
            self.rebuild(held)

    def rebuild(self, held) -> None:
        """Exactly the transactions of `held` (also after a recovery filled it directly)."""
        self._heaps, self._size = {}, 0
        for txn_id in held:
            self._heaps.setdefault(txn_id.coordinator_id, []).append((txn_id.sequence, txn_id))
            self._size += 1
        for heap in self._heaps.values():
            heapq.heapify(heap)
