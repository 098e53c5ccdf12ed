"""Workloads shared by the journal's ratio rows, asv suite and pytest-benchmark benches."""

from __future__ import annotations

import mmap
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


RECORD = 16384  # a journal record of a transaction of 100 messages of 100 B


def direct_file(path: str):
    """(descriptor, aligned staging buffer) of a zero-filled 4 MiB file opened for direct
    writes (through the page cache where the file system has no direct I/O)."""
    with open(path, "wb") as f:
        f.write(bytes(256 * RECORD))
        os.fsync(f.fileno())
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        fd = os.open(path, os.O_WRONLY)
    stage = mmap.mmap(-1, RECORD)
    stage[:] = os.urandom(RECORD)
    return fd, stage


def overlapped_writes(impl, fd: int, stage, env, handles, n: int) -> None:
    """n journal appends as the group commit makes them: a record's write started through
    impl's AsyncWriter, the LMDB commit of a transaction's group meanwhile (a ledger entry of
    100 messages, then small puts in a second database), then the wait and the fdatasync. The
    native writer overlaps the two; the twin writes first."""
    writer = impl.AsyncWriter(fd)
    record = memoryview(stage)[:RECORD]
    a, b = handles["a"], handles["b"]
    entry = bytes(stage[:12000])
    try:
        for i in range(n):
            writer.start(record, (i % 256) * RECORD)
            with env.begin(write=True) as txn:
                txn.put(b"e%08d" % i, entry, db=b)
                for key, value in GROUP:
                    txn.put(key, value, db=a)
            writer.wait()
            os.fdatasync(fd)
    finally:
        writer.close()


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
    consumer = client.subscribe("in", "fn", initial_position=pulsartxn.InitialPosition.Earliest)
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
