"""pytest-benchmark: begin + commit through the coordinators, and raw LMDB for scale."""

from __future__ import annotations

import lmdb
import pytest

import pulsartxn


@pytest.fixture(params=[False, True], ids=["nosync", "sync"])
def client(request, tmp_path):
    broker = pulsartxn.Broker(tmp_path / "d", sync=request.param)
    yield broker.client()
    broker.close()


def test_new_commit_empty(benchmark, client):
    def one():
        t = client.new_transaction()
        t.commit()
        return t.state

    assert benchmark(one) is pulsartxn.TxnState.COMMITTED


@pytest.mark.parametrize("sync", [False, True], ids=["nosync", "sync"])
def test_raw_lmdb_one_put_per_txn(benchmark, tmp_path, sync):
    env = lmdb.open(str(tmp_path / "raw"), sync=sync, metasync=sync)
    counter = iter(range(1 << 62))

    def one():
        with env.begin(write=True) as txn:
            return txn.put(next(counter).to_bytes(16, "big"), b"x" * 32)

    assert benchmark(one)
    env.close()
