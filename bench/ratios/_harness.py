"""Timing helpers for the ratio figures: best-of-N wall time, both sides in the same run."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median


@dataclass
class Row:
    figure: str  # what was measured, e.g. "AbortSet.contains_many, 1M probes, 1k members"
    items: int  # items processed per call (messages, probes, ids, ...)
    unit: str  # what an item is: "probes", "msgs", "ids", ...
    native_s: float  # best seconds per call, native
    baseline_s: float  # best seconds per call, baseline
    baseline: str  # what the baseline is: "twin", "raw lmdb putmulti", ...
    target: float | None = None  # the ratio (native rate / baseline rate) the issue asks for

    @property
    def ratio(self) -> float:
        return self.baseline_s / self.native_s

    @property
    def rate(self) -> float:
        return self.items / self.native_s


def best_time(fn: Callable[[], object], repeat: int = 5, min_time: float = 0.05) -> float:
    """Best wall time of one call of fn over `repeat` rounds (each round loops until min_time)."""
    fn()  # warm up
    best = float("inf")
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            n = 0
            start = time.perf_counter()
            while True:
                fn()
                n += 1
                elapsed = time.perf_counter() - start
                if elapsed >= min_time:
                    break
            best = min(best, elapsed / n)
    finally:
        if gc_was:
            gc.enable()
    return best


def timed(fn: Callable[[], object]) -> float:
    """Wall time of one call of fn."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired(
    figure: str, items: int, unit: str, ours: list[float], base: list[float], baseline: str, target
) -> Row:
    """A Row from alternating rounds: its ratio is the median of the per-round ratios (the
    machine is noisy; a pair shares its moment) and its time is our median."""
    ratio = median(b / o for o, b in zip(ours, base))
    native = median(ours)
    return Row(figure, items, unit, native, native * ratio, baseline, target)


def alternating(rounds: int, ours, base) -> tuple[list[float], list[float]]:
    """(ours(r) for each round r, base(r) for each): which of them goes first alternates, as
    the VM's pace drifts, so each round's pair shares its moment (``paired`` takes their
    ratios)."""
    mine, theirs = [], []
    for r in range(rounds):
        if r % 2:
            mine.append(ours(r))
            theirs.append(base(r))
        else:
            theirs.append(base(r))
            mine.append(ours(r))
    return mine, theirs
