# cython: language_level=3
"""A write that runs while its caller goes on: ``start`` hands it to the kernel, ``wait``
collects its result.

The journal (storage/journal.py) writes a group's record with O_DIRECT through an io_uring and
commits the group's LMDB transaction while the device works on it. Where there is no io_uring
(an old kernel, a seccomp filter, kernel.io_uring_disabled), ``start`` writes synchronously
with ``pwrite`` and ``wait`` gives its result (``asynchronous`` says which). The twin is
``reference/asyncwrite.py``, always synchronous.

A wait can be bounded: a write the kernel never completes (seen once, a buffered write on a
loaded VM) then raises OSError(ETIME) instead of hanging its caller. That write may still be
running: its buffer stays held for good, and the writer takes no other write.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.errno cimport ETIME, errno
from libc.stdint cimport int64_t

from .includes.uring cimport ptx_ring, ptx_ring_close, ptx_ring_open, ptx_ring_wait, ptx_ring_write

import math
import os


cdef extern from "<unistd.h>" nogil:
    ssize_t pwrite(int fd, const void *buf, size_t count, long long offset)


cdef class AsyncWriter:
    """Writes to the descriptor `fd` (not owned: the caller closes it), one at a time."""

    cdef ptx_ring _ring
    cdef bint _open
    cdef int _fd
    cdef Py_buffer _view
    cdef bint _busy
    cdef bint _stuck  # a bounded wait for the write in flight ran out: never released
    cdef int64_t _done  # a synchronous write's result (or -errno)

    def __cinit__(self, int fd):
        self._fd = fd
        self._busy = False
        self._stuck = False
        self._open = ptx_ring_open(&self._ring) == 0

    def __dealloc__(self):
        if self._busy and not self._stuck:
            self._finish(-1)
        if self._open:
            ptx_ring_close(&self._ring)

    @property
    def asynchronous(self):
        """Whether writes run while the caller goes on (an io_uring was granted)."""
        return bool(self._open)

    @property
    def bounded(self):
        """Whether ``wait(timeout)`` is bounded (synchronous writes are; an io_uring where
        the kernel has IORING_FEAT_EXT_ARG, Linux 5.11)."""
        return not self._open or bool(self._ring.timed)

    @property
    def busy(self):
        """A write was started and not waited for."""
        return bool(self._busy)

    def start(self, buffer, long long offset):
        """Start writing all of `buffer` (kept alive until ``wait``) at `offset`. OSError
        when the kernel refuses the submission (nothing was written)."""
        cdef int rc
        cdef ssize_t n
        if self._stuck:
            raise OSError(ETIME, "an earlier write never completed: the writer takes no more")
        if self._busy:
            raise RuntimeError("a write is in flight: wait() for it first")
        if self._fd < 0:
            raise ValueError("the writer is closed")
        PyObject_GetBuffer(buffer, &self._view, PyBUF_SIMPLE)
        if self._open:
            rc = ptx_ring_write(
                &self._ring, self._fd, self._view.buf, <unsigned>self._view.len, offset
            )
            if rc < 0:
                PyBuffer_Release(&self._view)
                raise OSError(-rc, os.strerror(-rc))
        else:
            with nogil:
                n = pwrite(self._fd, self._view.buf, <size_t>self._view.len, offset)
                self._done = n if n >= 0 else -errno
        self._busy = True

    def wait(self, timeout=None):
        """The bytes the write wrote; OSError if it failed. `timeout` (seconds, None: none)
        bounds the wait where ``bounded``: past it, OSError(ETIME), the write still in flight
        (a later wait may yet collect it)."""
        cdef int64_t timeout_ns = -1
        if timeout is not None:
            if type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout < 0:
                raise ValueError(f"timeout must be a finite number >= 0, not {timeout!r}")
            timeout_ns = <int64_t>(timeout * 1e9)
        if not self._busy:
            raise RuntimeError("no write is in flight")
        cdef int64_t res = self._finish(timeout_ns)
        if res == -ETIME and self._busy:
            self._stuck = True
            raise OSError(ETIME, f"the write did not complete within {timeout} s")
        if res < 0:
            raise OSError(<int>-res, os.strerror(<int>-res))
        return res

    cdef int64_t _finish(self, int64_t timeout_ns):
        cdef int err = 0
        cdef int64_t res
        if self._open:
            with nogil:
                res = ptx_ring_wait(&self._ring, timeout_ns, &err)
            if err == ETIME:
                return -ETIME  # still in flight: the ring and the buffer stay
            if err:
                # The wait failed, not the write: the ring is no longer to be trusted, and the
                # buffer may still be read by the kernel (keep it).
                ptx_ring_close(&self._ring)
                self._open = False
                self._busy = False
                return -err
        else:
            res = self._done
        PyBuffer_Release(&self._view)
        self._busy = False
        self._stuck = False
        return res

    def close(self):
        """Wait for a write in flight (not for one a bounded wait gave up on: its buffer
        stays held), release the ring. Idempotent."""
        if self._busy and not self._stuck:
            self._finish(-1)
        if self._open:
            ptx_ring_close(&self._ring)
            self._open = False
        self._fd = -1
