"""The broker's LMDB environment: one per data directory, locked against a second broker.

Named databases (DESIGN.md, "Storage"): ``ledger/<partition>`` holds a partition's entries
(u64 big-endian entry id -> encoded entry); small per-key state lives in shared databases keyed
by name: ``meta``, ``topics``, ``cursors``, ``dedup`` and the transaction databases. Every
write goes through :class:`GroupCommit`; reads open their own read transactions from any thread.
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import Any

import lmdb

from ..errors import (
    AlreadyClosed,
    DataDirectoryLocked,
    InvalidConfiguration,
    PulsarTxnError,
    StorageFull,
)
from .group_commit import GroupCommit, WriteOp

LOCK_FILE = "broker.lock"
FORMAT_KEY = b"format"
FORMAT = b"pulsartxn/1"


class Storage:
    def __init__(
        self,
        data_dir: str,
        *,
        sync: bool = True,
        map_size: int = 1 << 40,
        max_dbs: int = 16_384,
        group_max_records: int = 512,
        group_max_bytes: int = 4 * 1024 * 1024,
        group_linger_ms: float = 0.0,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        try:
            os.makedirs(self.data_dir, exist_ok=True)
        except OSError as exc:
            raise PulsarTxnError(f"cannot create data directory {self.data_dir}: {exc}") from exc
        if not os.access(self.data_dir, os.W_OK):
            raise PulsarTxnError(f"data directory {self.data_dir} is not writable")
        self._lock_fd = _lock_directory(self.data_dir)
        try:
            self.env = lmdb.open(
                self.data_dir,
                map_size=map_size,
                max_dbs=max_dbs,
                sync=sync,
                metasync=sync,
                writemap=False,
                max_readers=1024,
                lock=True,
                readahead=False,
            )
        except lmdb.Error as exc:
            os.close(self._lock_fd)
            raise PulsarTxnError(f"cannot open LMDB environment in {self.data_dir}: {exc}") from exc
        self.sync = sync
        self._max_dbs = max_dbs
        self._dbs: dict[bytes, Any] = {}
        self._db_lock = threading.Lock()
        self._closed = False
        self.meta = self.open_db(b"meta")
        self._check_format()
        self.commits = GroupCommit(
            self.env,
            max_records=group_max_records,
            max_bytes=group_max_bytes,
            linger_ms=group_linger_ms,
            sync=sync,
        )

    def _check_format(self) -> None:
        with self.env.begin(write=True, db=self.meta) as txn:
            found = txn.get(FORMAT_KEY)
            if found is None:
                txn.put(FORMAT_KEY, FORMAT)
            elif found != FORMAT:
                raise PulsarTxnError(
                    f"{self.data_dir} holds data of format {found!r}, not {FORMAT!r}"
                )

    def open_db(self, name: bytes):
        """The handle of a named database, created on first use (thread-safe, cached)."""
        db = self._dbs.get(name)
        if db is not None:
            return db
        with self._db_lock:
            db = self._dbs.get(name)
            if db is None:
                # In a write transaction of our own: begin() waits for LMDB's writer lock
                # without the GIL, where open_db alone would hold the GIL while it waits and
                # deadlock with a group commit that holds the lock and wants the GIL.
                try:
                    with self.env.begin(write=True) as txn:
                        db = self.env.open_db(name, txn=txn, create=True)
                except lmdb.DbsFullError:
                    raise InvalidConfiguration(
                        f"{self.data_dir} has room for {self._max_dbs} named databases (one "
                        "per partition and a few shared): open it with a larger max_dbs"
                    ) from None
                except lmdb.MapFullError as exc:
                    raise StorageFull(f"LMDB map is full: {exc}") from None
                self._dbs[name] = db
            return db

    def read(self):
        """A read-only transaction (context manager)."""
        if self._closed:
            raise AlreadyClosed("the broker's storage is closed")
        return self.env.begin(buffers=True)

    def submit(self, op: WriteOp, lazy: bool = False, quiet: bool = False):
        return self.commits.submit(op, lazy, quiet)

    def write(self, apply, **kwargs):
        return self.commits.write(apply, **kwargs)

    def run(self, op: WriteOp):
        """Commit a prepared op (leading a group when none is being committed); its result."""
        return self.commits.run(op)

    def wait(self, fut):
        """The result of a submitted write, committing the queue in this thread if idle."""
        if not fut.done():
            self.commits.wait_for(fut)
        return fut.result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.commits.close()
        if self.sync:
            self.env.sync(True)
        self.env.close()
        os.close(self._lock_fd)

    @property
    def closed(self) -> bool:
        return self._closed


def _lock_directory(path: str) -> int:
    """Take an exclusive flock on <data_dir>/broker.lock, or fail at once."""
    lock_path = os.path.join(path, LOCK_FILE)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirectoryLocked(
            f"data directory {path} is in use by another broker ({lock_path} is locked)"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
