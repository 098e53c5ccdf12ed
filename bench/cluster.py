"""A broker cluster's figures (issue 24), every ratio from the same run:

    python -m bench.cluster [--seconds 6] [--workers 8] [--batch 500] [--repeat 3] [--sync]

1. Commit latency: 300 transactions of one 100-byte message each on a cluster of 2 brokers,
   committed one after another: the message on the coordinator's broker (the one-write end)
   and on the other broker (a cross-broker end over the network); p50 and p99 of commit().
2. A consume-process-produce pipeline over the partitions of an input and an output topic
   spread over 1, 2 and 3 brokers (ZooKeeper places them, least loaded first): `--workers`
   client processes, worker i reading input partition i and writing output partition i, each
   round a transaction of `--batch` results (send_batch) and one cumulative acknowledgement,
   its coordinator one on the output partition's broker. Committed results per second over
   `--seconds`, the median of `--repeat` runs, and the ratio to 1 broker; with the CPU the
   brokers and the clients used (2 cores they share bound what more brokers can give).

Brokers and clients are real processes on 127.0.0.1 (LocalCluster: a real ZooKeeper),
sync=False unless --sync. Not part of the tests.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time

import pulsartxn
from pulsartxn.cluster import LocalCluster
from pulsartxn.torture_cluster import PerBroker


def commit_latency(sync: bool, n: int = 300) -> dict:
    with (
        tempfile.TemporaryDirectory() as d,
        LocalCluster(d, 2, num_coordinators=2, sync=sync) as cluster,
    ):
        cluster.start()
        brokers = PerBroker(cluster.addresses)
        any_client = brokers.at(cluster.addresses[0])
        any_client.create_topic("lat", 8)
        parts = any_client.topic_partitions("lat")
        owners = {p: brokers.owner("partition", p) for p in parts}
        home = brokers.owner("coordinator", 0)
        local = next(p for p, a in owners.items() if a == home)
        remote = next(p for p, a in owners.items() if a != home)
        producers = {p: brokers.at(owners[p]).create_producer(p) for p in (local, remote)}

        def one(part: str) -> float:
            txn = brokers.at(home).new_transaction(coordinator_id=0)
            producers[part].send(b"x" * 100, txn=brokers.handle(txn, owners[part]))
            t0 = time.perf_counter()
            txn.commit()
            return time.perf_counter() - t0

        for _ in range(30):
            one(local), one(remote)
        times = {local: [], remote: []}
        for _ in range(n):
            for part in (local, remote):  # interleaved: both see the same machine
                times[part].append(one(part))
        brokers.close()
    single, cross = sorted(times[local]), sorted(times[remote])
    return {
        "single_p50": statistics.median(single) * 1e3,
        "single_p99": single[int(len(single) * 0.99)] * 1e3,
        "cross_p50": statistics.median(cross) * 1e3,
        "cross_p99": cross[int(len(cross) * 0.99)] * 1e3,
    }


def _worker(addresses, i, coordinators, batch, seconds, start, out):
    brokers = PerBroker(addresses)
    src = f"persistent://public/default/in-partition-{i}"
    dst = f"persistent://public/default/out-partition-{i}"
    src_at, dst_at = brokers.owner("partition", src), brokers.owner("partition", dst)
    # The transaction's coordinator on the output partition's broker when one is there (its
    # results then ride in the commit's own write), else coordinator i.
    view = brokers.at(addresses[0]).admin.cluster()
    at_dst = next((b for b, v in view["brokers"].items() if v["address"] == dst_at), None)
    mine = view["coordinators"].get(at_dst, [])
    cid = mine[i % len(mine)] if mine else i % coordinators
    home = brokers.owner("coordinator", cid)
    consumer = brokers.at(src_at).subscribe(
        src, "pipe", initial_position=pulsartxn.InitialPosition.Earliest
    )
    producer = brokers.at(dst_at).create_producer(dst)
    start.wait()
    deadline = time.monotonic() + seconds
    cpu = time.process_time()
    done = 0
    while time.monotonic() < deadline:
        msgs = consumer.batch_receive(batch, 200)
        if not msgs:
            continue
        txn = brokers.at(home).new_transaction(coordinator_id=cid)
        values = [m.value().upper() for m in msgs]
        producer.send_batch(values, txn=brokers.handle(txn, dst_at))
        consumer.acknowledge_cumulative(msgs[-1], txn=brokers.handle(txn, src_at))
        txn.commit()
        done += len(msgs)
    out.put((done, time.process_time() - cpu))
    brokers.close()


def pipeline(brokers: int, workers: int, batch: int, seconds: float, sync: bool) -> float:
    per_worker = int(40_000 * seconds)  # more than a worker can take in `seconds`
    with (
        tempfile.TemporaryDirectory() as d,
        LocalCluster(d, brokers, num_coordinators=workers, sync=sync) as cluster,
    ):
        cluster.start()
        brokers = PerBroker(cluster.addresses)
        c = brokers.at(cluster.addresses[0])
        c.create_topic("in", workers)
        c.create_topic("out", workers)
        for part in c.topic_partitions("in"):
            producer = brokers.at(brokers.owner("partition", part)).create_producer(part)
            for k in range(0, per_worker, 5000):
                producer.send_batch([b"v%09d" % j for j in range(k, k + 5000)])
        for i in range(workers):  # every coordinator placed before the clocks start
            brokers.owner("coordinator", i)
        ctx = mp.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=_worker,
                args=(cluster.addresses, i, workers, batch, seconds, start, out),
            )
            for i in range(workers)
        ]
        for p in procs:
            p.start()
        time.sleep(3.0)  # connected and subscribed
        brokers_cpu = _cpu(cluster)
        start.set()
        answers = [out.get(timeout=seconds + 120) for _ in procs]
        brokers_cpu = _cpu(cluster) - brokers_cpu
        for p in procs:
            p.join()
        brokers.close()
    total = sum(n for n, _ in answers)
    if os.environ.get("BENCH_VERBOSE"):
        print("per worker:", sorted(n for n, _ in answers), flush=True)
    return total / seconds, brokers_cpu / seconds, sum(t for _, t in answers) / seconds


def _cpu(cluster) -> float:
    """CPU seconds the cluster's broker processes have used so far."""
    total = 0.0
    for i in range(len(cluster)):
        with open(f"/proc/{cluster.process(i).pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--sync", action="store_true", help="fsync every commit")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each cluster size")
    ap.add_argument("--skip-latency", action="store_true")
    args = ap.parse_args()
    if not args.skip_latency:
        lat = commit_latency(args.sync)
        print(
            f"commit p50: single-broker {lat['single_p50']:.2f} ms, cross-broker "
            f"{lat['cross_p50']:.2f} ms, ratio {lat['cross_p50'] / lat['single_p50']:.2f}x "
            f"(p99 {lat['single_p99']:.2f} / {lat['cross_p99']:.2f} ms)",
            flush=True,
        )
    runs: dict = {1: [], 2: [], 3: []}
    for _ in range(args.repeat):  # interleaved: each size sees the same machine
        for n in runs:
            runs[n].append(pipeline(n, args.workers, args.batch, args.seconds, args.sync))
    base = statistics.median(r for r, _, _ in runs[1])
    for n, rows in runs.items():
        rates = sorted(r for r, _, _ in rows)
        print(
            f"pipeline on {n} broker(s): {statistics.median(rates):,.0f} msgs/s (runs "
            f"{', '.join(f'{r:,.0f}' for r in rates)}), {statistics.median(rates) / base:.2f}x "
            f"of 1 broker; CPU: brokers {statistics.median(b for _, b, _ in rows):.2f}, "
            f"clients {statistics.median(c for _, _, c in rows):.2f} cores",
            flush=True,
        )


if __name__ == "__main__":
    main()
