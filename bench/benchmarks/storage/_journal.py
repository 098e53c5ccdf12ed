"""Workloads shared by the journal's ratio rows, asv suite and pytest-benchmark benches."""

from __future__ import annotations

import os

import lmdb

import pulsartxn
from pulsartxn.storage import Storage

GROUP = [(b"k%02d" % i, os.urandom(200)) for i in range(20)]  # a small group's writes


def record_group(impl, txn, handles) -> bytes:
    """One group's writes through impl's recorder: puts, a cursor putmulti and deletes, in
    the proportions of a transaction's commit (ledger entry, marker, log records, cursor)."""
    rec = impl.Recorder(handles["names"])
    view = impl.RecordingTxn(txn, rec)
    a, b = handles["a"], handles["b"]
    for key, value in GROUP[:8]:
        view.put(key, value, db=a)
    view.cursor(db=b).putmulti(GROUP[8:12])
    for key, _ in GROUP[:5]:
        view.delete(key, db=a)
    return rec.payload()


def recorder_env(path: str):
    env = lmdb.open(path, max_dbs=4, map_size=1 << 28, sync=False)
    with env.begin(write=True) as txn:
        a = env.open_db(b"a", txn=txn, create=True)
        b = env.open_db(b"b", txn=txn, create=True)
    return env, {"a": a, "b": b, "names": {id(a): b"a", id(b): b"b"}}


def small_writes(storage: Storage, n: int) -> None:
    """n synced groups of one 100-byte put each, one after the other (each waits for its own)."""
    db = storage.open_db(b"w")
    value = os.urandom(100)
    for i in range(n):
        storage.write(lambda txn, i=i: txn.put(b"%08d" % i, value, db=db))


def pipeline(broker, n: int, batch: int = 100) -> None:
    """The exactly-once consume-process-produce loop of bench/peers on `broker`: receive a
    batch, send a result per input and acknowledge the last input cumulatively, in one
    transaction."""
    client = broker.client()
    client.create_producer("in").send_batch([os.urandom(100) for _ in range(n)])
    consumer = client.subscribe("in", "fn")
    out = client.create_producer("out")
    done = 0
    while done < n:
        msgs = consumer.batch_receive(batch, 1000)
        txn = client.new_transaction()
        for m in msgs:
            out.send_async(m.data()[::-1], txn=txn)
        consumer.acknowledge_cumulative(msgs[-1], txn=txn)
        txn.commit()
        done += len(msgs)


def open_broker(path: str, journal: bool):
    return pulsartxn.Broker(path, sync=True, journal=journal)
