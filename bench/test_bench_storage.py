"""pytest-benchmark: the synced store's journal, synced small writes with it and without it
(LMDB syncing itself), and the recorder of a group's writes (native and twin).

Run: pytest bench/ --benchmark-only --benchmark-group-by=func
"""

from __future__ import annotations

import pytest

from bench.benchmarks.storage._journal import record_group, recorder_env, small_writes
from pulsartxn.storage import Storage


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "lmdb-sync"])
def test_synced_small_writes(benchmark, tmp_path, journal):
    storage = Storage(str(tmp_path / "s"), sync=True, journal=journal)
    try:
        benchmark(small_writes, storage, 50)
    finally:
        storage.close()


def test_record_a_group(benchmark, tmp_path, impl):
    env, handles = recorder_env(str(tmp_path))

    def one():
        with env.begin(write=True) as txn:
            record_group(impl, txn, handles)
            txn.abort()

    try:
        benchmark(one)
    finally:
        env.close()
