"""``pulsartxn perf``: load generators in the manner of pulsar-perf (docs/development.md).

``produce``, ``consume``, ``txn`` and ``pipeline`` run `--threads` workers against the embedded
default (a data directory) or a ``pulsartxn://`` service until `--count` operations or
`--duration` seconds; progress every second (stderr), a summary of throughput and latency
percentiles at the end (stdout; ``--json`` for machines). produce: `send` one at a time or
`send_batch` of `--batch`; consume: `batch_receive` + acknowledge; txn: begin + commit with
`--messages-per-txn` messages; pipeline: consume-process-produce, `--txn-size` per transaction.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pulsartxn


class _Recorder:
    """Operations, messages and latencies of every worker (latencies in seconds)."""

    def __init__(self, stop: threading.Event, limit: int = 0) -> None:
        self.stop = stop
        self.limit = limit  # operations to run (0: until the duration ends)
        self.lock = threading.Lock()
        self.ops = 0
        self.msgs = 0
        self.bytes = 0
        self.latencies: list[float] = []
        self.errors = 0

    def add(self, msgs: int, nbytes: int, latency: float) -> None:
        with self.lock:
            self.ops += 1
            self.msgs += msgs
            self.bytes += nbytes
            self.latencies.append(latency)
            if self.limit and self.ops >= self.limit:
                self.stop.set()


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {k: None for k in ("p50", "p95", "p99", "p99.9", "max")}
    s = sorted(values)

    def at(q):
        return round(s[min(int(len(s) * q), len(s) - 1)] * 1000.0, 3)

    return {
        "p50": at(0.5),
        "p95": at(0.95),
        "p99": at(0.99),
        "p99.9": at(0.999),
        "max": round(s[-1] * 1000.0, 3),
    }


class _Pacer:
    """At most `rate` operations per second for one worker (0: unlimited)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()

    def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next > now:
            time.sleep(self.next - now)
        self.next = max(self.next, now) + self.interval


def _open(args):
    """(client, closer): the remote service when --service-url is given, else an embedded
    broker on --data-dir."""
    if args.service_url:
        client = pulsartxn.Client(args.service_url, token=args.token)
        return client, client.close
    broker = pulsartxn.Broker(args.data_dir, sync=not args.no_sync)
    client = broker.client()

    def close():
        client.close()
        broker.close()

    return client, close


def _payload(size: int) -> bytes:
    return os.urandom(size)


def _worker_produce(client, args, rec, stop, pacer):
    producer = client.create_producer(args.topic)
    value = _payload(args.size)
    txn, in_txn = None, 0
    try:
        while not stop.is_set():
            pacer.wait()
            if args.txn_size and txn is None:
                txn = client.new_transaction()
            start = time.perf_counter()
            if args.batch:
                n = producer.send_batch([value] * args.batch, txn=txn)
            else:
                producer.send(value, txn=txn)
                n = 1
            in_txn += n
            if txn is not None and in_txn >= args.txn_size:
                txn.commit()
                txn, in_txn = None, 0
            rec.add(n, n * args.size, time.perf_counter() - start)
    finally:
        if txn is not None:
            txn.commit()
        producer.close()


def _worker_consume(client, args, rec, stop, pacer):
    consumer = client.subscribe(
        args.topic,
        args.subscription,
        subscription_type=pulsartxn.ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,  # what --seed sent first
    )
    txn, in_txn = None, 0
    try:
        while not stop.is_set():
            pacer.wait()
            start = time.perf_counter()
            msgs = consumer.batch_receive(args.receive_batch, 100)
            if not msgs:
                continue
            if args.txn_size and txn is None:
                txn = client.new_transaction()
            for m in msgs:
                consumer.acknowledge(m, txn=txn)
            in_txn += len(msgs)
            if txn is not None and in_txn >= args.txn_size:
                txn.commit()
                txn, in_txn = None, 0
            rec.add(len(msgs), sum(len(m.data()) for m in msgs), time.perf_counter() - start)
    finally:
        if txn is not None:
            txn.commit()
        consumer.close()


def _worker_txn(client, args, rec, stop, pacer):
    producer = client.create_producer(args.topic) if args.messages_per_txn else None
    value = _payload(args.size)
    try:
        while not stop.is_set():
            pacer.wait()
            start = time.perf_counter()
            txn = client.new_transaction()
            if producer is not None:
                producer.send_batch([value] * args.messages_per_txn, txn=txn)
            txn.commit()
            rec.add(
                args.messages_per_txn,
                args.messages_per_txn * args.size,
                time.perf_counter() - start,
            )
    finally:
        if producer is not None:
            producer.close()


