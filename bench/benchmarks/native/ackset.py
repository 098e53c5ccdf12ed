"""asv: AckSet overlap and union, PendingAckIndex churn (native and twin)."""

from pulsartxn._native import load


class AckSetOps:
    params = (["native", "reference"], [64, 1000, 65536])
    param_names = ["impl", "size"]

    def setup(self, impl, size):
        i = load(impl)
        self.a, self.b = i.AckSet(size), i.AckSet(size)
        self.a.set_range(0, size // 2)
        self.b.set_range(size // 2, size)

    def time_overlaps(self, impl, size):
        self.a.overlaps(self.b)

    def time_union(self, impl, size):
        self.a | self.b


class PendingAck:
    params = ["native", "reference"]
    param_names = ["impl"]

    def setup(self, impl):
        self.impl = load(impl)
        self.acks = [self.impl.AckSet(100) for _ in range(4)]
        for j, a in enumerate(self.acks):
            a.set_range(j * 25, (j + 1) * 25)

    def time_add_release(self, impl):
        idx = self.impl.PendingAckIndex()
        for e in range(200):
            for t in range(4):
                idx.add(1, e, t, self.acks[t])
        for t in range(4):
            idx.release(t)
