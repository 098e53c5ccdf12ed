"""The whole messaging layer also runs on the pure-Python twins (PULSARTXN_IMPL=reference)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_messaging_suite_passes_on_the_twins():
    env = dict(os.environ, PULSARTXN_IMPL="reference")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/messaging",
            "tests/storage",
            "-k",
            "not kill_9",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.splitlines()[-1]
    check = subprocess.run(
        [sys.executable, "-c", "import pulsartxn; print(pulsartxn.IMPLEMENTATION)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip() == "reference"


def test_load_works_after_the_types_submodule_is_imported():
    """`pulsartxn._native.types` is bound on the package once imported; `load` must not
    mistake it for the standard library's `types`."""
    import subprocess
    import sys

    code = (
        "import pulsartxn._native.types\n"
        "from pulsartxn._native import load\n"
        "print(load('reference').kind, load('native').kind)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["reference", "native"]
