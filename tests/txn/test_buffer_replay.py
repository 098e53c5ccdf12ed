"""Recovery replays the ledger's transactional headers in bulk (TransactionBuffer.replay_columns):
the state must be exactly what replaying entry by entry gives, and what the broker had."""

from __future__ import annotations

import random

import lmdb
import numpy as np
import pytest

import pulsartxn
from pulsartxn._native import header_columns
from pulsartxn.txn.buffer import TransactionBuffer
from pulsartxn.txn.snapshot import DB as SNAPSHOT_DB


def _state(buffer):
    return (
        list(buffer.ongoing.items()),  # order matters: the first is the max read position
        dict(buffer.abort_positions),
        sorted(int(t) for t in buffer.abort_positions if t in buffer.aborts),
    )


def _drop_snapshots(path) -> None:
    env = lmdb.open(str(path), max_dbs=16_384, map_size=1 << 40)
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(SNAPSHOT_DB, txn=txn), delete=False)
    finally:
        env.close()


@pytest.mark.parametrize("seed", range(4))
def test_bulk_replay_equals_entry_by_entry_and_the_live_state(tmp_path, seed):
    rng = random.Random(seed)
    data = tmp_path / "data"
    with pulsartxn.Broker(data, sync=False, num_coordinators=3) as broker:
        broker.create_topic("t", partitions=2)
        # A network session's transactions outlive a close (in-process ones are aborted).
        client = broker.client(session="replay-session")
        producer = client.create_producer("t", batching_max_messages=3)
        live = []
        for i in range(300):
            roll = rng.random()
            if roll < 0.15:
                producer.send_batch([b"plain"] * rng.randrange(1, 4))
            elif roll < 0.55 or not live:
                txn = client.new_transaction()
                producer.send_batch([b"m%d" % i] * rng.randrange(1, 7), txn=txn)
                live.append(txn)
            else:
                txn = live.pop(rng.randrange(len(live)))
                if rng.random() < 0.5:
                    txn.commit()
                else:
                    txn.abort()
        # Some stay open: their first entries hold back the max read position.
        partitions = broker.topic_partitions("t")
        before = {topic: _state(broker.topics.partition(topic).buffer) for topic in partitions}
        scan_before = sorted(r["value"] for b in client.scan("t") for r in b.to_pylist())
    _drop_snapshots(data)
    with pulsartxn.Broker(data, sync=False, num_coordinators=3) as broker:
        client = broker.client()
        for topic, state in before.items():
            part = broker.topics.partition(topic)
            assert _state(part.buffer) == state
            # The same ledger replayed one entry at a time, as before the bulk path.
            one_by_one = TransactionBuffer(part)
            with broker.storage.read() as txn:
                rows = list(txn.cursor(db=part.log.db))
            ids = np.array([int.from_bytes(bytes(k), "big") for k, _ in rows], np.int64)
            _, markers, msb, lsb = header_columns([bytes(v) for _, v in rows])
            for i in np.flatnonzero((msb != 0) | (lsb != 0)).tolist():
                one_by_one.replay(int(ids[i]), int(markers[i]), int(msb[i]), int(lsb[i]))
            assert _state(one_by_one) == state
        assert sorted(r["value"] for b in client.scan("t") for r in b.to_pylist()) == scan_before
