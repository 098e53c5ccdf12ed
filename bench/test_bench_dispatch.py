"""pytest-benchmark: the subscription's dispatch loops, one entry of 1000 messages (native and
twin).

Run: pytest bench/ --benchmark-only --benchmark-group-by=func
"""

from __future__ import annotations

from bench.benchmarks.native._dispatch import buffer_entry, columns, take_all


def test_buffer_messages(benchmark, impl):
    cols = columns()
    benchmark(buffer_entry, impl, cols)


def test_take_buffered(benchmark, impl):
    items = list(buffer_entry(impl, columns()))
    benchmark(take_all, impl, items)
