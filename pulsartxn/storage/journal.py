"""Write-ahead journal of a synced store: one device flush per group commit.

A synced store opens LMDB without syncing and makes each group durable here first: the
group's recorded puts and deletes (recording.py) are written with O_DIRECT into a file of
zeros and fdatasynced, and a background checkpoint makes LMDB itself durable at a snapshot
that no later write may touch until the next checkpoint. The broker publishes what a group
did only once its record is durable. See docs/internals.md, "How a write becomes durable".
Recovery at open (the checkpoint put back, the records replayed) is in journal_recovery.py.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
import threading
import time

from .._native import AsyncWriter
from ..errors import StorageError, StorageFull
from .figures import LATENCY_S, Buckets
from .journal_format import (
    BLOCK,
    FILE,
    HEAD,
    META_BYTES,
    META_MAGIC,
    META_MAGIC_AT,
    META_TXNID_AT,
    PAD_MAGIC,
    RECORD,
    RECORD_MAGIC,
    SLOT,
    ZERO_CHUNK,
    blocks,
    fsync_dir,
    open_direct,
    pack_header,
    read_header,
    record_crc,
    write_zeros,
)
from .journal_recovery import JournalRecovery
from .ops import free_bytes

_LOG = logging.getLogger("pulsartxn.journal")

# How long a record's direct write may take before the journal gives it up for lost (a
# completion the kernel never delivered): the group fails and the journal halts, as after a
# failed write, rather than every writer hanging behind it.
WRITE_WAIT_S = 30.0


class Journal(JournalRecovery):
    """The journal file of one store. Writers (the group commit, under its commit lock) call
    ``append``; ``checkpoint`` may run in any thread."""

    def __init__(self, path: str, fd: int, region: int, header: dict | None) -> None:
        self.path = path
        self._fd = fd
        self.region = region
        self.header = header  # the latest valid header read at open (None: a new journal)
        self._seq = header["seq"] if header else 0
        self.lsn = header["replay_lsn"] if header else 0  # where the next record goes
        self._durable_lsn = self.lsn  # records before the last checkpoint's lsn are spent
        self._size = os.fstat(fd).st_size  # bytes written (zeros included)
        self._last: int | None = None  # lsn of the last record appended (for retract)
        self._header_lock = threading.Lock()
        self._pin = None  # the read transaction that keeps the checkpoint's pages
        self._data_fd: int | None = None
        self._psize = 0
        self.failed: BaseException | None = None
        self._direct = open_direct(path)
        self._writer = AsyncWriter(self._direct if self._direct is not None else -1)
        self._writing: tuple[int, int] | None = None  # (position, bytes) of a direct write
        self._started = 0  # blocks of the record started and not finished
        self._stage: mmap.mmap | None = None
        self.records = 0
        self.flushes = 0  # fdatasyncs that made records durable
        # Held groups' changes (their record payloads), committed to LMDB, that the next
        # record carries before its own: lost with the process until then.
        self._carry: list[bytes] = []
        self.carried = 0
        self.checkpoints = 0
        self.checkpointed_at = time.monotonic()
        self.replayed = 0
        self.write_seconds = Buckets(LATENCY_S)  # a record's write, start to written
        self.fsync_seconds = Buckets(LATENCY_S)  # the fdatasync that makes records durable
        self._started_at = 0.0

    # -- open / create ----------------------------------------------------------------------

    @classmethod
    def open(cls, data_dir: str, size: int) -> Journal | None:
        """The store's journal, created (zero-filled, `size` bytes of region) if missing;
        None when the disk has no room for one (the store then syncs LMDB itself)."""
        path = os.path.join(data_dir, FILE)
        if os.path.exists(path):
            fd = os.open(path, os.O_RDWR)
            try:
                header = read_header(fd)
            except BaseException:
                os.close(fd)
                raise
            if header is None:
                # Never checkpointed: the store was being created when it stopped. Nothing
                # in it was ever acknowledged through this journal; start it anew.
                journal = cls(path, fd, size & ~(BLOCK - 1), None)
            else:
                journal = cls(path, fd, header["region"], header)
            journal._fill()
            return journal
        free = free_bytes(data_dir)
        short = free is not None and free < 8 * size
        if short:
            size = min(size, (free // 8) & ~(ZERO_CHUNK - 1))
        size &= ~(BLOCK - 1)
        if size < ZERO_CHUNK:
            _disabled(
                data_dir,
                f"no room for one ({free} bytes free; it takes up to an eighth, {ZERO_CHUNK} "
                "bytes at least)"
                if short
                else f"journal_bytes={size} is under the least journal ({ZERO_CHUNK} bytes)",
            )
            return None
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            write_zeros(fd, 0, HEAD + size)
            os.fsync(fd)
            fsync_dir(data_dir)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            _disabled(data_dir, f"cannot create it ({exc})")
            return None
        return cls(path, fd, size, None)

    def _fill(self) -> None:
        """Zeros up to the end of the region, if a stop cut the file's creation short."""
        end = HEAD + self.region
        if self._size < end:
            try:
                write_zeros(self._fd, self._size, end - self._size)
                os.fsync(self._fd)
                self._size = end
            except OSError:
                self._size = os.fstat(self._fd).st_size  # records grow it as they come

    def attach(self, env, data_path: str) -> None:
        """Use `env` (LMDB opened without syncing) from now on."""
        self._env = env
        self._data_fd = os.open(data_path, os.O_RDWR)
        self._psize = env.stat()["psize"]

    # -- appending --------------------------------------------------------------------------

    def check(self) -> None:
        if self.failed is not None:
            raise StorageError(
                f"the journal failed a write earlier ({self.failed}); reopen the broker, "
                "which recovers what was acknowledged"
            ) from None

    def append(self, payload: bytes, txnid: int) -> bool:
        """Write one record and make it durable. False when it does not fit before the last
        checkpoint's first record, or is over half the journal (the caller commits that group
        directly and checkpoints)."""
        if not self.start(payload, txnid):
            return False
        self.finish()
        return True

    def carry(self, payload: bytes) -> None:
        """A held group's changes: the next record writes them first (see WriteOp.held)."""
        self._carry.append(payload)
        self.carried += len(payload)

    def carried_over(self) -> None:
        """The held groups' changes are in a record or a checkpoint: nothing to carry."""
        self._carry = []
        self.carried = 0

    def start(self, payload: bytes, txnid: int) -> bool:
        """``append`` in two steps: start writing the record (False, and nothing written, as
        ``append`` says); ``finish`` makes it durable, ``abandon`` takes it back. In between
        the device writes while the caller goes on (the group commit commits the group's LMDB
        transaction meanwhile), where the journal writes directly through an io_uring."""
        self._settle()
        if self._carry:  # replayed in order: the held groups' changes, then this group's
            payload = b"".join(self._carry) + payload
        size = len(payload)
        need = blocks(RECORD.size + size)
        if need > self.region // 2:
            return False
        lsn = self.lsn
        left = self.region - lsn % self.region
        pad = left if left < need else 0
        if lsn + pad + need - self._durable_lsn > self.region:
            return False
        self._started_at = time.monotonic()
        try:
            if pad:
                self._write(RECORD.pack(PAD_MAGIC, 0, lsn, txnid, record_crc(lsn, txnid, b"")), lsn)
                lsn += pad
            header = RECORD.pack(RECORD_MAGIC, size, lsn, txnid, record_crc(lsn, txnid, payload))
            self._write(header, lsn, payload, wait=False)
        except OSError as exc:
            raise self._write_error(exc) from exc
        self._last = lsn
        self._started = need
        return True

    def finish(self, flush: bool = True) -> None:
        """The started record is written: make it durable (StorageError if it cannot be;
        the journal then takes no more records). flush=False: it stays in flight; the next
        record waits for it first (a failure then fails the journal), and the next flush
        makes it durable too (one file, flushed whole)."""
        lsn, need = self._last, self._started
        self._started = 0
        self.carried_over()  # they are in this record
        if not flush:
            self.lsn = lsn + need
            self.records += 1
            return
        try:
            self._written()
        except OSError as exc:
            raise self._write_error(exc) from exc
        written = time.monotonic()
        self.write_seconds.observe(written - self._started_at)
        try:
            os.fdatasync(self._fd)
            self.flushes += 1
        except OSError as exc:
            # After a failed fdatasync the kernel may have dropped the pages it could not
            # write: nothing since the last good one can be trusted until a reopen recovers.
            self._halt(exc, "the journal could not sync")
            raise StorageError(f"the journal could not sync: {exc}") from exc
        self.fsync_seconds.observe(time.monotonic() - written)
        self.lsn = lsn + need
        self.records += 1

    def _settle(self) -> None:
        """Wait for a record left in flight (finish without flush): its failure is a past
        group's, answered already, so the journal fails and takes no more records."""
        if self._writing is None:
            return
        try:
            self._written()
        except OSError as exc:
            self._halt(exc, "the journal could not write an earlier record")
            raise StorageError(f"the journal could not write an earlier record: {exc}") from exc

    def abandon(self) -> None:
        """Take back the started record: the group it holds did not happen."""
        if self._started:
            self._started = 0
            try:
                self._written()
            except OSError as exc:
                self._halt(exc, "the journal could not write a record it takes back")
                return
        self.retract()

    def _write_error(self, exc: OSError) -> StorageError:
        if exc.errno == errno.ENOSPC:
            # Growing a journal that a full disk kept short: nothing was made durable, and
            # the next record is written at the same place.
            return StorageFull(f"disk is full: the journal cannot grow ({exc})")
        self._halt(exc, "the journal could not write")
        return StorageError(f"the journal could not write: {exc}")

    def retract(self) -> None:
        """Undo the record just appended: its LMDB commit failed, so the group did not happen
        and must not be replayed."""
        lsn = self._last
        if lsn is None:
            return
        try:
            self._write(bytes(RECORD.size), lsn)
            os.fdatasync(self._fd)
        except OSError as exc:
            self._halt(exc, "the journal could not take back a record")
            return
        self.lsn = lsn
        self._last = None

    def _write(self, header: bytes, lsn: int, payload: bytes = b"", wait: bool = True) -> None:
        """The record at `lsn`, whole blocks of it: with O_DIRECT from an aligned staging
        buffer (no page cache in between: the fdatasync that follows has only the device
        cache to flush), else through the page cache. Without `wait` a direct write may still
        be running when this returns: ``_written`` waits for it."""
        pos = HEAD + lsn % self.region
        n = len(header) + len(payload)
        end = pos + blocks(n)
        if end > self._size:  # a journal that a full disk kept short: grow it here
            write_zeros(self._fd, self._size, end - self._size)
            self._size = end
        if self._direct is not None:
            stage = self._stage
            if stage is None or len(stage) < end - pos:
                stage = self._stage = mmap.mmap(-1, max(end - pos, 1 << 16))
            stage[: len(header)] = header
            stage[len(header) : n] = payload
            self._writer.start(memoryview(stage)[: end - pos], pos)
            self._writing = (pos, n)
            if wait:
                self._written()
            return
        os.pwrite(self._fd, header + payload if payload else header, pos)

    def _written(self) -> None:
        """Wait for the direct write in flight, if any. A file system that takes no direct
        writes after all (EINVAL) gets the record through the page cache instead."""
        if self._writing is None:
            return
        pos, n = self._writing
        self._writing = None
        try:
            done = self._writer.wait(WRITE_WAIT_S)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            record = bytes(self._stage[:n])
            self._close_direct()
            os.pwrite(self._fd, record, pos)
            return
        if done < n:
            raise OSError(errno.EIO, f"short journal write ({done} of {n} bytes)")

    def _close_direct(self) -> None:
        self._writer.close()
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None
        self._stage = None

    def _halt(self, exc: BaseException, what: str) -> None:
        """The journal takes no more records until a reopen recovers: said once, an ERROR."""
        if self.failed is None:
            _LOG.error(
                "storage halted, no more writes: %s in %s (%s); reopen the broker to recover "
                "what was acknowledged",
                what,
                os.path.dirname(self.path),
                exc,
            )
        self.failed = exc

    @property
    def used(self) -> int:
        """Bytes of records since the last checkpoint."""
        return self.lsn - self._durable_lsn

    # -- checkpoints ------------------------------------------------------------------------

    def prepare(self):
        """With no write transaction in progress (the caller holds the commit lock, or is the
        only writer): pin the latest snapshot and note where its later records begin."""
        env = self._env
        for _ in range(8):
            pin = env.begin()
            txnid = pin.id()
            meta = self._read_meta(txnid)
            if meta is not None:
                return pin, txnid, meta, self.lsn
            pin.abort()  # a writer outside the group commit moved on meanwhile: again
        raise StorageError("cannot read the LMDB meta page of the snapshot to checkpoint")

    def complete(self, prepared) -> None:
        """Make the prepared snapshot durable in data.mdb, then record it in the header."""
        pin, txnid, meta, lsn = prepared
        try:
            os.fdatasync(self._data_fd)
            with self._header_lock:
                if self.header is not None and txnid <= self.header["txnid"]:
                    # Nothing new since the last checkpoint: it stands, and a reopened store
                    # pins its snapshot now (until the next checkpoint, LMDB must not reuse
                    # its pages).
                    if self._pin is None and txnid == self.header["txnid"]:
                        self._pin = pin
                    else:
                        pin.abort()
                    return
                header = {
                    "seq": self._seq + 1,
                    "region": self.region,
                    "txnid": txnid,
                    "replay_lsn": lsn,
                    "psize": self._psize,
                    "meta": meta,
                }
                os.pwrite(self._fd, pack_header(header), (header["seq"] & 1) * SLOT)
                os.fdatasync(self._fd)
                self._seq = header["seq"]
                self.header = header
                self._durable_lsn = lsn
                old, self._pin = self._pin, pin
                self.checkpoints += 1
                self.checkpointed_at = time.monotonic()
        except OSError as exc:
            pin.abort()
            self._halt(exc, "a checkpoint failed")
            raise StorageError(f"checkpoint failed: {exc}") from exc
        if old is not None:
            old.abort()

    def checkpoint(self) -> None:
        """prepare + complete, now (the caller holds the commit lock)."""
        self.complete(self.prepare())

    def _read_meta(self, txnid: int) -> bytes | None:
        for slot in (txnid & 1, 1 - (txnid & 1)):
            page = os.pread(self._data_fd, META_BYTES, slot * self._psize)
            magic = struct.unpack_from("<I", page, META_MAGIC_AT)[0]
            if magic == META_MAGIC and struct.unpack_from("<Q", page, META_TXNID_AT)[0] == txnid:
                return page
        return None

    def close(self) -> None:
        with self._header_lock:
            if self._pin is not None:
                self._pin.abort()
                self._pin = None
        if self._data_fd is not None:
            os.close(self._data_fd)
            self._data_fd = None
        try:
            self._settle()
        except StorageError:
            pass  # the records before it are what a reopen replays
        self._close_direct()
        os.close(self._fd)


def _disabled(data_dir: str, why: str) -> None:
    _LOG.warning("no journal in %s: %s; LMDB syncs every commit itself (slower)", data_dir, why)
