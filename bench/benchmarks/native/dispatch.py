"""asv: the subscription's dispatch loops, one entry of 1000 messages (native and twin)."""

from pulsartxn._native import load

from ._dispatch import buffer_entry, columns, take_all


class Dispatch:
    params = ["native", "reference"]
    param_names = ["impl"]

    def setup(self, impl):
        self.impl = load(impl)
        self.cols = columns()
        self.items = list(buffer_entry(self.impl, self.cols))

    def time_buffer_messages(self, impl):
        buffer_entry(self.impl, self.cols)

    def time_take_buffered(self, impl):
        take_all(self.impl, self.items)
