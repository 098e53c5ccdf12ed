"""The ``pulsartxn`` command. ``demo`` runs the main job: an exactly-once pipeline (on local
Spark when PySpark is installed), ``serve`` serves a broker over Arrow Flight, ``cluster``
runs a local cluster of brokers on ZooKeeper."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from pulsartxn import client_cli, perf
from pulsartxn.admin_cli import add_parser as add_admin_parser
from pulsartxn.demo import run_demo
from pulsartxn.errors import InvalidConfiguration, PulsarTxnError
from pulsartxn.server.serve import SHUTDOWN_TIMEOUT_S, STOP_DUMP_S, serve
from pulsartxn.server.sessions import SessionLimits

DEFAULT_DATA_DIR = os.environ.get("PULSARTXN_DATA_DIR", "pulsartxn-data")


def _demo(args: argparse.Namespace) -> int:
    # Before either pipeline starts (a Spark session takes seconds, and the store is made).
    if args.orders < 0:
        raise ValueError(f"--orders must not be negative, not {args.orders}")
    if args.window < 1 or args.customers < 1:
        raise ValueError(
            f"--window and --customers must be at least 1, not {args.window}, {args.customers}"
        )
    if not args.no_spark:
        try:
            import pyspark  # noqa: F401 - the optional extra: is it installed?
        except ImportError:
            print(
                "pyspark is not installed (pip install 'pulsartxn[spark]'; in a clone, pip "
                "install -e '.[spark]'): running the pipeline on the broker alone",
                file=sys.stderr,
            )
        else:
            from pulsartxn.spark.demo import run_spark_demo  # needs pyspark, an optional extra

            lines = run_spark_demo(args.data_dir, events=args.orders, log=print)
            for line in lines:
                print(line)
            return 0 if lines[-1].startswith("check: ok") else 1
    report = run_demo(
        args.data_dir,
        orders=args.orders,
        window=args.window,
        customers=args.customers,
        sync=not args.no_sync,
    )
    for line in report:
        print(line)
    return 0


def _cluster(args: argparse.Namespace) -> int:
    if args.brokers < 1:
        raise ValueError(f"--brokers must be at least 1, not {args.brokers}")
    from pulsartxn.cluster import LocalCluster  # kazoo: only a cluster needs it

    stop = threading.Event()

    def on_signal(signum, frame_):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cluster = LocalCluster(
        args.data_dir,
        args.brokers,
        zk_port=args.zk_port,
        base_port=args.base_port,
        num_coordinators=args.num_coordinators,
        sync=not args.no_sync,
        metrics_base_port=args.metrics_base_port,
    )
    try:
        cluster.start()
    except InvalidConfiguration as exc:
        print(f"pulsartxn cluster: {exc}", file=sys.stderr)  # with its log's tail, as lines
        return 1
    print(
        f"pulsartxn cluster serving {cluster.service_url} (metadata {cluster.zk_url}, "
        f"logs in {cluster.data_dir})",
        flush=True,
    )
    if args.metrics_base_port is not None:
        urls = ", ".join(cluster.metrics_url(i) for i in range(len(cluster)))
        print(f"pulsartxn cluster metrics on {urls}", flush=True)
    died = []
    try:
        while not stop.wait(0.5):
            for i in range(len(cluster)):
                if i not in died and not cluster.is_running(i):
                    died.append(i)
                    code = cluster.process(i).returncode
                    print(
                        f"pulsartxn cluster: broker {i} exited with {code}: see "
                        f"{cluster.log_path(i)}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        codes = cluster.close()
    bad = {i: code for i, code in codes.items() if code != 0}
    for i, code in bad.items():
        print(f"pulsartxn cluster: broker {i} stopped with {code}", file=sys.stderr)
    print("pulsartxn cluster stopped", flush=True)
    return 1 if died or bad else 0


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert:
        with open(args.tls_cert, "rb") as cert, open(args.tls_key, "rb") as key:
            tls = (cert.read(), key.read())
    serve(
        args.data_dir,
        args.host,
        args.port,
        client_cli.read_secret(args.token_file, "token file"),
        max_request_bytes=args.max_request_bytes,
        session_timeout_s=args.session_timeout_s,
        admin_token=client_cli.read_secret(args.admin_token_file, "admin token file"),
        tls=tls,
        insecure=args.insecure,
        max_wait_ms=args.max_wait_ms,
        max_sessions=args.max_sessions,
        limits=SessionLimits(
            consumers=args.session_max_consumers,
            producers=args.session_max_producers,
            transactions=args.session_max_transactions,
            waiting_receives=args.session_max_waiting_receives,
            streams=args.session_max_streams,
        ),
        sync=not args.no_sync,
        cluster=args.cluster,
        advertised_address=args.advertised_address,
        num_coordinators=args.num_coordinators,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        stop_dump_s=args.stop_dump_s,
        shutdown_timeout_s=args.shutdown_timeout_s,
        **({"max_dbs": args.max_dbs} if args.max_dbs is not None else {}),
        **(
            {"min_ack_timeout_ms": args.min_ack_timeout_ms}
            if args.min_ack_timeout_ms is not None
            else {}
        ),
        **(
            {"operation_timeout_ms": args.operation_timeout_ms}
            if args.operation_timeout_ms is not None
            else {}
        ),
    )
    return 0


def version() -> str:
    """This package's version: its installed distribution's, else ``pulsartxn.__version__``."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("pulsartxn")
    except PackageNotFoundError:
        import pulsartxn

        return pulsartxn.__version__


