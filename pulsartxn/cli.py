"""The ``pulsartxn`` command. ``demo`` runs the main job: an exactly-once pipeline."""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_DATA_DIR = os.environ.get("PULSARTXN_DATA_DIR", "pulsartxn-data")


def _demo(args: argparse.Namespace) -> int:
    from pulsartxn.demo import run_demo

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pulsartxn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
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
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError) as exc:
        print(f"pulsartxn {args.command}: {exc}", file=sys.stderr)
        return 2
