"""A subscription's redeliveries: negative acks, held and released messages, their counts."""

from __future__ import annotations

import heapq
import time

from .message import MessageId

_LAST = 1 << 62  # above any batch index: (entry, _LAST) follows every message of the entry


class Redelivery:
    """Mixed into Subscription, whose attributes it uses: lock, cursor, partition, read_ahead,
    pending_ack, key_shared, timeouts, delayed, _pending, _redeliver, _nacked,
    _redelivery_counts, and its notify, _deliver and _ack_internally."""

    def _take_redelivered(self, consumer, out: list, n: int, max_bytes: int):
        """Redeliveries into `out`, in position order, each read again from its entry (lock
        held); (bytes taken, whether max_bytes stopped it), as take_many."""
        heap = self._redeliver
        pending, counts = self._pending, self._redelivery_counts
        cursor = self.cursor
        held = self.pending_ack.holds
        nbytes = 0
        while heap and len(out) < n:
            key = heap[0]  # taken off once delivered: a read that fails leaves it there
            if key in pending or held(*key):
                heapq.heappop(heap)
                continue
            if cursor.is_acked(*key):
                heapq.heappop(heap)
                counts.pop(key, None)
                continue
            payload = self._reread(key)
            if payload is None:
                heapq.heappop(heap)
                continue
            size = len(payload[0])
            if out and nbytes + size > max_bytes:
                return nbytes, True
            heapq.heappop(heap)
            self.read_ahead.delivered(key)  # the payload is the Message's now
            count = counts.get(key, 0) + 1
            counts[key] = count
            out.append(self._deliver(consumer, key, payload, count))
            nbytes += size
        if not heap:
            self.read_ahead.forget_reread()
        return nbytes, False

    def _reread(self, key: tuple[int, int]):
        """The read-ahead payload of the message at `key`, read again from its entry (lock
        held); None when it is no longer to be delivered (acknowledged, or aborted since)."""
        payload = self.read_ahead.reread(key)
        if payload is not None and payload[5] is not None:
            if self.partition.buffer.is_aborted(payload[5]):
                self._ack_internally(key[0])  # read uncommitted, aborted since
                return None
        return payload

    def hold(self, entry_id: int, batch_index: int) -> None:
        """A message acknowledged in a transaction leaves its consumer's unacknowledged
        messages: it is held by the transaction, not redelivered (lock held)."""
        self._pending.pop((entry_id, batch_index), None)

    def dead_lettering(self, entry_id: int, batch_index: int) -> bool:
        """Whether the message is on its way to a dead letter topic (lock held)."""
        p = self._pending.get((entry_id, batch_index))
        return p is not None and p.consumer is None

    def forget_acked(self, cumulative: tuple[int, int, int] | None = None, entries=()) -> None:
        """Drop the bookkeeping (pending deliveries, redelivery counts) of the messages an
        acknowledgement just applied to the cursor covers (lock held), by position rather
        than by asking the cursor about every message held: a transaction with few acks on a
        subscription with many messages in flight or redelivered does not pay for all.

        `cumulative` (entry id, batch index, batch size): everything up to that position.
        `entries` ((ledger, entry id, AckSet or None), as a pending-ack release gives them):
        messages acknowledged one by one in a transaction, which left the pending deliveries
        when they were acknowledged; only their redelivery counts are left to drop."""
        pending, counts = self._pending, self._redelivery_counts
        if cumulative is not None:
            entry_id, batch_index, batch_size = cumulative
            bound = (entry_id, batch_index if batch_index >= 0 and batch_size > 1 else _LAST)
            for held in (pending, counts):
                if not held:
                    continue
                if max(held) <= bound:
                    held.clear()  # the usual case: everything up to the ack is covered
                else:
                    for key in [k for k in held if k <= bound]:
                        del held[key]
        if counts:
            for _, entry_id, ack_set in entries:
                if ack_set is not None:
                    for i in ack_set:
                        counts.pop((entry_id, i), None)
                    continue
                counts.pop((entry_id, -1), None)
                n = self.partition.message_count(entry_id)
                for i in range(n if n > 1 else 0):
                    counts.pop((entry_id, i), None)

    def release_held(self, released) -> None:
        """An aborted transaction's held messages are delivered again, their redelivery count
        increased: reading restarts at the lowest of them (lock held)."""
        lowest = None
        for _, entry_id, ack_set in released:
            if entry_id < 0:  # a cumulative hold: from the mark-delete position on
                entry_id = self.cursor.mark_delete + 1
                lowest = entry_id if lowest is None else min(lowest, entry_id)
                continue
            lowest = entry_id if lowest is None else min(lowest, entry_id)
            n = self.partition.message_count(entry_id)
            indexes = (
                [-1] if n <= 1 else [i for i in range(n) if ack_set is None or ack_set.test(i)]
            )
            for bi in indexes:
                key = (entry_id, bi)
                self._redelivery_counts[key] = self._redelivery_counts.get(key, 0) + 1
        if lowest is None:
            return
        self.read_ahead.rewind_to(lowest)

    def _due_nacks(self) -> None:
        now = time.monotonic()
        while self._nacked and self._nacked[0][0] <= now:
            _, key = heapq.heappop(self._nacked)
            heapq.heappush(self._redeliver, key)
        if self.timeouts:
            self.timeouts.expire(now, self._pending, self._redeliver)

    def next_due(self) -> float | None:
        with self.lock:
            due = self._nacked[0][0] if self._nacked else None
            timeout = self.timeouts.next_due()
            delayed = self.delayed.next_due() if self.delayed else None
        return min((d for d in (due, timeout, delayed) if d is not None), default=None)

    def negative_acknowledge(self, mid: MessageId, delay_s: float) -> None:
        entry_id, batch_index, _ = self.partition.position_of(mid)
        with self.lock:
            key = (entry_id, batch_index)
            if self._pending.pop(key, None) is None:
                return
            drained = self.key_shared is not None and self.key_shared.unblocked()
            due = time.monotonic() + delay_s
            # A parked consumer waits no later than the earliest due time it saw: only an
            # earlier one needs it to look again.
            earliest = not self._nacked or due < self._nacked[0][0]
            heapq.heappush(self._nacked, (due, key))
        if earliest or drained:
            self.notify()
