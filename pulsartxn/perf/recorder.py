"""What a perf run measured: a fixed-size latency histogram and the run's counters.

The histogram is log-linear, as HdrHistogram's: latencies are integer nanoseconds; below 256 ns
each value has a bucket of its own, above it every power of two [2^m, 2^(m+1)) is cut into 128
buckets of equal width. A bucket is then at most 1/128 of its values wide, and a percentile
read at its middle is within 0.4% of the recorded value, from 1 ns to 2^48 ns (3.3 days; longer
is counted in the last bucket). Its size is fixed (5,376 counters, 43 KB) whatever the run's
length: numpy's cumulative sum reads any percentile from it. Mean, min and max are exact.
"""

from __future__ import annotations

import threading
import time

import numpy as np

_SUB_BITS = 7
_SUB = 1 << _SUB_BITS  # buckets per power of two
_MAX_SHIFT = 48 - _SUB_BITS - 1
_BUCKETS = (_MAX_SHIFT + 2) * _SUB
PERCENTILES = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99)


def _index(ns: int) -> int:
    if ns < 2 * _SUB:
        return max(ns, 0)
    shift = min(ns.bit_length() - _SUB_BITS - 1, _MAX_SHIFT)
    return min(shift * _SUB + (ns >> shift), _BUCKETS - 1)


