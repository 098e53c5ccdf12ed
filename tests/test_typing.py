"""The typed surface: mypy checks examples/pulsar_client_style.py (written as docs/API.md
says, with pulsar-client's spellings) against the package's annotations, and flags a program
that gets a type or a keyword wrong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "pulsar_client_style.py"

BAD = """
import pulsartxn

client = pulsartxn.Client("pulsartxn://127.0.0.1:6650")
producer = client.create_producer("t")
producer.send("text")
consumer = client.subscribe("t", "s", subscriptoin_type=pulsartxn.ConsumerType.Shared)
consumer.receive(timeout_millis="10")
txn: pulsartxn.Transaction = client.new_transaction()
txn.commit(timeout_ms="soon")
"""


def mypy(path: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--cache-dir",
            str(cache),
            "--ignore-missing-imports",  # pyarrow, numpy, lmdb ship no stubs to check here
            "--follow-imports=silent",  # the package's own code is not this test's subject
            "--no-error-summary",
            str(path),
        ],
        capture_output=True,
        text=True,
        cwd=path.parent,
        env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=600,
    )


def test_the_example_type_checks_and_a_wrong_program_does_not(tmp_path):
    ok = mypy(EXAMPLE, tmp_path / "cache")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    out = mypy(bad, tmp_path / "cache")
    assert out.returncode == 1, out.stdout + out.stderr
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 4, out.stdout
    assert 'incompatible type "str"; expected "bytes"' in errors[0]
    assert 'did you mean "subscription_type"' in errors[1]
    assert '"timeout_millis"' in errors[2] and '"timeout_ms"' in errors[3]


def test_the_example_runs_unchanged():
    run = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    out = eval(run.stdout)  # noqa: S307 - the example prints a dict literal
    orders = [f"order-{i}" for i in range(10)]
    assert out["sent"] == ["10"] and out["audited"] == orders and out["reported"] == orders
    assert out["first_again"] == ["order-0"]
    assert out["keyed"] == ["customer-0", "customer-1", "customer-2"]  # each in order
    assert out["rejected"] == ["payment-0"]
