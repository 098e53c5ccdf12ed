"""Fixed-bucket histograms the storage layer keeps for its stats and the metrics endpoint."""

from __future__ import annotations

from bisect import bisect_left

# Seconds: a journal write or fdatasync, a group commit (100 µs .. 2.5 s, then +Inf).
LATENCY_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
LATENCY_S += (1.0, 2.5)
# Records in one group commit.
GROUP_RECORDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Buckets:
    """Observations counted per bucket (upper bounds, inclusive; the last bucket is +Inf) and
    summed. One writer at a time (the holder of the commit lock): no lock of its own; a reader
    may see a sum one observation ahead of the counts."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> dict:
        """``{"buckets": {bound: count in that bucket alone}, "count", "sum"}``; the last
        bound is ``"+Inf"``."""
        counts = list(self.counts)
        names = [_bound(b) for b in self.bounds] + ["+Inf"]
        return {"buckets": dict(zip(names, counts)), "count": sum(counts), "sum": self.sum}


def _bound(b: float) -> str:
    return str(int(b)) if float(b).is_integer() else repr(float(b))
