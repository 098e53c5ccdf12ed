"""AckSet overlap and merge, PendingAckIndex add/check/release: native vs twin."""

from __future__ import annotations

import random

from pulsartxn._native import load

from ._harness import Row, best_time


def _pair(impl, size: int, seed: int):
    rng = random.Random(seed)
    a, b = impl.AckSet(size), impl.AckSet(size)
    for i in rng.sample(range(size), size // 3):
        a.set(i)
    # b holds only indexes a does not: overlap must scan every word (the worst case).
    for i in range(size):
        if not a.test(i) and rng.random() < 0.5:
            b.set(i)
    return a, b


def measure(quick: bool = False) -> list[Row]:
    native, twin = load("native"), load("reference")
    rows = []
    calls = 1000
    for size in (64, 1000, 1 << 16):
        na, nb = _pair(native, size, size)
        ta, tb = _pair(twin, size, size)
        assert na.overlaps(nb) is False and ta.overlaps(tb) is False
        n_s = best_time(lambda: [na.overlaps(nb) for _ in range(calls)])
        t_s = best_time(lambda: [ta.overlaps(tb) for _ in range(calls)], repeat=3)
        rows.append(Row(f"AckSet.overlaps, {size} bits", calls, "ops", n_s, t_s, "twin", 20))
        n_s = best_time(lambda: [na | nb for _ in range(calls)])
        t_s = best_time(lambda: [ta | tb for _ in range(calls)], repeat=3)
        rows.append(Row(f"AckSet union, {size} bits", calls, "ops", n_s, t_s, "twin", 20))

    def churn(impl, n_entries: int):
        idx = impl.PendingAckIndex()
        acks = [impl.AckSet(100) for _ in range(4)]
        for j, a in enumerate(acks):
            a.set_range(j * 25, (j + 1) * 25)

        def run():
            for e in range(n_entries):
                for t in range(4):
                    idx.add(1, e, t, acks[t])
                idx.check(1, e, 9, acks[0])
            for t in range(4):
                idx.release(t)

        return run

    n = 500
    n_s = best_time(churn(native, n), repeat=3)
    t_s = best_time(churn(twin, n), repeat=3)
    rows.append(
        Row("PendingAckIndex add x4 + check + release", n * 5, "ops", n_s, t_s, "twin", None)
    )
    return rows
