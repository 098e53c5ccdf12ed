"""Print the native core's figures as a Markdown table: rates and ratios from one run.

python -m bench.ratios            # full counts
python -m bench.ratios --quick    # smaller twin workloads, scaled
python -m bench.ratios --json F   # the rows as JSON too (what python -m bench.plot draws)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time

SUITES = (
    "txnid",
    "abortset",
    "ackset",
    "entrylog",
    "dispatch",
    "storage",
    "messaging",
    "txn",
    "txn_messaging",
    "longrun",
    "remote",
    "spark",
)


def _fmt_rate(rate: float, unit: str) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.1f}{suffix} {unit}/s"
    return f"{rate:.0f} {unit}/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON to FILE too")
    parser.add_argument("suites", nargs="*", default=list(SUITES))
    args = parser.parse_args()
    if args.json and not args.rows_only:
        open(args.json, "w").close()  # each suite's process appends its rows, one per line
    try:
        _run(args)
    finally:
        if args.json and not args.rows_only:
            _write_json(args)


def _write_json(args) -> None:
    with open(args.json) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "commit": commit,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": args.quick,
        "suites": args.suites,
        "rows": rows,
    }
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


def _run(args) -> None:
    if not args.rows_only:
        cpu = platform.processor() or platform.machine()
        print(
            f"machine: {platform.system()} {platform.machine()} {cpu}, {os.cpu_count()} "
            f"cores, Python {platform.python_version()}"
        )
        print()
        print("| figure | native rate | baseline | ratio | target |")
        print("| --- | --- | --- | --- | --- |", flush=True)
    if len(args.suites) > 1:
        # Each suite in a process of its own, so that none measures on what another left
        # behind (its heap, the collector's generations, Arrow's memory pool): the network
        # suite's scan row read 0.09x and 0.27x after the other suites, 0.44-1.09x alone.
        for name in args.suites:
            subprocess.run(
                [sys.executable, "-m", "bench.ratios", "--rows-only", name]
                + (["--quick"] if args.quick else [])
                + (["--json", args.json] if args.json else []),
                check=True,
            )
        return
    for name in args.suites:
        module = importlib.import_module(f"bench.ratios.{name}")
        for row in module.measure(quick=args.quick):
            target = f"≥ {row.target:g}x" if row.target else ""
            mark = "" if not row.target else (" ✓" if row.ratio >= row.target else " ✗")
            print(
                f"| {row.figure} | {_fmt_rate(row.rate, row.unit)} | {row.baseline} | "
                f"{row.ratio:.2f}x{mark} | {target} |",
                flush=True,
            )
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(_row_json(name, row)) + "\n")


def _row_json(suite: str, row) -> dict:
    return {
        "suite": suite,
        "figure": row.figure,
        "rate": row.rate,
        "unit": row.unit,
        "baseline": row.baseline,
        "ratio": row.ratio,
        "target": row.target,
    }


if __name__ == "__main__":
    main()
