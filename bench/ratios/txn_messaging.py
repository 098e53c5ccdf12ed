"""Transactional messaging vs the same work without transactions, in one run.

The figures the transaction-buffer issue asks for, each against a baseline measured in the same
run on the same broker (sync=False unless a row says otherwise, 100-byte messages):

a. produce at 1000 messages per transaction vs plain produce of the same messages in the same
   send style (per-message send_async then commit vs send_async then flush; send_batch in a
   transaction then commit vs plain send_batch); waiting on every future of a transaction's
   send_async vs not waiting (the first wait writes the batch); then the same on a synced
   broker (sync=True, the default), where a transaction's sends are stored, not flushed, and
   its commit's one flush covers them: send_batch + commit also against raw py-lmdb syncing a
   putmulti of the same messages;
b. read-committed reads of a ledger where 10% of the transactions aborted vs one where none
   did. Both ledgers hold the same number of data messages; the rate is messages read from the
   ledger per second (aborted ones included, markers not), so the ratio is plain time over
   aborted time;
c. receive + acknowledge in a transaction (committed every 1000 acks) vs plain acknowledge;
d. transaction buffer recovery: reopen the broker on a partition of 1M one-message entries
   written by 200k transactions of 5, 100k of them aborted, and read its max read position;
   with the snapshot written at close, and with it deleted (full replay, as after a damaged
   one). The baseline is raw py-lmdb iterating the same ledger's keys and values, for scale.

The machine is noisy: rounds alternate between the baseline and ours, and each row gives the
median of ours and the median over rounds of the pair ratio (baseline round / our round).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from statistics import median

import lmdb

import pulsartxn

from ..benchmarks.txn._recovery import build_recovery, drop_snapshots, raw_iterate, reopen
from ._harness import Row, alternating, paired, timed

PAYLOAD = 100
PER_TXN = 1000


def _per_call(fn, min_time: float = 0.2) -> float:
    """Mean seconds per call of a short fn, called until min_time has passed."""
    n = 0
    start = time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / n


# -- a. produce --------------------------------------------------------------------------------


def _raw_putmulti(path: str, chunks: list[list[bytes]], sync: bool):
    """Raw py-lmdb: each chunk of messages in one putmulti, committed (synced with `sync`)."""
    env = lmdb.open(path, map_size=1 << 32, max_dbs=2, sync=sync, metasync=sync)
    db = env.open_db(b"t")
    key = [0]

    def run():
        for chunk in chunks:
            k = key[0]
            with env.begin(write=True) as txn:
                txn.cursor(db=db).putmulti(
                    [((k + i).to_bytes(8, "big"), v) for i, v in enumerate(chunk)], append=True
                )
            key[0] = k + len(chunk)

    return env, run


def _produce_rows(
    client, values: list[bytes], n_txns: int, rounds: int, durable: bool = False, raw_dir=None
) -> list[Row]:
    """sync=False isolates the CPU cost of a transaction; `durable` runs the same on a synced
    broker (the default), where each side waits for its fsyncs."""
    chunks = [values[i * PER_TXN : (i + 1) * PER_TXN] for i in range(n_txns)]
    suffix = ", sync=True" if durable else ""
    p_plain = client.create_producer("produce-plain")
    p_txn = client.create_producer("produce-txn")
    b_plain = client.create_producer("produce-batch-plain")
    b_txn = client.create_producer("produce-batch-txn")

    def async_plain():
        send = p_plain.send_async
        for chunk in chunks:
            for v in chunk:
                send(v)
            p_plain.flush()

    def async_txn():
        send = p_txn.send_async
        for chunk in chunks:
            txn = client.new_transaction()
            for v in chunk:
                send(v, txn=txn)
            txn.commit()

    def batch_plain():
        for chunk in chunks:
            b_plain.send_batch(chunk)

    def batch_txn():
        for chunk in chunks:
            txn = client.new_transaction()
            b_txn.send_batch(chunk, txn=txn)
            txn.commit()

    w_txn = client.create_producer("produce-txn-waited")

    def async_txn_waited():
        send = w_txn.send_async
        for chunk in chunks:
            txn = client.new_transaction()
            futures = [send(v, txn=txn) for v in chunk]
            for f in futures:
                f.result()
            txn.commit()

    env, raw = _raw_putmulti(raw_dir, chunks, durable) if raw_dir else (None, None)
    pairs = [
        ("ap", async_plain, "at", async_txn),
        ("bp", batch_plain, "bt", batch_txn),
        ("at2", async_txn, "aw", async_txn_waited),
    ]
    if raw is not None:
        pairs.append(("raw", raw, "bt2", batch_txn))
    times: dict[str, list[float]] = {k: [] for p in pairs for k in (p[0], p[2])}
    try:
        for r in range(rounds):
            # Alternate which side goes first, so neither always meets the other's writeback.
            for base_key, base_fn, our_key, our_fn in pairs:
                order = ((base_key, base_fn), (our_key, our_fn))
                for key, fn in order[::-1] if r % 2 else order:
                    times[key].append(timed(fn))
    finally:
        if env is not None:
            env.close()
    n = n_txns * PER_TXN
    rows = []
    if raw is not None:
        rows.append(
            paired(
                f"send_batch(1000, txn) + commit, {n_txns} txns{suffix} (vs raw lmdb)",
                n,
                "msgs",
                times["bt2"],
                times["raw"],
                "raw lmdb putmulti of the same 1000, one synced commit each",
                2.0,
            )
        )
    rows.append(
        paired(
            f"send_async x1000 (txn), wait on every future, + commit, {n_txns} txns{suffix}",
            n,
            "msgs",
            times["aw"],
            times["at2"],
            "the same without waiting, same run",
            0.4,
        )
    )
    return rows + [
        paired(
            f"send_async x1000 + commit, {n_txns} txns{suffix} (vs send_async x1000 + flush)",
            n,
            "msgs",
            times["at"],
            times["ap"],
            "plain send_async + flush, same run",
            0.95,
        ),
        paired(
            f"send_batch(1000, txn) + commit, {n_txns} txns{suffix} (vs plain send_batch(1000))",
            n,
            "msgs",
            times["bt"],
            times["bp"],
            "plain send_batch, same run",
            0.95,
        ),
    ]


# -- b. read committed with aborts ---------------------------------------------------------


def _fill_txns(client, topic: str, values: list[bytes], n_txns: int, abort_every: int) -> int:
    """n_txns transactions of PER_TXN messages (send_batch); every abort_every-th aborts.
    Returns the number of committed messages."""
    # A network session's client: its aborted transactions' batches are in the ledger (an
    # in-process transaction's ride in its commit, and an abort writes none of them).
    client = client.broker.client(session="fill")
    producer = client.create_producer(topic)
    committed = 0
    for i in range(n_txns):
        txn = client.new_transaction()
        producer.send_batch(values[i * PER_TXN : (i + 1) * PER_TXN], txn=txn)
        if abort_every and i % abort_every == abort_every - 1:
            txn.abort()
        else:
            txn.commit()
            committed += PER_TXN
    producer.close()
    return committed


def _read_rows(client, values: list[bytes], n_txns: int, rounds: int) -> list[Row]:
    n = n_txns * PER_TXN
    expect = {
        "rc-none": _fill_txns(client, "rc-none", values, n_txns, 0),
        "rc-aborted": _fill_txns(client, "rc-aborted", values, n_txns, 10),
    }
    assert expect["rc-aborted"] == n - n // 10

    def scan(topic):
        def run():
            got = sum(b.num_rows for b in client.scan(topic))
            assert got == expect[topic], (topic, got, expect[topic])

        return run

    subs = iter(range(1 << 30))

    def receive(topic):
        def run():
            consumer = client.subscribe(
                topic, f"recv-{next(subs)}", initial_position=pulsartxn.InitialPosition.Earliest
            )
            for _ in range(expect[topic]):
                consumer.receive(1000)
            consumer.close()

        return run

    def batch_receive(topic):
        def run():
            consumer = client.subscribe(
                topic, f"batch-{next(subs)}", initial_position=pulsartxn.InitialPosition.Earliest
            )
            got = 0
            while got < expect[topic]:
                got += len(consumer.batch_receive(1000, 1000))
            assert got == expect[topic]
            consumer.close()

        return run

    rows = []
    for what, make, k in (
        ("scan", scan, rounds),
        ("receive() per message", receive, max(2, rounds // 2)),
        ("batch_receive(1000)", batch_receive, rounds),
    ):
        # Scans are short: each round is the mean of calls over 0.2 s, after a warm-up.
        timer = _per_call if make is scan else timed
        if make is scan:
            make("rc-none")()
            make("rc-aborted")()
        ours, base = [], []
        for r in range(k):
            if r % 2:
                ours.append(timer(make("rc-aborted")))
                base.append(timer(make("rc-none")))
            else:
                base.append(timer(make("rc-none")))
                ours.append(timer(make("rc-aborted")))
        rows.append(
            paired(
                f"read committed, {what}: 10% of {n_txns} txns x 1000 aborted vs none "
                "(ledger msgs/s)",
                n,
                "msgs",
                ours,
                base,
                "same read, no aborted txns",
                0.9,
            )
        )
    return rows


# -- c. acknowledgements -------------------------------------------------------------------


def _ack_rows(client, values: list[bytes], n_acks: int, rounds: int) -> list[Row]:
    producer = client.create_producer("acks")
    producer.send_batch(values[:n_acks])
    subs = iter(range(1 << 30))

    def plain():
        consumer = client.subscribe(
            "acks", f"plain-{next(subs)}", initial_position=pulsartxn.InitialPosition.Earliest
        )
        for _ in range(n_acks):
            consumer.acknowledge(consumer.receive(1000))
        consumer.close()

    def in_txn():
        consumer = client.subscribe(
            "acks", f"txn-{next(subs)}", initial_position=pulsartxn.InitialPosition.Earliest
        )
        for _ in range(n_acks // PER_TXN):
            txn = client.new_transaction()
            for _ in range(PER_TXN):
                consumer.acknowledge(consumer.receive(1000), txn=txn)
            txn.commit()
        consumer.close()

    def plain_batch():
        consumer = client.subscribe(
            "acks", f"bplain-{next(subs)}", initial_position=pulsartxn.InitialPosition.Earliest
        )
        got = 0
        while got < n_acks:
            msgs = consumer.batch_receive(PER_TXN, 1000)
            for m in msgs:
                consumer.acknowledge(m)
            got += len(msgs)
        consumer.close()

    def txn_batch():
        consumer = client.subscribe(
            "acks", f"btxn-{next(subs)}", initial_position=pulsartxn.InitialPosition.Earliest
        )
        got = 0
        while got < n_acks:
            txn = client.new_transaction()
            msgs = consumer.batch_receive(PER_TXN, 1000)
            for m in msgs:
                consumer.acknowledge(m, txn=txn)
            txn.commit()
            got += len(msgs)
        consumer.close()

    rows = []
    for what, ours_fn, base_fn in (
        ("receive + acknowledge(msg, txn), commit per 1000", in_txn, plain),
        ("batch_receive(1000) + acknowledge(msg, txn) + commit", txn_batch, plain_batch),
    ):
        ours, base = alternating(
            rounds,
            lambda _, fn=ours_fn: timed(fn),
            lambda _, fn=base_fn: timed(fn),
        )
        rows.append(
            paired(
                f"{what}, {n_acks} msgs (vs the same without txn)",
                n_acks,
                "acks",
                ours,
                base,
                "plain acknowledge, same run",
                None,
            )
        )
    return rows


# -- d. transaction buffer recovery --------------------------------------------------------


def _recovery_rows(tmp: str, n_txns: int, rounds: int) -> list[Row]:
    path = os.path.join(tmp, "recovery")
    entries = build_recovery(path, n_txns)
    rows = []
    for snapshot in (True, False):
        ours, base = [], []
        for _ in range(rounds):
            if not snapshot:
                drop_snapshots(path)
            base.append(raw_iterate(path))
            elapsed, stats = reopen(path)
            assert stats["max_read_position"] == entries, stats
            assert stats["aborted_txn_count"] == n_txns // 2, stats
            ours.append(elapsed)
        how = "from snapshot" if snapshot else "no snapshot, full replay"
        rows.append(
            paired(
                f"buffer recovery ({how}): reopen + max_read_position, {entries} entries, "
                f"{n_txns // 2} aborted txns: {median(ours):.2f} s (target < 2 s)",
                entries,
                "entries",
                ours,
                base,
                "raw lmdb cursor over the ledger, for scale",
                None,
            )
        )
    return rows


def measure(quick: bool = False) -> list[Row]:
    n_txns = 50 if quick else 200  # transactions of 1000 messages (a, b)
    n_acks = 20_000 if quick else 100_000
    n_recovery = 20_000 if quick else 200_000  # 5 entries each: 100k or 1M data entries
    rounds = 3 if quick else 5
    values = [os.urandom(PAYLOAD) for _ in range(n_txns * PER_TXN)]
    rows = []
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-txnmsg-")
    try:
        with pulsartxn.Broker(os.path.join(tmp, "d"), sync=False) as broker:
            client = broker.client()
            rows += _produce_rows(client, values, n_txns, rounds)
            rows += _read_rows(client, values, n_txns, rounds)
            rows += _ack_rows(client, values, n_acks, rounds)
        with pulsartxn.Broker(os.path.join(tmp, "durable"), sync=True) as broker:
            n = n_txns // 4
            rows += _produce_rows(
                broker.client(), values[: n * PER_TXN], n, rounds, True, os.path.join(tmp, "raw")
            )
        rows += _recovery_rows(tmp, n_recovery, rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
