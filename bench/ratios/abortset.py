"""AbortSet.contains_many: native vs twin, in one run."""

from __future__ import annotations

import numpy as np

from pulsartxn._native import load

from ._harness import Row, best_time


def _members(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    coordinator = rng.integers(0, 16, n, dtype=np.uint64)
    sequence = rng.choice(1 << 40, size=n, replace=False).astype(np.uint64)
    return coordinator << np.uint64(48), sequence


def measure(quick: bool = False) -> list[Row]:
    native, twin = load("native"), load("reference")
    rng = np.random.default_rng(1)
    probes = 1_000_000
    twin_probes = 20_000 if quick else 100_000
    rows = []
    for members in (1_000, 1_000_000):
        msb, lsb = _members(members, rng)
        ns, ts = native.AbortSet(), twin.AbortSet()
        ns.add_many(msb, lsb)
        ts.add_many(msb, lsb)
        # Half the probes hit a member, half miss (a plain entry of another transaction).
        pick = rng.integers(0, members, probes)
        p_msb = msb[pick].copy()
        p_lsb = lsb[pick] + (rng.integers(0, 2, probes, dtype=np.uint64) << np.uint64(41))
        native_s = best_time(lambda: ns.contains_many(p_msb, p_lsb))
        t_msb, t_lsb = p_msb[:twin_probes], p_lsb[:twin_probes]
        twin_s = best_time(lambda: ts.contains_many(t_msb, t_lsb), repeat=3) * (
            probes / twin_probes
        )
        rows.append(
            Row(
                f"AbortSet.contains_many, 1M probes, {members:,} members",
                probes,
                "probes",
                native_s,
                twin_s,
                "twin",
                20,
            )
        )
    return rows
