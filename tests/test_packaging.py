"""The wheel builds from the source tree and works where Cython is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_wheel_installs_and_imports_without_cython(tmp_path):
    wheels = tmp_path / "wheels"
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        tmp_path,
    )
    (wheel,) = wheels.glob("pulsartxn-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", str(wheel)], tmp_path)
    smoke = textwrap.dedent(
        """
        import importlib.util, numpy as np
        assert importlib.util.find_spec("Cython") is None, "Cython must not be installed here"
        import pulsartxn
        from pulsartxn import _native
        assert pulsartxn.IMPLEMENTATION == "native", pulsartxn.IMPLEMENTATION
        t = pulsartxn.TxnID(65535, 2**112 - 1)
        assert pulsartxn.TxnID.unpack(t.pack()) == t
        s = _native.AbortSet([t])
        assert s.contains_many(np.array([t.most_sig_bits], dtype=np.uint64),
                               np.array([t.least_sig_bits], dtype=np.uint64)).tolist() == [True]
        assert _native.AckSet(64, full=True).is_full()
        entry = _native.encode_entry([b"a", b"bc"])
        assert _native.decode_entries([0], [entry]).num_messages == 2
        print("ok", pulsartxn.__file__)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PULSARTXN_IMPL")}
    proc = run([str(python), "-c", smoke], tmp_path, env=env)
    assert proc.stdout.startswith("ok ") and str(venv) in proc.stdout
