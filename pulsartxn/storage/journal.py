"""Write-ahead journal of a synced store: one device flush per group commit.

A synced store opens LMDB without syncing and makes each group durable here first: the
group's recorded puts and deletes (recording.py) are written with O_DIRECT into a file of
zeros and fdatasynced, and a background checkpoint makes LMDB itself durable at a snapshot
that no later write may touch until the next checkpoint. The broker publishes what a group
did only once its record is durable. See docs/internals.md, "How a write becomes durable".
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import threading
import time

from .._native import AsyncWriter, crc32c
from ..errors import CorruptEntry, StorageError, StorageFull
from .ops import free_bytes
from .recording import apply_record

# File: two header slots written alternately (the valid one with the highest sequence wins,
# so a torn header write loses nothing), then a circular region of records addressed by a
# byte sequence number (lsn): the record at lsn lives at HEAD + lsn % region and carries its
# lsn and a CRC-32C, so a record of an earlier lap, or one a crash tore, ends the replay.
FILE = "journal"
HEAD = 8192  # two header slots of 4 KiB
_SLOT = 4096
_MAGIC = b"PTXJRNL1"
_HEADER = struct.Struct("<8sQQQQII")  # magic, seq, region, txnid, replay lsn, psize, meta len
_REC = struct.Struct("<IIQQI")  # magic, payload length, lsn, LMDB txnid, crc32c
_REC_MAGIC = 0x4A525031  # "1PRJ"
_PAD_MAGIC = 0x4A525050  # "PPRJ": the rest of the lap is empty
# LMDB's meta page: the page header (16 bytes) and MDB_meta (magic at 16, last_pg at 136,
# txnid at 144). A checkpoint keeps its first META_BYTES.
META_BYTES = 256
_META_MAGIC = 0xBEEFC0DE
_META_MAGIC_AT, _META_TXNID_AT = 16, 144
_ZERO_CHUNK = 1 << 20
BLOCK = 4096  # records start on block boundaries and take whole blocks (direct I/O)


class Journal:
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
        self._direct = _open_direct(path)
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
        self.replayed = 0

    # -- open / create ----------------------------------------------------------------------

    @classmethod
    def open(cls, data_dir: str, size: int) -> Journal | None:
        """The store's journal, created (zero-filled, `size` bytes of region) if missing;
        None when the disk has no room for one (the store then syncs LMDB itself)."""
        path = os.path.join(data_dir, FILE)
        if os.path.exists(path):
            fd = os.open(path, os.O_RDWR)
            try:
                header = _read_header(fd)
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
        if free is not None and free < 8 * size:
            size = min(size, (free // 8) & ~(_ZERO_CHUNK - 1))
        size &= ~(BLOCK - 1)
        if size < _ZERO_CHUNK:
            return None
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _write_zeros(fd, 0, HEAD + size)
            os.fsync(fd)
            fsync_dir(data_dir)
        except OSError:
            os.close(fd)
            os.unlink(path)
            return None
        return cls(path, fd, size, None)

    def _fill(self) -> None:
        """Zeros up to the end of the region, if a stop cut the file's creation short."""
        end = HEAD + self.region
        if self._size < end:
            try:
                _write_zeros(self._fd, self._size, end - self._size)
                os.fsync(self._fd)
                self._size = end
            except OSError:
                self._size = os.fstat(self._fd).st_size  # records grow it as they come

    def attach(self, env, data_path: str) -> None:
        """Use `env` (LMDB opened without syncing) from now on."""
        self._env = env
        self._data_fd = os.open(data_path, os.O_RDWR)
        self._psize = env.stat()["psize"]

    # -- recovery ---------------------------------------------------------------------------

    def restore_meta(self, data_path: str) -> bool:
        """Put the checkpoint's meta page back into both of data.mdb's meta slots (the other
        as the snapshot before it, pointing to the same pages): LMDB then opens at the
        checkpoint, whatever later meta pages reached the disk. True when something changed."""
        header = self.header
        if header is None:
            return False
        meta, txnid, psize = header["meta"], header["txnid"], header["psize"]
        fd = os.open(data_path, os.O_RDWR)
        changed = False
        try:
            for slot in (0, 1):
                want = bytearray(meta)
                if slot != txnid & 1:
                    struct.pack_into("<Q", want, 0, slot)
                    struct.pack_into("<Q", want, _META_TXNID_AT, max(txnid - 1, 0))
                if os.pread(fd, META_BYTES, slot * psize) != bytes(want):
                    os.pwrite(fd, bytes(want), slot * psize)
                    changed = True
            if changed:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        return changed

    def replay(self, env) -> int:
        """Apply the records after the checkpoint, in one write transaction; the next record
        goes after the last valid one. Returns how many records were applied."""
        if self.header is None:
            return 0
        handles: dict = {}
        count = 0
        end = self.header["replay_lsn"]
        with env.begin(write=True) as lmdb_txn:
            # The last record's end is where the next one goes.
            for end, payload in self._records(self.header["replay_lsn"]):  # noqa: B007
                apply_record(env, lmdb_txn, payload, handles)
                count += 1
        self.lsn = end
        self.replayed = count
        return count

    def _records(self, lsn: int):
        """(lsn after, payload) of each valid record from `lsn` on."""
        fd = self._fd
        size = self._size
        while True:
            offset = lsn % self.region
            left = self.region - offset
            pos = HEAD + offset
            if pos + _REC.size > size:
                return
            magic, length, at, txnid, crc = _REC.unpack(os.pread(fd, _REC.size, pos))
            if at != lsn:
                return
            if magic == _PAD_MAGIC and length == 0 and crc == _crc(at, txnid, b""):
                lsn += left
                continue
            span = _blocks(_REC.size + length)
            if magic != _REC_MAGIC or span > left or pos + _REC.size + length > size:
                return
            payload = os.pread(fd, length, pos + _REC.size)
            if len(payload) != length or crc != _crc(at, txnid, payload):
                return
            lsn += span
            yield lsn, payload

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
        need = _blocks(_REC.size + size)
        if need > self.region // 2:
            return False
        lsn = self.lsn
        left = self.region - lsn % self.region
        pad = left if left < need else 0
        if lsn + pad + need - self._durable_lsn > self.region:
            return False
        try:
            if pad:
                self._write(_REC.pack(_PAD_MAGIC, 0, lsn, txnid, _crc(lsn, txnid, b"")), lsn)
                lsn += pad
            header = _REC.pack(_REC_MAGIC, size, lsn, txnid, _crc(lsn, txnid, payload))
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
        try:
            os.fdatasync(self._fd)
            self.flushes += 1
        except OSError as exc:
            # After a failed fdatasync the kernel may have dropped the pages it could not
            # write: nothing since the last good one can be trusted until a reopen recovers.
            self.failed = exc
            raise StorageError(f"the journal could not sync: {exc}") from exc
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
            self.failed = exc
            raise StorageError(f"the journal could not write an earlier record: {exc}") from exc

    def abandon(self) -> None:
        """Take back the started record: the group it holds did not happen."""
        if self._started:
            self._started = 0
            try:
                self._written()
            except OSError as exc:
                self.failed = exc
                return
        self.retract()

    def _write_error(self, exc: OSError) -> StorageError:
        if exc.errno == errno.ENOSPC:
            # Growing a journal that a full disk kept short: nothing was made durable, and
            # the next record is written at the same place.
            return StorageFull(f"disk is full: the journal cannot grow ({exc})")
        self.failed = exc
        return StorageError(f"the journal could not write: {exc}")

    def retract(self) -> None:
        """Undo the record just appended: its LMDB commit failed, so the group did not happen
        and must not be replayed."""
        lsn = self._last
        if lsn is None:
            return
        try:
            self._write(bytes(_REC.size), lsn)
            os.fdatasync(self._fd)
        except OSError as exc:
            self.failed = exc
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
        end = pos + _blocks(n)
        if end > self._size:  # a journal that a full disk kept short: grow it here
            _write_zeros(self._fd, self._size, end - self._size)
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
            done = self._writer.wait()
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
                os.pwrite(self._fd, _pack_header(header), (header["seq"] & 1) * _SLOT)
                os.fdatasync(self._fd)
                self._seq = header["seq"]
                self.header = header
                self._durable_lsn = lsn
                old, self._pin = self._pin, pin
                self.checkpoints += 1
        except OSError as exc:
            pin.abort()
            self.failed = exc
            raise StorageError(f"checkpoint failed: {exc}") from exc
        if old is not None:
            old.abort()

    def checkpoint(self) -> None:
        """prepare + complete, now (the caller holds the commit lock)."""
        self.complete(self.prepare())

    def _read_meta(self, txnid: int) -> bytes | None:
        for slot in (txnid & 1, 1 - (txnid & 1)):
            page = os.pread(self._data_fd, META_BYTES, slot * self._psize)
            magic = struct.unpack_from("<I", page, _META_MAGIC_AT)[0]
            if magic == _META_MAGIC and struct.unpack_from("<Q", page, _META_TXNID_AT)[0] == txnid:
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