def _worker_pipeline(client, args, rec, stop, pacer):
    consumer = client.subscribe(
        args.topic,
        args.subscription,
        subscription_type=pulsartxn.ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    producer = client.create_producer(args.output)
    size = max(args.txn_size, 1)
    try:
        while not stop.is_set():
            pacer.wait()
            start = time.perf_counter()
            msgs = consumer.batch_receive(size, 100)
            if not msgs:
                continue
            with client.new_transaction() as txn:
                producer.send_batch([m.data()[::-1] for m in msgs], txn=txn)
                for m in msgs:
                    consumer.acknowledge(m, txn=txn)
            rec.add(len(msgs), sum(len(m.data()) for m in msgs), time.perf_counter() - start)
    finally:
        consumer.close()
        producer.close()


WORKERS = {
    "produce": _worker_produce,
    "consume": _worker_consume,
    "txn": _worker_txn,
    "pipeline": _worker_pipeline,
}


def run(args) -> dict:
    client, close = _open(args)
    try:
        if args.seed:
            p = client.create_producer(args.topic)
            value = _payload(args.size)
            for i in range(0, args.seed, 10_000):
                p.send_batch([value] * min(10_000, args.seed - i))
            p.close()
        stop = threading.Event()
        rec = _Recorder(stop, args.count)
        errors: list = []
        worker = WORKERS[args.mode]

        def body():
            try:
                worker(client, args, rec, stop, _Pacer(args.rate / args.threads))
            except Exception as exc:  # noqa: BLE001 - reported in the summary
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=body, daemon=True) for _ in range(args.threads)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        last_ops = last_msgs = 0
        last_t = start
        while not stop.is_set():
            stop.wait(min(1.0, args.duration) if args.duration else 1.0)
            now = time.perf_counter()
            with rec.lock:
                ops, msgs = rec.ops, rec.msgs
                recent = rec.latencies[last_ops:]
            if not args.json or args.progress:
                pct = _percentiles(recent)
                print(
                    f"[{now - start:6.1f} s] {(msgs - last_msgs) / (now - last_t):12,.0f} msgs/s "
                    f"{(ops - last_ops) / (now - last_t):10,.0f} ops/s   latency ms p50 "
                    f"{pct['p50']} p99 {pct['p99']}",
                    file=sys.stderr,
                    flush=True,
                )
            last_ops, last_msgs, last_t = ops, msgs, now
            if (args.count and ops >= args.count) or (
                args.duration and now - start >= args.duration
            ):
                stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        summary = {
            "mode": args.mode,
            "target": args.service_url or f"embedded:{args.data_dir}",
            "threads": args.threads,
            "seconds": round(elapsed, 3),
            "operations": rec.ops,
            "messages": rec.msgs,
            "bytes": rec.bytes,
            "ops_per_s": round(rec.ops / elapsed, 1),
            "msgs_per_s": round(rec.msgs / elapsed, 1),
            "mb_per_s": round(rec.bytes / elapsed / 1e6, 3),
            "latency_ms": _percentiles(rec.latencies),
            "errors": [f"{type(e).__name__}: {e}" for e in errors],
        }
        return summary
    finally:
        close()


def add_parser(sub) -> None:
    p = sub.add_parser("perf", help="load generator: produce, consume, txn, pipeline")
    p.add_argument("mode", choices=sorted(WORKERS))
    p.add_argument("--service-url", help="pulsartxn://host:port (default: embedded broker)")
    p.add_argument("--token")
    p.add_argument("--data-dir", default=os.environ.get("PULSARTXN_DATA_DIR", "pulsartxn-data"))
    p.add_argument("--no-sync", action="store_true", help="embedded broker without fsync")
    p.add_argument("--topic", default="perf")
    p.add_argument("--output", default="perf-out", help="pipeline: the output topic")
    p.add_argument("--subscription", default="perf")
    p.add_argument("--size", type=int, default=100, help="message size in bytes")
    p.add_argument("--batch", type=int, default=0, help="produce: messages per send_batch")
    p.add_argument("--txn-size", type=int, default=0, help="messages (acks) per transaction")
    p.add_argument("--messages-per-txn", type=int, default=0, help="txn: messages in each")
    p.add_argument("--receive-batch", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="produce N messages first")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rate", type=float, default=0.0, help="operations/s over all threads")
    p.add_argument("--count", type=int, default=0, help="stop after N operations")
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--progress", action="store_true", help="progress lines even with --json")
    p.set_defaults(func=_main)


def _main(args) -> int:
    for name in ("size", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1")
    for name in ("batch", "txn_size", "messages_per_txn", "seed", "count"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must not be negative")
    if args.rate < 0 or args.duration < 0:
        raise ValueError("--rate and --duration must not be negative")
    if not args.count and not args.duration:
        args.duration = 10.0
    summary = run(args)
    if args.json:
        print(json.dumps(summary))
    else:
        lat = summary["latency_ms"]
        print(
            f"{summary['mode']}: {summary['messages']:,} msgs, {summary['operations']:,} ops in "
            f"{summary['seconds']} s: {summary['msgs_per_s']:,.0f} msgs/s, "
            f"{summary['ops_per_s']:,.0f} ops/s, {summary['mb_per_s']} MB/s\n"
            f"latency ms: p50 {lat['p50']}  p95 {lat['p95']}  p99 {lat['p99']}  "
            f"p99.9 {lat['p99.9']}  max {lat['max']}"
        )
        for err in summary["errors"]:
            print(f"error: {err}", file=sys.stderr)
    return 1 if summary["errors"] else 0
