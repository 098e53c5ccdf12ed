"""``pulsartxn perf``: load generators in the manner of pulsar-perf (docs/operations.md).

``produce``, ``consume``, ``txn`` and ``pipeline`` run `--threads` workers against the embedded
default (a data directory) or a ``pulsartxn://`` service. A run ends when `--count` operations
are done, after `--duration` seconds, or (consume, pipeline) once nothing arrived for
`--idle-ms`. Progress every second (stderr), a summary at the end (stdout; ``--json`` with the
run's parameters): rates over the busy time only (first operation's start to last completion),
failures by exception type, latency mean, p50 ... p99.99 and max from a fixed-size histogram
(``recorder.py``); ``--plot FILE`` draws the latency histogram and the throughput over time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import pulsartxn

from .recorder import Recorder
from .workers import SUBSCRIPTION_TYPES, WORKERS, Pacer

DRAINS = ("consume", "pipeline")  # modes whose input runs out: they stop when it is drained


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


def _prepare(client, args) -> None:
    """--partitions and --prefill, before the run's clock starts."""
    if args.partitions:
        try:
            client.create_topic(args.topic, partitions=args.partitions)
        except pulsartxn.TopicAlreadyExists:
            have = len(client.topic_partitions(args.topic))
            if have != args.partitions:
                raise ValueError(
                    f"topic {args.topic!r} exists with {have} partition(s), not "
                    f"--partitions {args.partitions}"
                ) from None
    if args.prefill:
        p = client.create_producer(args.topic)
        value = os.urandom(args.size)
        for i in range(0, args.prefill, 10_000):
            p.send_batch([value] * min(10_000, args.prefill - i))
        p.close()


def _parameters(args) -> dict:
    """Every option of the run (the token left out: it is a secret)."""
    return {
        k: v for k, v in sorted(vars(args).items()) if k not in ("func", "token", "command", "seed")
    }


