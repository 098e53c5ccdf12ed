"""The synced store's journal (pulsartxn/storage/journal.py) against LMDB syncing each commit
itself (journal=False: an fdatasync of the data pages, then the meta page), in one run:

a. synced groups of one small put, one after the other (the latency of a durable write);
b. the exactly-once consume-process-produce pipeline of bench/peers, 100 messages per
   transaction, every commit durable;
c. the recorder of a group's writes, native against its twin;
d. a journal append as the group commit makes it (a 16 KiB record written while LMDB commits a
   small group, then fdatasynced): the native AsyncWriter (io_uring) against its twin, which
   writes before the commit.

Rounds alternate between the two sides; each row gives the median of ours and the median of
the per-round ratios.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from pulsartxn._native import load
from pulsartxn.storage import Storage

from ..benchmarks.storage._journal import (
    direct_file,
    open_broker,
    overlapped_writes,
    pipeline,
    record_group,
    recorder_env,
    small_writes,
)
from ._harness import Row, best_time, paired, timed


def measure(quick: bool = False) -> list[Row]:
    rounds = 3 if quick else 5
    n_writes = 300 if quick else 1000
    n_msgs = 5000 if quick else 20_000
    rows = []
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-storage-")
    try:
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            for journal in (True, False) if r % 2 else (False, True):
                storage = Storage(os.path.join(tmp, f"w-{journal}-{r}"), sync=True, journal=journal)
                try:
                    times[journal].append(timed(lambda s=storage: small_writes(s, n_writes)))
                finally:
                    storage.close()
        rows.append(
            paired(
                "synced write of one 100 B put, one after another, journal",
                n_writes,
                "writes",
                times[True],
                times[False],
                "LMDB syncing each commit (journal=False)",
                None,
            )
        )
        times = {True: [], False: []}
        for r in range(rounds):
            for journal in (True, False) if r % 2 else (False, True):
                with open_broker(os.path.join(tmp, f"p-{journal}-{r}"), journal) as broker:
                    times[journal].append(timed(lambda b=broker: pipeline(b, n_msgs)))
        rows.append(
            paired(
                "consume-process-produce, 100 msgs/txn, sync=True, journal",
                n_msgs,
                "msgs",
                times[True],
                times[False],
                "LMDB syncing each commit (journal=False)",
                None,
            )
        )
        env, handles = recorder_env(os.path.join(tmp, "rec"))
        try:
            best = {}
            for kind in ("native", "reference"):
                impl = load(kind)

                def one(impl=impl):
                    with env.begin(write=True) as txn:
                        record_group(impl, txn, handles)
                        txn.abort()

                best[kind] = best_time(one)
            rows.append(
                Row(
                    "Recorder: a group's 17 writes recorded (LMDB write txn included)",
                    17,
                    "writes",
                    best["native"],
                    best["reference"],
                    "twin",
                    None,
                )
            )
        finally:
            env.close()
        env, handles = recorder_env(os.path.join(tmp, "overlap-env"))
        fd, stage = direct_file(os.path.join(tmp, "journal"))
        try:
            n_appends = 100 if quick else 400
            times = {"native": [], "reference": []}
            for r in range(rounds):
                for kind in ("native", "reference") if r % 2 else ("reference", "native"):
                    impl = load(kind)
                    times[kind].append(
                        timed(
                            lambda impl=impl: overlapped_writes(
                                impl, fd, stage, env, handles, n_appends
                            )
                        )
                    )
            rows.append(
                paired(
                    "AsyncWriter: journal append (16 KiB direct write + fdatasync) "
                    "overlapped with an LMDB commit",
                    n_appends,
                    "appends",
                    times["native"],
                    times["reference"],
                    "twin (writes, then commits)",
                    None,
                )
            )
        finally:
            os.close(fd)
            env.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
