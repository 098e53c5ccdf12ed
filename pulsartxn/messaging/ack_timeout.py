"""The ack timeout (pulsar-client's ``unacked_messages_timeout_ms``), kept by the broker: a
message delivered to a consumer with one and not acknowledged within it is delivered again,
its redelivery count increased. One heap per subscription, looked at when a consumer takes
or computes how long to wait (as negative acks): no timer thread, no busy loop."""

from __future__ import annotations

import heapq
import itertools
import time

MIN_ACK_TIMEOUT_MS = 10_000  # pulsar-client's minimum (BrokerConfig.min_ack_timeout_ms)


class AckTimeouts:
    """Deliveries under an ack timeout, by due time; used under the subscription's lock."""

    def __init__(self) -> None:
        self._heap: list = []  # (due, seq, (entry, batch_index), the delivery's Pending)
        self._seq = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._heap)

    def delivered(self, pending: dict, consumer, msgs, timeout_s: float) -> None:
        """`msgs` just went to `consumer`: each is due back after timeout_s unless
        acknowledged (or given back) before."""
        due = time.monotonic() + timeout_s
        for m in msgs:
            mid = m.message_id()
            key = (mid.entry_id(), mid.batch_index())
            p = pending.get(key)
            if p is not None and p.consumer is consumer:
                heapq.heappush(self._heap, (due, next(self._seq), key, p))

    def expire(self, now: float, pending: dict, redeliver: list) -> int:
        """Deliveries due by `now` still unacknowledged go to `redeliver`; how many. One
        acknowledged, given back or held by a transaction since has left `pending`."""
        heap, n = self._heap, 0
        while heap and heap[0][0] <= now:
            _, _, key, p = heapq.heappop(heap)
            if pending.get(key) is p:
                del pending[key]
                heapq.heappush(redeliver, key)
                n += 1
        return n

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None
