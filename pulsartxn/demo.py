"""The main job on the embedded default: the native core end to end on a kept data directory.

Opens (or creates) an LMDB data directory, allocates TxnIDs from a coordinator's allocator
whose high-water mark is reserved durably, appends every transaction's messages to a
partition's ledger as batched entries, commits two transactions in three and aborts the third
(markers in the ledger, aborted ids in the partition's abort set, snapshotted), then reads the
whole ledger back read-committed: markers dropped, aborted messages filtered with one bulk
probe of the abort set. Runs again on the same directory continue where the last one stopped.
"""

from __future__ import annotations

import os
import struct
import time

import lmdb
import numpy as np

from pulsartxn._native import (
    IMPLEMENTATION,
    AbortSet,
    EntryLog,
    TxnIdAllocator,
    encode_entries,
    encode_entry,
)
from pulsartxn._native.types import MarkerType

_U128 = struct.Struct(">QQ")
PARTITION = b"persistent://public/default/demo-partition-0"


def run_core_demo(
    data_dir: str,
    transactions: int = 200,
    messages_per_txn: int = 500,
    payload_bytes: int = 100,
    sync: bool = True,
) -> list[str]:
    if transactions < 1 or messages_per_txn < 1 or payload_bytes < 0:
        raise ValueError("transactions and messages-per-txn must be at least 1, payload-bytes >= 0")
    os.makedirs(data_dir, exist_ok=True)
    env = lmdb.open(data_dir, map_size=1 << 36, max_dbs=8, sync=sync, metasync=sync)
    try:
        return _run(env, transactions, messages_per_txn, payload_bytes)
    finally:
        env.close()


def _run(env, transactions: int, messages_per_txn: int, payload_bytes: int) -> list[str]:
    meta = env.open_db(b"demo-meta")
    ledger = EntryLog(env, b"ledger/" + PARTITION)
    with env.begin(db=meta) as txn:
        mark = txn.get(b"txn-high-water-mark")
        snapshot = txn.get(b"abortset/" + PARTITION)
    next_sequence = struct.unpack("<Q", mark)[0] if mark else 0
    aborted = AbortSet.from_bytes(snapshot) if snapshot else AbortSet()

    def reserve(new_mark: int) -> None:
        # Durable before any TxnID below it is used: a restart never reissues a sequence.
        with env.begin(write=True, db=meta) as txn:
            txn.put(b"txn-high-water-mark", struct.pack("<Q", new_mark))

    allocator = TxnIdAllocator(0, next_sequence, block_size=64, reserve=reserve)
    payload = b"x" * payload_bytes
    committed = aborted_now = 0
    start = time.perf_counter()
    for i in range(transactions):
        txn_id = allocator.next()
        values = [b"%s:%d:" % (str(txn_id).encode(), k) + payload for k in range(messages_per_txn)]
        entries = encode_entries(
            values,
            txn_msb=txn_id.most_sig_bits,
            txn_lsb=txn_id.least_sig_bits,
            first_sequence_id=0,
            publish_time=int(time.time() * 1000),
        )
        abort = i % 3 == 2
        marker = encode_entry(
            [],
            txn_msb=txn_id.most_sig_bits,
            txn_lsb=txn_id.least_sig_bits,
            marker_type=int(MarkerType.TXN_ABORT if abort else MarkerType.TXN_COMMIT),
        )
        with env.begin(write=True) as txn:
            ledger.append(txn, entries)
        if abort:
            aborted.add(txn_id)
            aborted_now += 1
        else:
            committed += 1
        with env.begin(write=True) as txn:
            ledger.append(txn, [marker])
            if abort:
                txn.put(b"abortset/" + PARTITION, aborted.to_bytes(), db=meta)
    write_s = time.perf_counter() - start

    start = time.perf_counter()
    with env.begin(buffers=True) as txn:
        decoded = ledger.read(txn)
    msb, lsb = decoded.message_txn()
    is_data = np.repeat(decoded.marker_type == 0, decoded.message_count.astype(np.int64))
    visible = is_data & ~aborted.contains_many(msb, lsb)
    batch = decoded.to_arrow(topic=PARTITION.decode(), partition=0, mask=visible)
    read_s = time.perf_counter() - start

    markers = decoded.marker_type
    commits = markers == MarkerType.TXN_COMMIT
    committed_ids = AbortSet()  # any set of TxnIDs will do: here, the committed ones
    committed_ids.add_many(decoded.txn_msb[commits], decoded.txn_lsb[commits])
    from_committed = is_data & committed_ids.contains_many(msb, lsb)
    n_msgs = transactions * messages_per_txn
    lines = [
        f"pulsartxn demo ({IMPLEMENTATION} core)",
        f"this run: {transactions} transactions x {messages_per_txn} messages "
        f"of ~{payload_bytes} B: "
        f"{committed} committed, {aborted_now} aborted; "
        f"{n_msgs / write_s:,.0f} msgs/s written (fsync per transaction end)",
        f"ledger now: {decoded.num_entries} entries, {decoded.num_messages} messages, "
        f"{int(commits.sum())} commits, {int((markers == MarkerType.TXN_ABORT).sum())} aborts; "
        f"abort set: {len(aborted)} TxnIDs",
        f"read-committed scan: {batch.num_rows} visible messages in {read_s * 1000:.1f} ms "
        f"({decoded.num_messages / read_s:,.0f} msgs/s decoded and filtered)",
        f"next TxnID sequence after restart: {allocator.reserved_until}",
    ]
    if batch.num_rows != int(visible.sum()) or not np.array_equal(visible, from_committed):
        lines.append("MISMATCH: visible messages differ from the committed transactions' messages")
        raise SystemExit("\n".join(lines))
    lines.append("check: every visible message belongs to a committed transaction: ok")
    return lines
