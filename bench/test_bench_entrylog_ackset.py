"""pytest-benchmark: entry codec, entry log append, AckSet and PendingAckIndex, native and twin.

Run: pytest bench/ --benchmark-only --benchmark-group-by=func
"""

from __future__ import annotations

import os

import lmdb
import pytest


@pytest.fixture(scope="module")
def values():
    return [os.urandom(100) for _ in range(100_000)]


def test_encode_entries(benchmark, impl, values):
    data = values if impl.kind == "native" else values[:10_000]
    benchmark.extra_info["items"] = len(data)
    entries = benchmark(impl.encode_entries, data, batch_size=1000)
    assert sum(impl.decode_header(e).message_count for e in entries) == len(data)


def test_decode_entries(benchmark, impl, values):
    data = values if impl.kind == "native" else values[:10_000]
    entries = impl.encode_entries(data, batch_size=1000)
    ids = list(range(len(entries)))
    benchmark.extra_info["items"] = len(data)
    decoded = benchmark(impl.decode_entries, ids, entries)
    assert decoded.num_messages == len(data)


def test_append_messages(benchmark, impl, values, tmp_path):
    env = lmdb.open(str(tmp_path / "env"), map_size=4 << 30, max_dbs=2, sync=False)
    log = impl.EntryLog(env, b"ledger/bench")
    data = values if impl.kind == "native" else values[:10_000]

    def append():
        with env.begin(write=True) as txn:
            return log.append_messages(txn, data, batch_size=1000)

    benchmark.extra_info["items"] = len(data)
    first, counts = benchmark(append)
    assert sum(counts) == len(data)
    env.close()


@pytest.mark.parametrize("size", [64, 1000, 65536])
def test_ackset_overlap_and_union(benchmark, impl, size):
    a, b = impl.AckSet(size), impl.AckSet(size)
    a.set_range(0, size // 2)
    b.set_range(size // 2, size)

    def run():
        return a.overlaps(b), a | b

    overlap, union = benchmark(run)
    assert not overlap and union.is_full()


def test_pending_ack_churn(benchmark, impl):
    acks = [impl.AckSet(100) for _ in range(4)]
    for j, a in enumerate(acks):
        a.set_range(j * 25, (j + 1) * 25)

    def run():
        idx = impl.PendingAckIndex()
        for e in range(200):
            for t in range(4):
                idx.add(1, e, t, acks[t])
        return sum(len(idx.release(t)) for t in range(4))

    assert benchmark(run) == 800
