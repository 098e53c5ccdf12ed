"""``pulsartxn perf --plot FILE``: a run's latency histogram and its throughput over time, in
one PNG. matplotlib is an optional extra, imported only here."""

from __future__ import annotations

from .recorder import Recorder

_MISSING = "--plot needs matplotlib: pip install 'pulsartxn[bench]'"


def require_matplotlib():
    """matplotlib.pyplot on the Agg backend, or ImportError naming the extra to install."""
    try:
        import matplotlib  # the bench extra: only a plot needs it
    except ImportError:
        raise ImportError(_MISSING) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(summary: dict, rec: Recorder, path: str) -> None:
    """Draw the latency histogram and the msgs/s of each progress sample into `path`."""
    plt = require_matplotlib()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    try:
        middles, counts = rec.latency.buckets_ms()
        lat = summary["latency_ms"]
        if len(counts):
            left.bar(middles, counts, width=middles / 128.0, align="center", color="tab:blue")
            left.set_xscale("log")
            for key, style in (("p50", "-"), ("p99", "--"), ("p99.9", ":")):
                if lat.get(key) is not None:
                    left.axvline(lat[key], color="tab:red", linestyle=style, label=key)
            left.legend()
        left.set_xlabel("latency (ms, log scale)")
        left.set_ylabel("operations")
        left.set_title(f"{summary['mode']}: latency of {rec.latency.count:,} operations")
        samples = summary["samples"]
        t = [s["t"] for s in samples]
        right.plot(t, [s["msgs_per_s"] for s in samples], marker="o", label="msgs/s")
        right.plot(t, [s["ops_per_s"] for s in samples], marker=".", label="ops/s")
        right.set_xlabel("seconds since the run began")
        right.set_ylabel("per second")
        right.set_ylim(bottom=0)
        right.set_title(
            f"throughput: {summary['msgs_per_s']:,.0f} msgs/s over {summary['seconds']} s busy"
        )
        right.legend()
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
