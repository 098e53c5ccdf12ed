"""Produce, consume and scan through the broker vs raw py-lmdb putmulti, in one run.

The baseline is raw py-lmdb: one 100-byte value per message, put with putmulti(append=True) in
one write transaction, same sync setting (off) as the broker here.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import threading
import time
from statistics import median

import lmdb
import pyarrow as pa

import pulsartxn

from ._harness import Row, timed

PAYLOAD = 100


class _RawLog:
    """The baseline: raw py-lmdb, one entry per message, appended with putmulti(append=True)
    in one write transaction per call, to a log that grows as the broker's does."""

    def __init__(self, path: str) -> None:
        self.env = lmdb.open(path, map_size=64 << 30, max_dbs=2, sync=False, metasync=False)
        self.db = self.env.open_db(b"raw")
        self.next = 0
        self.pack = struct.Struct(">Q").pack

    def append(self, values: list[bytes]) -> float:
        pack, first = self.pack, self.next
        rows = [(pack(first + i), v) for i, v in enumerate(values)]
        start = time.perf_counter()
        with self.env.begin(write=True) as txn:
            txn.cursor(db=self.db).putmulti(rows, append=True)
        elapsed = time.perf_counter() - start
        self.next += len(values)
        return elapsed

    def close(self) -> None:
        self.env.close()


def measure(quick: bool = False) -> list[Row]:
    n_bulk = 1_000_000
    n_single = 50_000 if quick else 200_000
    n_consume = 20_000 if quick else 100_000
    values = [os.urandom(PAYLOAD) for _ in range(n_bulk)]
    rows = []
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-")
    raw = _RawLog(os.path.join(tmp, "raw"))
    try:
        with pulsartxn.Broker(os.path.join(tmp, "d"), sync=False) as broker:
            client = broker.client()
            producer = client.create_producer("bulk")
            arrow_values = pa.array(values, pa.binary())
            # Rounds alternate between the baseline and us, so both see the same machine state
            # (page cache, dirty-page writeback) as their logs grow.
            # Each of our rounds is paired with the baseline round just before it; the figure is
            # the median over the pairs, so one lucky or unlucky round moves neither side.
            raw_list, ours_list, raw_arrow, ours_arrow = [], [], [], []
            for _ in range(3):
                raw_list.append(raw.append(values))
                ours_list.append(timed(lambda: producer.send_batch(values)))
                raw_arrow.append(raw.append(values))
                ours_arrow.append(timed(lambda: producer.send_batch(arrow_values)))
            rows.append(
                Row(
                    "send_batch, 1M msgs x 100 B (list of bytes)",
                    n_bulk,
                    "msgs",
                    median(ours_list),
                    median(raw_list),
                    "raw lmdb putmulti, 1 entry/msg",
                    1.0,
                )
            )
            rows.append(
                Row(
                    "send_batch, 1M msgs x 100 B (Arrow array)",
                    n_bulk,
                    "msgs",
                    median(ours_arrow),
                    median(raw_arrow),
                    "raw lmdb putmulti, 1 entry/msg",
                    1.0,
                )
            )
            raw_best = median(raw_list + raw_arrow)
            raw_single = raw_best * n_single / n_bulk
            raw_s = raw_best

            single = values[:n_single]
            p2 = client.create_producer("single")

            def send_async_all():
                for v in single:
                    p2.send_async(v)
                p2.flush()

            best = min(timed(send_async_all) for _ in range(2))
            rows.append(
                Row(
                    "send_async per message + flush (batching)",
                    n_single,
                    "msgs",
                    best,
                    raw_single,
                    "raw lmdb putmulti, 1 entry/msg",
                    0.3,
                )
            )
            p3 = client.create_producer("sync")
            k = 2_000
            t = timed(lambda: [p3.send(v) for v in single[:k]])
            rows.append(
                Row(
                    "send() one at a time, durable each (sync=False)",
                    k,
                    "msgs",
                    t,
                    raw_s * k / n_bulk,
                    "raw lmdb putmulti, 1 entry/msg",
                    None,
                )
            )

            total = 6 * n_bulk  # three list and three Arrow send_batch rounds
            start = time.perf_counter()
            scanned = sum(b.num_rows for b in client.scan("bulk"))
            scan_s = time.perf_counter() - start
            assert scanned == total
            rows.append(
                Row(
                    "scan into Arrow, 6M msgs",
                    total,
                    "msgs",
                    scan_s,
                    raw_s * total / n_bulk,
                    "raw lmdb putmulti (write), for scale",
                    None,
                )
            )

            consumer = client.subscribe(
                "single", "bench", initial_position=pulsartxn.InitialPosition.Earliest
            )

            def consume():
                for _ in range(n_consume):
                    consumer.acknowledge(consumer.receive(1000))

            t = timed(consume)
            rows.append(
                Row(
                    "receive + acknowledge per message",
                    n_consume,
                    "msgs",
                    t,
                    raw_s * n_consume / n_bulk,
                    "raw lmdb putmulti (write), for scale",
                    None,
                )
            )
            c2 = client.subscribe(
                "single", "bench-batch", initial_position=pulsartxn.InitialPosition.Earliest
            )

            def consume_batches():
                got = 0
                while got < n_consume:
                    msgs = c2.batch_receive(1000, 100)
                    for m in msgs:
                        c2.acknowledge(m)
                    got += len(msgs)

            t = timed(consume_batches)
            rows.append(
                Row(
                    "batch_receive(1000) + acknowledge",
                    n_consume,
                    "msgs",
                    t,
                    raw_s * n_consume / n_bulk,
                    "raw lmdb putmulti (write), for scale",
                    None,
                )
            )
            rows.append(_key_shared(client, values[:n_consume]))
    finally:
        raw.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _key_shared(client, values: list[bytes]) -> Row:
    """Two consumers draining keyed messages, each from a thread of its own (as consumers
    run): Key_Shared (each key on one consumer, in order) against Shared (anyone takes
    anything), same messages, same run."""
    keys = [f"key-{i % 100}" for i in range(len(values))]
    client.create_producer("keyed").send_batch(values, keys=keys)

    def drain(sub_type, name: str) -> float:
        consumers = [
            client.subscribe(
                "keyed",
                name,
                subscription_type=sub_type,
                initial_position=pulsartxn.InitialPosition.Earliest,
            )
            for _ in range(2)
        ]
        got, lock = [0], threading.Lock()

        def consume(c) -> None:
            while True:
                with lock:
                    if got[0] >= len(values):
                        return
                msgs = c.batch_receive(1000, 10)
                for m in msgs:
                    c.acknowledge(m)
                with lock:
                    got[0] += len(msgs)

        def run():
            threads = [threading.Thread(target=consume, args=(c,)) for c in consumers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        t = timed(run)
        for c in consumers:
            c.close()
        return t

    shared = drain(pulsartxn.ConsumerType.Shared, "shared")
    key_shared = drain(pulsartxn.ConsumerType.KeyShared, "key-shared")
    return Row(
        "Key_Shared, 2 consumers, a thread each: batch_receive(1000) + acknowledge, 100 keys",
        len(values),
        "msgs",
        key_shared,
        shared,
        "Shared, the same 2 consumers and messages",
        None,
    )