class _Parser(argparse.ArgumentParser):
    """A bad option is one line (and exit 2), not the usage text."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pulsartxn", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pulsartxn {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    perf.add_parser(sub)
    client_cli.add_parser(sub)
    add_admin_parser(sub)
    srv = sub.add_parser("serve", help="serve a broker over Arrow Flight (pulsartxn://)")
    srv.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    srv.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    srv.add_argument("--port", type=int, default=6650, help="0 picks a free port")
    srv.add_argument("--token-file", help="file holding the bearer token clients must send")
    srv.add_argument(
        "--admin-token-file",
        help="file holding the bearer token admin calls need (with --token-file: required)",
    )
    srv.add_argument("--tls-cert", help="PEM certificate: serve pulsartxn+ssl:// (grpc+tls)")
    srv.add_argument("--tls-key", help="PEM private key of --tls-cert")
    srv.add_argument(
        "--insecure",
        action="store_true",
        help="allow serving off loopback without a token (anyone reaching it may do anything)",
    )
    srv.add_argument("--no-sync", action="store_true", help="do not fsync commits")
    srv.add_argument("--max-request-bytes", type=int, default=64 * 1024 * 1024)
    srv.add_argument(
        "--max-dbs",
        type=int,
        help="LMDB named databases, one per partition and coordinator (default 16384): raise "
        "it to open a store whose coordinators do not fit",
    )
    srv.add_argument(
        "--operation-timeout-ms",
        type=int,
        help="how long a commit or abort without a timeout of its own waits for its "
        "participants before it answers Timeout with the decision's state (default 30000)",
    )
    srv.add_argument(
        "--min-ack-timeout-ms",
        type=int,
        help="the least unacked_messages_timeout_ms a subscribe may ask for (default 10000, "
        "as pulsar-client's)",
    )
    for what, default in (
        ("consumers", 1024),
        ("producers", 1024),
        ("transactions", 10_000),
        ("waiting-receives", 256),
        ("streams", 256),
    ):
        srv.add_argument(
            f"--session-max-{what}",
            type=int,
            default=default,
            help=f"the most {what.replace('-', ' ')} one client session may hold at once",
        )
    srv.add_argument(
        "--max-sessions",
        type=int,
        default=4096,
        help="the most clients connected at once",
    )
    srv.add_argument(
        "--max-wait-ms",
        type=int,
        default=10_000,
        help="the longest a call waits on the server (a client waiting longer asks again)",
    )
    srv.add_argument(
        "--session-timeout-s",
        type=float,
        default=10.0,
        help="a client silent this long is gone: its consumers' messages are redelivered",
    )
    srv.add_argument(
        "--cluster",
        help="zk://HOST:PORT[,HOST:PORT]/ROOT: a broker of the cluster whose metadata is there",
    )
    srv.add_argument(
        "--advertised-address",
        help="HOST:PORT other brokers and clients reach this one at (default: --host:port)",
    )
    srv.add_argument(
        "--num-coordinators",
        type=int,
        default=16,
        help="transaction coordinators (a cluster's first broker sets the cluster's count)",
    )
    srv.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port; "
        "default: none)",
    )
    srv.add_argument(
        "--metrics-host", help="bind address of --metrics-port (default: --host); no auth"
    )
    srv.add_argument(
        "--stop-dump-s",
        type=float,
        default=STOP_DUMP_S,
        help="a stop (SIGTERM, SIGINT) still under way after this many seconds writes every "
        f"thread's stack to stderr (default {STOP_DUMP_S:g}; 0: never)",
    )
    srv.add_argument(
        "--shutdown-timeout-s",
        type=float,
        default=SHUTDOWN_TIMEOUT_S,
        help="on SIGTERM/SIGINT, the calls under way get this many seconds to finish, then "
        f"every client connection is closed (default {SHUTDOWN_TIMEOUT_S:g}; 0: at once)",
    )
    srv.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="the least level logged to stderr (default info)",
    )
    srv.set_defaults(func=_serve)
    demo = sub.add_parser(
        "demo",
        help="the main job on the embedded default: an exactly-once consume-process-produce "
        "pipeline with transactions",
    )
    demo.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help=f"LMDB data directory, kept between runs (default: {DEFAULT_DATA_DIR}; "
        "env PULSARTXN_DATA_DIR)",
    )
    demo.add_argument("--orders", type=int, default=20_000, help="orders to add this run")
    demo.add_argument("--window", type=int, default=500, help="orders per transaction")
    demo.add_argument("--customers", type=int, default=50)
    demo.add_argument("--no-sync", action="store_true", help="do not fsync commits (faster)")
    demo.add_argument(
        "--no-spark",
        action="store_true",
        help="run the pipeline on the broker alone, without Spark (the default when pyspark is "
        "not installed)",
    )
    demo.set_defaults(func=_demo)
    clu = sub.add_parser(
        "cluster",
        help="a local cluster: a ZooKeeper and N brokers on 127.0.0.1, until SIGINT/SIGTERM",
    )
    clu.add_argument("--brokers", type=int, default=3, help="broker processes (default 3)")
    clu.add_argument(
        "--data-dir",
        default="pulsartxn-cluster",
        help="holds zookeeper/, broker-<i>/ and broker-<i>.log; the same one again brings the "
        "same brokers back (default: pulsartxn-cluster)",
    )
    clu.add_argument(
        "--zk-port", type=int, default=0, help="ZooKeeper's port (0: the last run's, or free)"
    )
    clu.add_argument(
        "--base-port",
        type=int,
        default=0,
        help="broker i serves on base-port + i (0: the last run's ports, or free ones)",
    )
    clu.add_argument(
        "--num-coordinators",
        type=int,
        default=16,
        help="transaction coordinators (set by the cluster's first start, for good)",
    )
    clu.add_argument("--no-sync", action="store_true", help="brokers do not fsync commits")
    clu.add_argument(
        "--metrics-base-port",
        type=int,
        help="broker i serves Prometheus metrics on 127.0.0.1:PORT+i (default: none)",
    )
    clu.set_defaults(func=_cluster)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # Its reader went away (`| head`): quiet, as any command line tool.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, OSError, PulsarTxnError) as exc:
        # One line, no traceback: a busy port, a locked data directory, a bad option value.
        print(f"pulsartxn {args.command}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
