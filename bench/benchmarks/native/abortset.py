"""asv: AbortSet.contains_many over 1M probes (twin: 50k), half hits, half misses."""

import numpy as np

from pulsartxn._native import load


class ContainsMany:
    params = (["native", "reference"], [1_000, 1_000_000])
    param_names = ["impl", "members"]
    timeout = 300

    def setup(self, impl, members):
        rng = np.random.default_rng(1)
        msb = np.full(members, 3 << 48, dtype=np.uint64)
        lsb = rng.choice(1 << 40, size=members, replace=False).astype(np.uint64)
        self.set = load(impl).AbortSet()
        self.set.add_many(msb, lsb)
        probes = 1_000_000 if impl == "native" else 50_000
        pick = rng.integers(0, members, probes)
        self.msb = msb[pick].copy()
        self.lsb = lsb[pick] + (rng.integers(0, 2, probes, dtype=np.uint64) << np.uint64(41))

    def time_contains_many(self, impl, members):
        self.set.contains_many(self.msb, self.lsb)

    def peakmem_table(self, impl, members):
        return self.set
