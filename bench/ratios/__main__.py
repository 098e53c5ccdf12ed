"""Print the native core's figures as a Markdown table: rates and ratios from one run.

python -m bench.ratios            # full counts
python -m bench.ratios --quick    # smaller twin workloads, scaled
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import sys

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
    parser.add_argument("suites", nargs="*", default=list(SUITES))
    args = parser.parse_args()
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
                + (["--quick"] if args.quick else []),
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


if __name__ == "__main__":
    main()
