"""The wheel builds from the source tree and works where Cython is not installed; it holds
compiled, stripped extensions and no sources, and its metadata says what it is."""

from __future__ import annotations

import email.parser
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a working tree holds that is not the package's source.
_NOT_SOURCES = (
    ".git",
    ".venv",
    ".asv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.so",
    ".pytest_cache",
    ".benchmarks",
    "pulsartxn-data",
    "pulsartxn-cluster",
)


def run(cmd: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_wheel_installs_and_imports_without_cython(tmp_path):
    wheels = tmp_path / "wheels"
    # From a copy of the sources: a working tree's build/ (what earlier builds left, .c and
    # .pyx included) would be packed as it is.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    # The C Cython made and the extensions compiled from it by the install under test (this
    # setup.py, release flags, stripped) go where the wheel's build looks for them, each newer
    # than what it is made of (numpy's declarations, installed after the C was made, would
    # have Cython it again): nothing is compiled again (about 35 s of CPU in a busy suite).
    # That the sources compile is checked by that install; what the wheel packs, here.
    for c in (source / "pulsartxn" / "_native").glob("*.c"):
        os.utime(c)
    platlib = source / _build_platlib() / "pulsartxn" / "_native"
    platlib.mkdir(parents=True)
    for so in (ROOT / "pulsartxn" / "_native").glob("*.so"):
        shutil.copy(so, platlib / so.name)  # a new mtime: newer than its C
    # Without build isolation: pip's isolated build would install the build requirements anew
    # (numpy among them) and, finding its declarations newer than the C, Cython and compile
    # everything again. That the build requirements suffice is checked by the install the
    # tests run on (`pip install -e`, isolated); the test extras hold them.
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(wheels), str(source)],
        tmp_path,
        env={**os.environ, "PULSARTXN_OPT": "-O0"},  # a compile (a failure below) fails fast
    )
    (wheel,) = wheels.glob("pulsartxn-*.whl")
    venv = tmp_path / "venv"
    # No pip of its own (8 s): this interpreter's pip installs into it (`pip --python`).
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    # Without PYTHONPATH: a source tree on it (its .egg-info) would pass for the installed wheel.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PULSARTXN_IMPL")}
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    run([*pip, "install", "-q", str(wheel)], tmp_path, env=env)
    no_cython = "import importlib.util as u; assert u.find_spec('Cython') is None, 'Cython here'"
    run([str(python), "-c", no_cython], tmp_path, env=env)
    proc = run([str(python), str(ROOT / "tests" / "wheel_smoke.py")], tmp_path, env=env)
    assert proc.stdout.startswith("ok ") and str(venv) in proc.stdout
    proc = run([str(venv / "bin" / "pulsartxn"), "--version"], tmp_path, env=env)
    assert proc.stdout == f"pulsartxn {_declared('version')}\n"
    check_contents(wheel)
    check_metadata(wheel)
    with zipfile.ZipFile(wheel) as zf:  # what the install compiled, not a build of its own
        for name in (n for n in zf.namelist() if n.endswith(".so")):
            installed = ROOT / name
            assert zf.read(name) == installed.read_bytes(), f"{name} was compiled again"


def _build_platlib() -> str:
    """Where setuptools' build puts extension modules (build/lib.<platform>-<tag>)."""
    from setuptools.command.build import build
    from setuptools.dist import Distribution

    command = build(Distribution())
    command.finalize_options()
    return command.build_platlib


def _declared(field: str) -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return text.split(f"\n{field} = ", 1)[1].split("\n", 1)[0].strip('"')


def elf_sections(data: bytes) -> set[str]:
    """The section names of a 64-bit little-endian ELF file (a Linux x86_64/aarch64 .so)."""
    assert data[:6] == b"\x7fELF\x02\x01", "not a 64-bit little-endian ELF file"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]  # sh_offset of the section-name string table
    return {
        data[names_at + name : data.index(b"\0", names_at + name)].decode() for name, *_ in headers
    }


def check_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert not [n for n in names if n.endswith((".c", ".pyx"))], names
        pyx = sorted(p.stem for p in (ROOT / "pulsartxn" / "_native").glob("*.pyx"))
        so = sorted(n for n in names if n.endswith(".so"))
        assert [n.split("/")[-1].split(".")[0] for n in so] == pyx, so
        for name in so:
            sections = elf_sections(zf.read(name))
            assert ".dynsym" in sections and ".symtab" not in sections, (name, sections)
        # Stubs for type checkers and declarations for cimport stay (pyproject.toml).
        assert "pulsartxn/_native/txnid.pyi" in names and "pulsartxn/_native/txnid.pxd" in names
        assert "pulsartxn/py.typed" in names
        # The licence's text travels with the code (Apache-2.0 asks for it).
        (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert b"Apache License" in zf.read(licence)


def check_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(zf.read(meta).decode())
    assert metadata["Version"] == _declared("version")
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.10"
    classifiers = metadata.get_all("Classifier")
    for expected in (
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Cython",
        "Topic :: System :: Distributed Computing",
        *(f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14)),
    ):
        assert expected in classifiers, expected
    assert any(c.startswith("Development Status :: ") for c in classifiers), classifiers
    for url in metadata.get_all("Project-URL") or []:  # label, address
        assert url.split(", ", 1)[1].startswith("https://"), url
