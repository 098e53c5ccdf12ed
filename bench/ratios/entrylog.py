"""Entry codec and entry log: native vs twin, and our append vs raw py-lmdb putmulti."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time

import lmdb
import pyarrow as pa

from pulsartxn._native import load

from ._harness import Row, best_time

N_MESSAGES = 1_000_000
PER_ENTRY = 1000
PAYLOAD = 100


def _timed_writes(env, db, write, repeat: int) -> float:
    """Best time of write(txn) + commit, on an emptied database each round."""
    best = float("inf")
    for _ in range(repeat):
        with env.begin(write=True) as txn:
            txn.drop(db, delete=False)
        start = time.perf_counter()
        with env.begin(write=True) as txn:
            write(txn)
        best = min(best, time.perf_counter() - start)
    return best


def measure(quick: bool = False) -> list[Row]:
    native, twin = load("native"), load("reference")
    twin_n = 20_000 if quick else 100_000
    values = [os.urandom(PAYLOAD) for _ in range(N_MESSAGES)]
    rows = []

    # Encode + append through the entry log vs raw putmulti of the same bytes.
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-")
    try:
        env = lmdb.open(tmp, map_size=8 << 30, max_dbs=4, sync=False, metasync=False)
        log = native.EntryLog(env, b"ledger/bench")
        raw_db = env.open_db(b"raw")
        entries = native.encode_entries(values, batch_size=PER_ENTRY)
        pack = struct.Struct(">Q").pack
        raw_rows = [(pack(i), e) for i, e in enumerate(entries)]

        arrow_values = pa.array(values, pa.binary())

        def raw(txn):
            txn.cursor(db=raw_db).putmulti(raw_rows, append=True)

        repeat = 3 if quick else 5
        for label, data in (("list of bytes", values), ("Arrow array", arrow_values)):

            def ours(txn, data=data):
                log.append_messages(txn, data, batch_size=PER_ENTRY)

            ours_s = _timed_writes(env, log.db, ours, repeat)
            raw_s = _timed_writes(env, raw_db, raw, repeat)
            rows.append(
                Row(
                    f"encode + append, 1M msgs x {PAYLOAD} B from a {label}, {PER_ENTRY}/entry",
                    N_MESSAGES,
                    "msgs",
                    ours_s,
                    raw_s,
                    "raw lmdb putmulti (same bytes)",
                    0.8,
                )
            )
        env.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ids = list(range(len(entries)))
    native_s = best_time(lambda: native.decode_entries(ids, entries), repeat=3)
    k = max(1, twin_n // PER_ENTRY)
    twin_s = best_time(lambda: twin.decode_entries(ids[:k], entries[:k]), repeat=2) * (
        len(entries) / k
    )
    rows.append(
        Row(
            "decode_entries, 1M msgs into columns", N_MESSAGES, "msgs", native_s, twin_s, "twin", 20
        )
    )

    native_s = best_time(lambda: native.encode_entries(values, batch_size=PER_ENTRY), repeat=3)
    twin_s = best_time(
        lambda: twin.encode_entries(values[:twin_n], batch_size=PER_ENTRY), repeat=2
    ) * (N_MESSAGES / twin_n)
    rows.append(Row("encode_entries, 1M msgs", N_MESSAGES, "msgs", native_s, twin_s, "twin", 20))

    blob = os.urandom(16 << 20)
    small = blob[: 1 << 16]
    native_s = best_time(lambda: native.crc32c(blob))
    twin_s = best_time(lambda: twin.crc32c(small), repeat=2) * (len(blob) / len(small))
    rows.append(Row("crc32c, 16 MiB", len(blob), "B", native_s, twin_s, "twin", 20))
    return rows