class Checkpointer:
    """A thread that checkpoints once the journal's records since the last checkpoint pass a
    quarter of it (or `every_s` seconds have passed with some), so that a record always finds
    room and recovery has little to replay."""

    def __init__(self, journal: Journal, commit_lock: threading.Lock, every_s: float = 30.0):
        self._journal = journal
        self._lock = commit_lock
        self._every = every_s
        self._wake = threading.Event()
        self._stopped = False
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="pulsartxn-checkpoint", daemon=True)
        self._thread.start()

    def after_group(self) -> None:
        """Group commit lock held, between groups."""
        journal = self._journal
        if journal.used >= journal.region // 4:
            self._wake.set()

    def _run(self) -> None:
        journal = self._journal
        while not self._stopped:
            self._wake.wait(min(self._every, 1.0))
            self._wake.clear()
            if self._stopped or journal.failed is not None:
                continue
            due = journal.used >= journal.region // 4 or (
                journal.used and time.monotonic() - self._last >= self._every
            )
            if not due:
                continue
            try:
                with self._lock:
                    prepared = journal.prepare()
                journal.complete(prepared)  # the fdatasyncs, with the commit lock free
            except StorageError:
                continue  # journal.failed is set: later commits fail fast
            self._last = time.monotonic()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join()


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) & ~(BLOCK - 1)


