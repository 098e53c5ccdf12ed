"""Draw the bench JSON into PNGs under docs/img/ (matplotlib: the `bench` extra).

python -m bench.ratios --json bench/results/ratios.json [--quick] [suites...]
python -m bench.peers --json bench/results/peers.json [...]
python -m bench.plot [--ratios bench/results/ratios.json] [--peers bench/results/peers.json]
                     [--out docs/img]

ratios.png: one horizontal bar per figure, its ratio against its baseline (log scale), the
target marked where there is one; peers.png: msgs/s and commit p50/p99 per system. Each
picture's caption names the run it comes from (commit, time, options).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("bench.plot needs matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def plot_ratios(doc: dict, path: str) -> None:
    """Ratio of each figure of a `bench.ratios --json` run, with its target."""
    plt = _pyplot()
    rows = doc["rows"]
    if not rows:
        raise ValueError("the ratios JSON holds no rows")
    labels = [_wrap(f"{r['figure']} (vs {r['baseline']})", 70) for r in rows]
    lines = sum(label.count("\n") + 1 for label in labels)
    fig, ax = plt.subplots(figsize=(14, 0.3 * lines + 0.2 * len(rows) + 1.8))
    try:
        y = list(range(len(rows)))[::-1]
        colors = [
            "tab:gray"
            if not r["target"]
            else ("tab:green" if r["ratio"] >= r["target"] else "tab:red")
            for r in rows
        ]
        ax.barh(y, [r["ratio"] for r in rows], color=colors)
        for yi, r in zip(y, rows):
            at = max(r["ratio"], r["target"] or 0) * 1.05  # clear of the target's tick
            ax.annotate(f"{r['ratio']:.2f}x", (at, yi), va="center", fontsize=8)
            if r["target"]:
                ax.plot([r["target"]] * 2, [yi - 0.4, yi + 0.4], color="black", linewidth=2)
        ax.axvline(1.0, color="gray", linewidth=0.8)
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xscale("log")
        ax.set_xlim(right=max(max(r["ratio"], r["target"] or 0) for r in rows) * 2.0)
        ax.set_xlabel("native rate / baseline rate (log scale); black tick: target")
        quick = ", --quick" if doc.get("quick") else ""
        ax.set_title(
            _wrap(
                f"bench.ratios {' '.join(doc.get('suites', []))}{quick}: commit "
                f"{doc.get('commit', '?')}, {doc.get('when', '?')}",
                110,
            ),
            fontsize=10,
        )
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def plot_peers(doc: dict, path: str) -> None:
    """msgs/s and commit p50/p99 of each system of a `bench.peers --json` run."""
    plt = _pyplot()
    systems = doc["systems"]
    if not systems:
        raise ValueError("the peers JSON holds no systems")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.6 * len(systems) + 1.8), sharey=True)
    try:
        y = list(range(len(systems)))[::-1]
        names = [s["system"].replace(", ", ",\n", 1) for s in systems]
        left.barh(y, [s["msgs_per_s"] for s in systems], color="tab:blue")
        for yi, s in zip(y, systems):
            ratio = f" (pulsartxn: {s['ratio']:.2f}x)" if s.get("ratio") else ""
            left.annotate(f" {s['msgs_per_s']:,.0f}{ratio}", (s["msgs_per_s"], yi), va="center")
        left.set_xlim(right=max(s["msgs_per_s"] for s in systems) * 1.35)
        left.set_yticks(y, names, fontsize=8)
        left.set_xlabel("msgs/s (higher is better)")
        h = 0.38
        right.barh([v + h / 2 for v in y], [s["commit_p50_ms"] for s in systems], h, label="p50")
        right.barh([v - h / 2 for v in y], [s["commit_p99_ms"] for s in systems], h, label="p99")
        right.set_xlabel("commit latency ms (lower is better)")
        right.legend()
        w = doc.get("workload", {})
        fig.suptitle(
            f"bench.peers: {w.get('messages')} msgs x {w.get('size')} B, {w.get('batch')} per "
            f"transaction, fsynced; commit {doc.get('commit', '?')}, {doc.get('when', '?')}",
            fontsize=10,
        )
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratios", default=os.path.join(HERE, "results", "ratios.json"))
    parser.add_argument("--peers", default=os.path.join(HERE, "results", "peers.json"))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "img"))
    args = parser.parse_args(argv)
    try:
        with open(args.ratios) as f:
            ratios = json.load(f)
        with open(args.peers) as f:
            peers = json.load(f)
        os.makedirs(args.out, exist_ok=True)
        for name, draw, doc in (("ratios", plot_ratios, ratios), ("peers", plot_peers, peers)):
            path = os.path.join(args.out, f"{name}.png")
            draw(doc, path)
            print(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bench.plot: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
