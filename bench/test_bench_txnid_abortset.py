"""pytest-benchmark: TxnID allocation and AbortSet probes, native and twin side by side.

Run: pytest bench/ --benchmark-only --benchmark-group-by=func
"""

from __future__ import annotations

import numpy as np
import pytest


def test_allocate_ids(benchmark, impl):
    allocator = impl.TxnIdAllocator(1)
    n = 1_000_000 if impl.kind == "native" else 50_000
    benchmark.extra_info["items"] = n
    msb, _ = benchmark(allocator.allocate, n)
    assert len(msb) == n


@pytest.mark.parametrize("members", [1_000, 1_000_000])
def test_contains_many(benchmark, impl, members):
    rng = np.random.default_rng(1)
    msb = np.full(members, 3 << 48, dtype=np.uint64)
    lsb = rng.choice(1 << 40, size=members, replace=False).astype(np.uint64)
    aborted = impl.AbortSet()
    aborted.add_many(msb, lsb)
    probes = 1_000_000 if impl.kind == "native" else 50_000
    pick = rng.integers(0, members, probes)
    hits = rng.integers(0, 2, probes, dtype=np.uint64)
    p_msb, p_lsb = msb[pick].copy(), lsb[pick] + (hits << np.uint64(41))
    benchmark.extra_info["items"] = probes
    mask = benchmark(aborted.contains_many, p_msb, p_lsb)
    assert mask.sum() == (hits == 0).sum()
