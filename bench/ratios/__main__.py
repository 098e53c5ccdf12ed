"""Print the native core's figures as a Markdown table: rates and ratios from one run.

python -m bench.ratios            # full counts
python -m bench.ratios --quick    # smaller twin workloads, scaled
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform

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
    parser.add_argument("suites", nargs="*", default=list(SUITES))
    args = parser.parse_args()
    cpu = platform.processor() or platform.machine()
    print(
        f"machine: {platform.system()} {platform.machine()} {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    print()
    print("| figure | native rate | baseline | ratio | target |")
    print("| --- | --- | --- | --- | --- |")
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