def run(args) -> tuple[dict, Recorder]:
    """Run the workload `args` describes; (summary, recorder)."""
    client, close = _open(args)
    try:
        _prepare(client, args)
        stop = threading.Event()
        rec = Recorder(stop, args.count)
        errors: list = []
        worker = WORKERS[args.mode]

        def body(index):
            try:
                worker(client, args, rec, Pacer(args.rate / args.threads), index)
            except Exception as exc:  # noqa: BLE001 - a worker that could not run: reported
                errors.append(exc)
                stop.set()

        threads = [
            threading.Thread(target=body, args=(i,), daemon=True) for i in range(args.threads)
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        drain = args.mode in DRAINS and not args.duration
        next_tick = start + 1.0
        while not stop.is_set():
            stop.wait(0.05)
            now = time.perf_counter()
            if args.duration and now - start >= args.duration:
                stop.set()
            if drain and rec.quiet_seconds(now) >= args.idle_ms / 1000.0:
                # receives that waited found nothing for --idle-ms: the input is drained (a
                # slow batch, a partial one waiting out its timeout, is not idle time)
                stop.set()
            if now >= next_tick:
                _progress(args, rec.sample(now - start))
                next_tick += 1.0
        for t in threads:
            t.join()
        end = time.perf_counter()
        if not rec.samples or end - start - rec.samples[-1]["t"] >= 0.05:
            _progress(args, rec.sample(end - start))
        busy = rec.busy_seconds()
        summary = {
            "mode": args.mode,
            "target": args.service_url or f"embedded:{args.data_dir}",
            "parameters": _parameters(args),
            "threads": args.threads,
            "seconds": round(busy, 6),
            "wall_seconds": round(end - start, 3),
            "operations": rec.ops,
            "messages": rec.msgs,
            "bytes": rec.bytes,
            "ops_per_s": round(rec.ops / busy, 1) if busy else 0.0,
            "msgs_per_s": round(rec.msgs / busy, 1) if busy else 0.0,
            "mb_per_s": round(rec.bytes / busy / 1e6, 3) if busy else 0.0,
            "latency_ms": rec.latency.summary_ms(),
            "failed": sum(rec.failures.values()),
            "failures": dict(rec.failures),
            "commit_failures": dict(rec.commit_failures),
            "samples": rec.samples,
            "errors": [f"{type(e).__name__}: {e}" for e in errors],
        }
        if args.mode == "txn":
            summary["committed"] = rec.ops - rec.aborted
            summary["aborted"] = rec.aborted
            summary["abort_latency_ms"] = rec.abort_latency.summary_ms()
        return summary, rec
    finally:
        close()


def _progress(args, s: dict) -> None:
    if args.json and not args.progress:
        return
    failed = f"   failed {s['failures']}" if s["failures"] else ""
    print(
        f"[{s['t']:6.1f} s] {s['msgs_per_s']:12,.0f} msgs/s {s['ops_per_s']:10,.0f} ops/s   "
        f"latency ms p50 {s['p50_ms']} p99 {s['p99_ms']}{failed}",
        file=sys.stderr,
        flush=True,
    )


class _Refused(argparse.Action):
    """An option that was renamed: refused, naming the new one."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} was renamed {self.const} (it never was a random seed)")


def _ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in 0..1, not {text}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("perf", help="load generator: produce, consume, txn, pipeline")
    p.add_argument("mode", choices=sorted(WORKERS))
    p.add_argument("--service-url", help="pulsartxn://host:port (default: embedded broker)")
    p.add_argument("--token")
    p.add_argument("--data-dir", default=os.environ.get("PULSARTXN_DATA_DIR", "pulsartxn-data"))
    p.add_argument("--no-sync", action="store_true", help="embedded broker without fsync")
    p.add_argument("--topic", default="perf")
    p.add_argument(
        "--partitions", "-np", type=int, default=0, help="create --topic with N partitions"
    )
    p.add_argument("--output", default="perf-out", help="pipeline: the output topic")
    p.add_argument("--subscription", default="perf")
    p.add_argument(
        "--subscription-type",
        "-st",
        choices=sorted(SUBSCRIPTION_TYPES),
        help="consume, pipeline: the subscription's type (default Shared: threads share it)",
    )
    p.add_argument("--size", "-s", type=int, default=100, help="message size in bytes")
    p.add_argument(
        "--sync", action="store_true", help="produce: one durable send at a time (not async)"
    )
    p.add_argument(
        "--max-outstanding",
        "-o",
        type=int,
        default=1000,
        help="produce (async): the most sends awaiting completion per thread",
    )
    p.add_argument("--batch", type=int, default=0, help="produce: messages per send_batch")
    p.add_argument("--txn-size", type=int, default=0, help="messages (acks) per transaction")
    p.add_argument("--txn-timeout-ms", type=int, default=0, help="transactions' timeout")
    p.add_argument("--messages-per-txn", type=int, default=0, help="txn: messages in each")
    p.add_argument(
        "--abort-ratio", type=_ratio, default=0.0, help="txn: the fraction aborted (0..1)"
    )
    p.add_argument("--random-seed", type=int, help="seed of --abort-ratio's draws")
    p.add_argument("--receive-batch", type=int, default=1000)
    p.add_argument("--prefill", type=int, default=0, help="produce N messages before the run")
    p.add_argument("--seed", action=_Refused, const="--prefill", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rate", "-r", type=float, default=0.0, help="operations/s over all threads")
    p.add_argument(
        "--count", "-m", "--num-messages", type=int, default=0, help="stop after N operations"
    )
    p.add_argument(
        "--duration", "--test-duration", type=float, default=0.0, help="stop after S seconds"
    )
    p.add_argument(
        "--idle-ms",
        type=int,
        default=1000,
        help="consume, pipeline: stop when nothing arrived for this long (without --duration)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--progress", action="store_true", help="progress lines even with --json")
    p.add_argument("--plot", metavar="FILE.png", help="draw latency and throughput into FILE")
    p.set_defaults(func=_main)


def _check(args) -> None:
    for name in ("size", "threads", "max_outstanding", "idle_ms"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("batch", "txn_size", "txn_timeout_ms", "messages_per_txn", "prefill", "count"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must not be negative")
    if args.partitions < 0:
        raise ValueError("--partitions must not be negative")
    if args.rate < 0 or args.duration < 0:
        raise ValueError("--rate and --duration must not be negative")
    if args.sync and args.batch:
        raise ValueError("--sync and --batch are two produce modes: give one")
    if args.abort_ratio and args.mode != "txn":
        raise ValueError("--abort-ratio applies to the txn mode only")
    if args.subscription_type and args.mode not in DRAINS:
        raise ValueError("--subscription-type applies to the consume and pipeline modes only")
    if args.mode in DRAINS and not args.subscription_type:
        args.subscription_type = "Shared"
    if args.subscription_type == "Exclusive" and args.threads > 1:
        raise ValueError("--subscription-type Exclusive takes one consumer: use --threads 1")
    if args.plot:
        from .plot import require_matplotlib

        require_matplotlib()  # before the run, not after it


def _main(args) -> int:
    try:
        _check(args)
    except ImportError as exc:  # --plot without matplotlib: one line, before the run
        print(f"pulsartxn perf: {exc}", file=sys.stderr)
        return 2
    if not args.count and not args.duration and args.mode not in DRAINS:
        args.duration = 10.0
    summary, rec = run(args)
    if args.plot:
        from .plot import plot_run

        plot_run(summary, rec, args.plot)
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    for err in summary["errors"]:
        print(f"error: {err}", file=sys.stderr)
    return 1 if summary["errors"] else 0


def _print_summary(summary: dict) -> None:
    lat = summary["latency_ms"]
    print(
        f"{summary['mode']}: {summary['messages']:,} msgs, {summary['operations']:,} ops in "
        f"{summary['seconds']} s busy: {summary['msgs_per_s']:,.0f} msgs/s, "
        f"{summary['ops_per_s']:,.0f} ops/s, {summary['mb_per_s']} MB/s"
    )
    print(
        "latency ms: "
        + "  ".join(f"{k} {v}" for k, v in lat.items())
        + (f"\nfailed: {summary['failed']:,} {summary['failures']}" if summary["failed"] else "")
    )
    if summary["commit_failures"]:
        print(f"commits failed: {summary['commit_failures']}")
    if "aborted" in summary:
        print(
            f"transactions: {summary['committed']:,} committed, {summary['aborted']:,} aborted "
            f"(abort latency ms p50 {summary['abort_latency_ms']['p50']})"
        )
