"""AsyncWriter (native: an io_uring; twin: pwrite at start) writes what pwrite would: the same
counts, the same file bytes, the same errors, on random writes through the page cache and with
O_DIRECT."""

from __future__ import annotations

import errno
import mmap
import os
import random

import pytest

from pulsartxn._native import load

NATIVE, TWIN = load("native"), load("reference")
BLOCK = 4096


def _run(ns, path, flags, writes):
    """Apply `writes` ((offset, data)) with ns.AsyncWriter; each wait()'s result and the
    file's bytes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    writer = ns.AsyncWriter(fd)
    stage = mmap.mmap(-1, 1 << 20)  # page-aligned, as direct writes need
    results = []
    try:
        for offset, data in writes:
            stage[: len(data)] = data
            writer.start(memoryview(stage)[: len(data)], offset)
            assert writer.busy
            results.append(writer.wait(timeout=60))  # a lost completion fails, not hangs
            assert not writer.busy
    finally:
        writer.close()
        os.close(fd)
        stage.close()
    with open(path, "rb") as f:
        return results, f.read()


def _random_writes(seed, aligned):
    rng = random.Random(seed)
    writes = []
    for _ in range(60):
        if aligned:
            offset = rng.randrange(0, 256) * BLOCK
            data = rng.randbytes(rng.randint(1, 16) * BLOCK)
        else:
            offset = rng.randrange(0, 1 << 20)
            data = rng.randbytes(rng.randint(1, 70000))
        writes.append((offset, data))
    return writes


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_buffered_writes_match_the_twin(tmp_path, seed):
    writes = _random_writes(seed, aligned=False)
    native = _run(NATIVE, tmp_path / "native", 0, writes)
    twin = _run(TWIN, tmp_path / "twin", 0, writes)
    assert native == twin
    assert native[0] == [len(d) for _, d in writes]


@pytest.mark.parametrize("seed", [4, 5])
def test_direct_writes_match_the_twin(tmp_path, seed):
    if not getattr(os, "O_DIRECT", 0):
        pytest.skip("no O_DIRECT here")
    writes = _random_writes(seed, aligned=True)
    try:
        native = _run(NATIVE, tmp_path / "native", os.O_DIRECT, writes)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            pytest.skip("this file system takes no direct writes")
        raise
    twin = _run(TWIN, tmp_path / "twin", os.O_DIRECT, writes)
    assert native == twin
    expected = bytearray(len(native[1]))
    for offset, data in writes:
        expected[offset : offset + len(data)] = data
    assert native[1] == bytes(expected)


@pytest.mark.parametrize("ns", [NATIVE, TWIN], ids=["native", "twin"])
def test_errors_come_from_wait_and_leave_the_writer_usable(tmp_path, ns):
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o644)
    writer = ns.AsyncWriter(fd)
    stage = mmap.mmap(-1, 2 * BLOCK)
    try:
        with pytest.raises(RuntimeError):
            writer.wait()  # nothing started
        if getattr(os, "O_DIRECT", 0):
            writer.start(memoryview(stage)[1 : BLOCK + 1], 0)  # misaligned: EINVAL
            with pytest.raises(OSError) as info:
                writer.wait()
            assert info.value.errno == errno.EINVAL
        stage[:BLOCK] = b"x" * BLOCK
        writer.start(memoryview(stage)[:BLOCK], BLOCK)
        with pytest.raises(RuntimeError):
            writer.start(memoryview(stage)[:BLOCK], 0)  # one at a time
        assert writer.wait() == BLOCK
    finally:
        writer.close()
        os.close(fd)
    assert path.read_bytes() == bytes(BLOCK) + b"x" * BLOCK
    with pytest.raises(ValueError):
        writer.start(b"late", 0)  # closed


@pytest.mark.parametrize("ns", [NATIVE, TWIN], ids=["native", "twin"])
def test_a_closed_descriptor_fails_the_write(tmp_path, ns):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    writer = ns.AsyncWriter(fd)
    os.close(fd)
    try:
        try:
            writer.start(b"data", 0)
        except OSError as exc:  # refused at submission
            assert exc.errno == errno.EBADF
        else:
            with pytest.raises(OSError) as info:
                writer.wait()
            assert info.value.errno == errno.EBADF
    finally:
        writer.close()


def _io_uring_granted() -> bool:
    """Whether this process may set up an io_uring (asked of the kernel directly)."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    fd = libc.syscall(425, 1, params)  # io_uring_setup (425 on x86_64 and aarch64)
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_the_native_writer_overlaps_where_io_uring_is_granted(tmp_path):
    """Where the kernel grants an io_uring, the native writer uses it (else it writes
    synchronously, like the twin)."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        writer = NATIVE.AsyncWriter(fd)
        assert writer.asynchronous is _io_uring_granted()
        writer.close()
        assert TWIN.AsyncWriter(fd).asynchronous is False
    finally:
        os.close(fd)


@pytest.fixture
def full_pipe():
    """(read end, write end, bytes in it) of a pipe whose buffer is full: a write to it waits
    until its reader reads. Skips where the native writer cannot bound a wait."""
    probe = NATIVE.AsyncWriter(-1)
    bounded = probe.asynchronous and probe.bounded
    probe.close()
    if not bounded:
        pytest.skip("no io_uring with bounded waits here: every write is synchronous")
    r, w = os.pipe()
    os.set_blocking(w, False)
    filled = 0
    try:
        while True:
            filled += os.write(w, bytes(4096))
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    yield r, w, filled
    os.close(r)
    os.close(w)


def _read(fd, n) -> bytes:
    got = b""
    while len(got) < n:
        got += os.read(fd, n - len(got))
    return got


def test_a_write_that_never_completes_times_out_and_holds_the_writer(full_pipe):
    """A bounded wait for a write the kernel does not complete (into a full pipe here, a
    lost completion in the journal) raises ETIME in time instead of hanging; the write
    stays in flight, the writer takes no other, and a later wait collects it."""
    r, w, filled = full_pipe
    writer = NATIVE.AsyncWriter(w)
    stage = mmap.mmap(-1, BLOCK)
    stage[:] = b"y" * BLOCK
    try:
        writer.start(memoryview(stage), 0)
        with pytest.raises(OSError) as info:
            writer.wait(timeout=0.2)
        assert info.value.errno == errno.ETIME and writer.busy
        with pytest.raises(OSError) as info:
            writer.start(b"other", 0)
        assert info.value.errno == errno.ETIME
        with pytest.raises(BufferError):
            stage.close()  # the kernel may still read it: the writer holds it
        assert _read(r, filled) == bytes(filled)  # room: the write completes
        assert _read(r, BLOCK) == b"y" * BLOCK
        assert writer.wait(timeout=5) == BLOCK
        assert not writer.busy
        writer.start(b"z", 0)
        assert writer.wait(timeout=5) == 1
    finally:
        writer.close()
    stage.close()


def test_closing_a_writer_whose_write_never_completed_does_not_wait(full_pipe):
    writer = NATIVE.AsyncWriter(full_pipe[1])
    stage = mmap.mmap(-1, BLOCK)
    writer.start(memoryview(stage), 0)
    with pytest.raises(OSError):
        writer.wait(timeout=0.05)
    writer.close()  # returns: the buffer stays held, the ring is let go
    assert not writer.asynchronous


@pytest.mark.parametrize("ns", [NATIVE, TWIN], ids=["native", "twin"])
@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", True])
def test_a_wait_bound_must_be_a_finite_number(tmp_path, ns, bad):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    writer = ns.AsyncWriter(fd)
    try:
        writer.start(b"data", 0)
        with pytest.raises(ValueError):
            writer.wait(timeout=bad)
        assert writer.busy  # nothing changed
        assert writer.wait(timeout=5) == 4
    finally:
        writer.close()
        os.close(fd)
