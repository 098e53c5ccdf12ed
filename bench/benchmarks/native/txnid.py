"""asv: TxnID allocation and packing, native and twin (the twin's figure is the baseline)."""

from pulsartxn._native import load


class Allocate:
    params = ["native", "reference"]
    param_names = ["impl"]

    def setup(self, impl):
        self.impl = load(impl)
        self.allocator = self.impl.TxnIdAllocator(1)
        self.n = 1_000_000 if impl == "native" else 50_000
        self.ids = [self.impl.TxnID(1, i) for i in range(10_000)]

    def time_allocate(self, impl):
        self.allocator.allocate(self.n)

    def time_next_10k(self, impl):
        allocator = self.allocator
        for _ in range(10_000):
            allocator.next()

    def time_pack_unpack_10k(self, impl):
        unpack = self.impl.TxnID.unpack
        for t in self.ids:
            unpack(t.pack())
