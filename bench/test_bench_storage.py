"""pytest-benchmark: the synced store's journal, synced small writes with it and without it
(LMDB syncing itself), the recorder of a group's writes and the journal's overlapped write
(native and twin).

Run: pytest bench/ --benchmark-only --benchmark-group-by=func
"""

from __future__ import annotations

import os

import pytest

from bench.benchmarks.storage._journal import (
    direct_file,
    overlapped_writes,
    record_group,
    recorder_env,
    small_writes,
)
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


def test_overlapped_appends(benchmark, tmp_path, impl):
    env, handles = recorder_env(str(tmp_path / "env"))
    fd, stage = direct_file(str(tmp_path / "journal"))
    try:
        benchmark(overlapped_writes, impl, fd, stage, env, handles, 20)
    finally:
        os.close(fd)
        env.close()
