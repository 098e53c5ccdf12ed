"""The ``pulsartxn`` command. ``demo`` runs the main job: for now, the native core end to end."""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_DATA_DIR = os.environ.get("PULSARTXN_DATA_DIR", "pulsartxn-data")


def _demo(args: argparse.Namespace) -> int:
    from pulsartxn.demo import run_core_demo

    report = run_core_demo(
        args.data_dir,
        transactions=args.transactions,
        messages_per_txn=args.messages_per_txn,
        payload_bytes=args.payload_bytes,
        sync=not args.no_sync,
    )
    for line in report:
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pulsartxn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="the main job on the embedded default: transactional writes, aborts, a "
        "read-committed read",
    )
    demo.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help=f"LMDB data directory, kept between runs (default: {DEFAULT_DATA_DIR}; "
        "env PULSARTXN_DATA_DIR)",
    )
    demo.add_argument("--transactions", type=int, default=200)
    demo.add_argument("--messages-per-txn", type=int, default=500)
    demo.add_argument("--payload-bytes", type=int, default=100)
    demo.add_argument("--no-sync", action="store_true", help="do not fsync commits (faster)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError) as exc:
        print(f"pulsartxn {args.command}: {exc}", file=sys.stderr)
        return 2
