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
            # Traced memory over the twins takes minutes; what it checks (positions, not
            # payloads) is subscription.py's, the same on both. The remote variants run the
            # same broker behind the network service (the wire's native codecs have their own
            # agreement tests under tests/native), and a SIGKILL test checks LMDB's atomicity.
            # The ack timeout's and delayed delivery's tests wait on timers, in Python on both.
            # Two tests of MiB payloads check byte bounds of subscription.py's (the same on
            # both) and take 10 s each on the twins, against 0.1-0.3 s natively.
            "not kill_9 and not leaves_positions_not_payloads and not remote and not sigkill"
            " and not test_ack_timeout and not test_delayed"
            " and not test_large_messages_dispatch_whole"
            " and not test_read_ahead_is_bounded_in_bytes",
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


def test_every_native_module_has_a_same_named_twin():
    """Each compiled module under _native has a pure-Python twin of the same name under
    _native/reference, listed in MODULES, giving the same public names."""
    import importlib

    from pulsartxn import _native

    native_dir = ROOT / "pulsartxn" / "_native"
    compiled = sorted(p.stem for p in native_dir.glob("*.pyx"))
    twins = sorted(p.stem for p in (native_dir / "reference").glob("*.py") if p.stem != "__init__")
    assert set(compiled) <= set(twins), set(compiled) - set(twins)
    assert set(compiled) <= set(_native.MODULES)
    for name in compiled:
        native = importlib.import_module(f"pulsartxn._native.{name}")
        twin = importlib.import_module(f"pulsartxn._native.reference.{name}")
        own = native.__name__  # names the module defines, not ones it imports
        public = [
            n
            for n in _native.NAMES
            if hasattr(native, n) and getattr(getattr(native, n), "__module__", own) == own
        ]
        missing = [n for n in public if not hasattr(twin, n)]
        assert public and not missing, (name, missing)
