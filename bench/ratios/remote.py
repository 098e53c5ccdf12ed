"""The network service vs the embedded client, in one run: bulk produce and scan through
`pulsartxn serve` (a separate process on 127.0.0.1, as deployed) against the same calls on an
embedded broker in this process (each on its own data directory holding the same messages);
per-message round-trip latency of a synchronous send."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from statistics import median

import pyarrow as pa

import pulsartxn

from ._harness import Row, timed


def _server(data_dir: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pulsartxn",
            "serve",
            "--data-dir",
            data_dir,
            "--port",
            "0",
            "--no-sync",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    found = re.search(r"pulsartxn://127\.0\.0\.1:(\d+)", line)
    if not found:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, int(found.group(1))


def _percentile(sorted_values, q: float) -> float:
    return sorted_values[min(int(len(sorted_values) * q), len(sorted_values) - 1)]


def measure(quick: bool = False) -> list[Row]:
    n = 200_000 if quick else 1_000_000
    values = pa.array([os.urandom(100) for _ in range(n)], pa.binary())
    rows = []
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-remote-")
    proc, port = _server(os.path.join(tmp, "served"))
    try:
        with pulsartxn.Broker(os.path.join(tmp, "embedded"), sync=False) as broker:
            local = broker.client()
            remote = pulsartxn.Client(f"pulsartxn://127.0.0.1:{port}")
            lp, rp = local.create_producer("t"), remote.create_producer("t")
            ours, base = [], []
            for _ in range(3):  # alternate, so both see the same machine state
                base.append(timed(lambda: lp.send_batch(values)))
                ours.append(timed(lambda: rp.send_batch(values)))
            rows.append(
                Row(
                    f"send_batch over the network, {n // 1000}k msgs x 100 B (Arrow)",
                    n,
                    "msgs",
                    median(ours),
                    median(base),
                    "embedded send_batch",
                    0.5,
                )
            )
            ours, base = [], []
            counts = []

            def scan(client):
                counts.append(sum(b.num_rows for b in client.scan("t")))

            for _ in range(3):
                base.append(timed(lambda: scan(local)))
                ours.append(timed(lambda: scan(remote)))
            assert counts == [3 * n] * 6, counts  # both read every message, every round
            rows.append(
                Row(
                    f"scan over the network, {3 * n // 1000}k msgs",
                    3 * n,
                    "msgs",
                    median(ours),
                    median(base),
                    "embedded scan",
                    0.5,
                )
            )
            k = 500 if quick else 2000
            lat, local_lat = [], []
            for _ in range(k):
                lat.append(timed(lambda: rp.send(b"x" * 100)))
                local_lat.append(timed(lambda: lp.send(b"x" * 100)))
            lat.sort()
            local_lat.sort()
            p50, p99 = _percentile(lat, 0.5), _percentile(lat, 0.99)
            rows.append(
                Row(
                    f"send() round trip over the network: p50 {p50 * 1e6:.0f} us, "
                    f"p99 {p99 * 1e6:.0f} us",
                    1,
                    "msgs",
                    p50,
                    _percentile(local_lat, 0.5),
                    "embedded send() p50",
                    None,
                )
            )
            remote.close()
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