def _open_direct(path: str) -> int | None:
    """A descriptor of the journal for direct writes, or None where the file system has none
    (tmpfs before Linux 6.6)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:
        return None


def _crc(lsn: int, txnid: int, payload) -> int:
    return crc32c(payload, crc32c(struct.pack("<QQ", lsn, txnid)))


def _pack_header(header: dict) -> bytes:
    meta = header["meta"]
    body = _HEADER.pack(
        _MAGIC,
        header["seq"],
        header["region"],
        header["txnid"],
        header["replay_lsn"],
        header["psize"],
        len(meta),
    ) + bytes(meta)
    return body + struct.pack("<I", crc32c(body))


def _read_header(fd: int) -> dict | None:
    """The valid header with the highest sequence; None if neither slot was ever written.
    A slot that holds something but fails its checks does not count; if both do, the journal
    is damaged and the store cannot be recovered from it."""
    best = None
    written = False
    for slot in (0, 1):
        raw = os.pread(fd, _SLOT, slot * _SLOT)
        if len(raw) < _HEADER.size or not raw.strip(b"\0"):
            continue
        written = True
        magic, seq, region, txnid, lsn, psize, meta_len = _HEADER.unpack_from(raw)
        end = _HEADER.size + meta_len
        if magic != _MAGIC or meta_len != META_BYTES or end + 4 > len(raw):
            continue
        if struct.unpack_from("<I", raw, end)[0] != crc32c(raw[:end]):
            continue
        if best is None or seq > best["seq"]:
            best = {
                "seq": seq,
                "region": region,
                "txnid": txnid,
                "replay_lsn": lsn,
                "psize": psize,
                "meta": raw[_HEADER.size : end],
            }
    if best is None and written:
        raise CorruptEntry("both journal header slots are damaged: cannot recover the store")
    return best


def _write_zeros(fd: int, offset: int, length: int) -> None:
    zeros = bytes(min(length, _ZERO_CHUNK))
    end = offset + length
    while offset < end:
        n = os.pwrite(fd, zeros[: end - offset], offset)
        offset += n


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