def _bucket_middles() -> np.ndarray:
    idx = np.arange(_BUCKETS, dtype=np.float64)
    shift = np.maximum(np.arange(_BUCKETS) // _SUB - 1, 0)
    low = np.where(idx < 2 * _SUB, idx, (np.arange(_BUCKETS) % _SUB + _SUB) * 2.0**shift)
    return low + (2.0**shift - 1) / 2.0


_MIDDLES = _bucket_middles()


class Histogram:
    """Latencies in seconds, kept in a fixed number of log-linear buckets (not thread-safe:
    the Recorder holds the lock)."""

    __slots__ = ("counts", "count", "total_ns", "min_ns", "max_ns")

    def __init__(self) -> None:
        self.counts = np.zeros(_BUCKETS, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        self.counts[:] = 0
        self.count = 0
        self.total_ns = 0
        self.min_ns = 0
        self.max_ns = 0

    def record(self, seconds: float) -> None:
        """Count one latency."""
        ns = max(int(seconds * 1e9), 0)
        self.counts[_index(ns)] += 1
        if not self.count or ns < self.min_ns:
            self.min_ns = ns
        if ns > self.max_ns:
            self.max_ns = ns
        self.count += 1
        self.total_ns += ns

    def record_many(self, seconds) -> None:
        """Count every latency of a sequence (a numpy array or a list of floats)."""
        for s in np.asarray(seconds, dtype=np.float64).tolist():
            self.record(s)

    def percentile(self, q: float) -> float | None:
        """The latency in seconds that q percent of the recorded ones do not exceed (the
        nearest rank, read at its bucket's middle and kept within [min, max])."""
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"a percentile is in 0..100, not {q!r}")
        if not self.count:
            return None
        return self._at(np.cumsum(self.counts), q) / 1e9

    def _at(self, cum: np.ndarray, q: float) -> float:
        rank = max(int(np.ceil(q / 100.0 * self.count)), 1)
        i = int(np.searchsorted(cum, rank))
        if rank >= self.count or i == _BUCKETS - 1:
            return float(self.max_ns)  # the top (and the overflow bucket) is the exact max
        return float(min(max(_MIDDLES[i], self.min_ns), self.max_ns))

    def summary_ms(self) -> dict:
        """mean, p50 ... p99.99 and max in milliseconds (None for each when empty)."""
        keys = ["mean", *(f"p{q:g}" for q in PERCENTILES), "max"]
        if not self.count:
            return dict.fromkeys(keys)
        out = {"mean": round(self.total_ns / self.count / 1e6, 3)}
        cum = np.cumsum(self.counts)
        for q in PERCENTILES:
            out[f"p{q:g}"] = round(self._at(cum, q) / 1e6, 3)
        out["max"] = round(self.max_ns / 1e6, 3)
        return out

    def buckets_ms(self) -> tuple[np.ndarray, np.ndarray]:
        """(middle of each non-empty bucket in ms, its count): what a plot draws."""
        nz = np.nonzero(self.counts)[0]
        return _MIDDLES[nz] / 1e6, self.counts[nz].copy()


class Recorder:
    """Every worker's operations: counts, failures by exception type, latencies, the busy
    interval (first operation's start to last completion) and one sample per second."""

    def __init__(self, stop: threading.Event, limit: int = 0) -> None:
        self.stop = stop
        self.limit = limit  # operations to start (0: until the duration ends or input drains)
        self.lock = threading.Lock()
        self.started = 0
        self.ops = 0
        self.msgs = 0
        self.bytes = 0
        self.aborted = 0  # txn mode: transactions ended by abort on purpose
        self.failures: dict[str, int] = {}
        self.commit_failures: dict[str, int] = {}
        self.latency = Histogram()
        self.abort_latency = Histogram()
        self.interval = Histogram()
        self.first_start: float | None = None
        self.last_end: float | None = None
        # start of the first empty receive since the last completion: nothing has arrived since
        self.quiet_since: float | None = None
        self.samples: list[dict] = []  # one per progress tick: time, msgs/s, ops/s, p50, p99
        self._last = (0, 0, 0.0)

    def claim(self) -> bool:
        """May one more operation start? False once the count is reached or the run stops."""
        with self.lock:
            if self.stop.is_set() or (self.limit and self.started >= self.limit):
                return False
            self.started += 1
            return True

    def unclaim(self, start: float) -> None:
        """The claimed receive that began at `start` found nothing: it did not happen, and
        nothing arrived since `start` (or the last completion, if later) until one completes."""
        with self.lock:
            self.started -= 1
            if self.quiet_since is None:
                self.quiet_since = max(start, self.last_end or start)

    def quiet_seconds(self, now: float) -> float:
        """How long nothing has arrived, as empty receives saw it (0 until one was empty)."""
        with self.lock:
            return 0.0 if self.quiet_since is None else now - self.quiet_since

    def _busy(self, start: float, end: float) -> None:
        self.quiet_since = None
        if self.first_start is None or start < self.first_start:
            self.first_start = start
        if self.last_end is None or end > self.last_end:
            self.last_end = end

    def add(self, msgs: int, nbytes: int, start: float, aborted: bool = False) -> None:
        """An operation that began at `start` (time.perf_counter) completed now."""
        end = time.perf_counter()
        with self.lock:
            self.ops += 1
            self.msgs += msgs
            self.bytes += nbytes
            self._busy(start, end)
            if aborted:
                self.aborted += 1
                self.abort_latency.record(end - start)
            else:
                self.latency.record(end - start)
                self.interval.record(end - start)
            self._finish()

    def fail(self, exc: BaseException, start: float, op: bool = True) -> None:
        """What began at `start` failed now, counted by the exception's type: an operation, or
        (op=False) a commit that ended operations already counted."""
        end = time.perf_counter()
        with self.lock:
            name = type(exc).__name__
            if op:
                self.failures[name] = self.failures.get(name, 0) + 1
            else:
                self.commit_failures[name] = self.commit_failures.get(name, 0) + 1
            self._busy(start, end)
            self._finish()

    def _finish(self) -> None:
        if self.limit and self.ops + sum(self.failures.values()) >= self.limit:
            self.stop.set()

    def done(self) -> int:
        with self.lock:
            return self.ops + sum(self.failures.values())

    def busy_seconds(self) -> float:
        with self.lock:
            if self.first_start is None:
                return 0.0
            return max(self.last_end - self.first_start, 1e-9)

    def sample(self, t: float) -> dict:
        """The progress since the last sample (t: seconds since the run began), kept."""
        with self.lock:
            ops, msgs, last_t = self._last
            dt = max(t - last_t, 1e-9)
            s = {
                "t": round(t, 3),
                "msgs_per_s": round((self.msgs - msgs) / dt, 1),
                "ops_per_s": round((self.ops - ops) / dt, 1),
                "p50_ms": _ms(self.interval.percentile(50.0)),
                "p99_ms": _ms(self.interval.percentile(99.0)),
                "failures": sum(self.failures.values()),
            }
            self.interval.reset()
            self._last = (self.ops, self.msgs, t)
            self.samples.append(s)
            return s


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)
