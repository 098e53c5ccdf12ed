"""Zeros written ahead past the end of LMDB's data file, so that a synced commit that appends
overwrites written blocks instead of growing the file, which would also commit the file
system's journal. Only for a synced store without a journal (``journal=False``, or no room for
one). The zeros are written inside an aborted LMDB write transaction, so no other writer
touches the pages past ``last_pgno`` meanwhile, and LMDB later overwrites them like any free
page. See docs/internals.md, "Headroom".
"""

from __future__ import annotations

import os

import lmdb

_MiB = 1 << 20
_FADVISE = getattr(os, "posix_fadvise", None)


class Headroom:
    def __init__(
        self,
        env: lmdb.Environment,
        data_dir: str,
        map_size: int,
        *,
        min_chunk: int = _MiB,
        max_chunk: int = 8 * _MiB,
        min_free_bytes: int = 64 * _MiB,
        bulk_bytes: int | None = 48 << 10,
    ) -> None:
        self._env = env
        self._dir = data_dir
        self._fd = os.open(os.path.join(data_dir, "data.mdb"), os.O_WRONLY)
        self._psize = env.stat()["psize"]
        self._map_size = map_size
        self._min_chunk = min_chunk
        self._max_chunk = max_chunk
        self._min_free = min_free_bytes
        self._size = os.fstat(self._fd).st_size
        self._bulk = bulk_bytes
        self._last_used = (env.info()["last_pgno"] + 1) * self._psize
        self._growth = 0.0  # bytes appended per group that appended (moving average)
        self._skip = 0  # groups to let pass before trying again after a refusal
        self.extensions = 0
        self.bytes_written = 0

    def _chunk(self, size: int) -> int:
        """An eighth of the file, between min_chunk and max_chunk (page multiples)."""
        chunk = min(max(size // 8, self._min_chunk), self._max_chunk)
        return chunk - chunk % self._psize

    def after_group(self) -> None:
        """Called after each group commit, with the commit lock held. Only an optimization:
        whatever goes wrong here pauses it and fails nobody's write."""
        if self._skip or self._fd < 0:
            self._skip = max(self._skip - 1, 0)
            return
        try:
            used = (self._env.info()["last_pgno"] + 1) * self._psize
            grown, self._last_used = used - self._last_used, used
            if grown > 0:
                self._growth += (grown - self._growth) / 8
            if self._bulk is not None and self._growth >= self._bulk:
                # Bulk appends: the zeros would double what reaches the disk, to save one
                # journal commit per group (bench/RESULTS.md, "Figures behind the design").
                return
            if self._size - used >= self._chunk(self._size) // 2:
                return
            self._extend()
        except (OSError, lmdb.Error):
            self._skip = 1000

    def _extend(self) -> None:
        lmdb_txn = self._env.begin(write=True)  # LMDB's writer lock, for the length of this
        try:
            size = os.fstat(self._fd).st_size
            used = (self._env.info()["last_pgno"] + 1) * self._psize
            chunk = self._chunk(size)
            if size - used >= chunk // 2:
                self._size = size
                return
            chunk = min(chunk, self._map_size - size)
            stat = os.statvfs(self._dir)
            if chunk <= 0 or stat.f_bavail * stat.f_frsize < chunk + self._min_free:
                self._size = size
                self._skip = 1000
                return
            try:
                os.pwrite(self._fd, bytes(chunk), size)
            except OSError:
                os.ftruncate(self._fd, size)  # past LMDB's last page: nobody's bytes
                self._size = size
                self._skip = 1000
                return
            # Start writing the zeros out now rather than in the next commit's fdatasync
            # (Linux; elsewhere the next fsync writes them).
            if _FADVISE is not None:
                _FADVISE(self._fd, size, chunk, os.POSIX_FADV_DONTNEED)
            self._size = size + chunk
            self.extensions += 1
            self.bytes_written += chunk
        finally:
            lmdb_txn.abort()

    def close(self) -> None:
        """With the commit lock held (no group, and so no after_group, in progress): the fd
        must not be closed under an extension, nor reused by another file while one runs."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
