"""The broker's LMDB environment: one per data directory, locked against a second broker.

Named databases (docs/internals.md, "The broker underneath"): ``ledger/<partition>`` holds a
partition's entries (u64 big-endian entry id -> encoded entry); small per-key state lives in
shared databases keyed by name: ``meta``, ``topics``, ``cursors``, ``dedup`` and the
transaction databases. Every write goes through :class:`GroupCommit`; reads open their own
read transactions from any thread.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import Any

import lmdb

from ..errors import (
    AlreadyClosed,
    DataDirectoryLocked,
    InvalidConfiguration,
    StorageError,
)
from .checkpoint import Checkpointer
from .group_commit import GroupCommit
from .headroom import Headroom
from .journal import Journal
from .journal_format import FILE as JOURNAL
from .journal_format import fsync_dir
from .ops import WriteOp, storage_error

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
        journal: bool = True,
        journal_bytes: int = 16 << 20,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        _check_directory(self.data_dir)
        self._lock_fd = _lock_directory(self.data_dir)
        data_path = os.path.join(self.data_dir, "data.mdb")
        # A synced store makes its groups durable in a journal (journal.py) and lets LMDB
        # write without syncing; without room for a journal, LMDB syncs every commit itself.
        self.journal: Journal | None = None
        try:
            if not (sync and journal) and os.path.exists(os.path.join(self.data_dir, JOURNAL)):
                _retire_journal(self.data_dir, data_path, map_size, max_dbs)
            if sync and journal:
                self.journal = Journal.open(self.data_dir, journal_bytes)
            if self.journal is not None and self.journal.header is not None:
                if not os.path.exists(data_path):
                    raise InvalidConfiguration(
                        f"{self.data_dir} has a journal but no data.mdb: not a whole store"
                    )
                self.journal.restore_meta(data_path)
        except BaseException:
            if self.journal is not None:
                self.journal.close()
            os.close(self._lock_fd)
            raise
        lmdb_sync = sync and self.journal is None
        try:
            self.env = lmdb.open(
                self.data_dir,
                map_size=map_size,
                max_dbs=max_dbs,
                sync=lmdb_sync,
                metasync=lmdb_sync,
                writemap=False,
                max_readers=1024,
                lock=True,
                readahead=False,
            )
        except lmdb.Error as exc:
            if self.journal is not None:
                self.journal.close()
            os.close(self._lock_fd)
            raise InvalidConfiguration(
                f"cannot open the LMDB environment in {self.data_dir}: {exc}"
            ) from exc
        self.sync = sync
        self._max_dbs = max_dbs
        self._dbs: dict[bytes, Any] = {}
        self._names: dict[int, bytes] = {}  # id(handle) -> name, for the journal's records
        self._db_lock = threading.Lock()
        self._closed = False
        try:
            self._check_format()
            self.meta = self.open_db(b"meta")
            if self.journal is not None:
                self.journal.attach(self.env, data_path)
                self.journal.replay(self.env)
                self.journal.checkpoint()  # the format, the replayed records: durable
        except BaseException:
            # Nothing of a refused directory stays open: neither LMDB nor the lock.
            if self.journal is not None:
                self.journal.close()
            self.env.close()
            os.close(self._lock_fd)
            raise
        # Synced commits that append overwrite zeros written ahead instead of growing the
        # file (see headroom.py); without fsync growing costs nothing worth saving, and with
        # a journal LMDB's commits do not sync.
        self.headroom = Headroom(self.env, self.data_dir, map_size) if lmdb_sync else None
        after_group = self.headroom.after_group if self.headroom is not None else None
        self.checkpointer = None
        self.commits = GroupCommit(
            self.env,
            max_records=group_max_records,
            max_bytes=group_max_bytes,
            linger_ms=group_linger_ms,
            sync=sync,
            after_group=after_group,
            journal=self.journal,
            names=self._names,
        )
        if self.journal is not None:
            self.checkpointer = Checkpointer(self.journal, self.commits.commit_lock)
            self.commits.set_after_group(self.checkpointer.after_group)

    def _check_format(self) -> None:
        """Stamp a new store with FORMAT; refuse an LMDB environment that another program (or
        another format) wrote, before writing anything into it."""
        try:
            with self.env.begin(write=True) as lmdb_txn:
                names = {bytes(k) for k, _ in lmdb_txn.cursor()}
                meta = None
                if not names or b"meta" in names:
                    meta = self.env.open_db(b"meta", txn=lmdb_txn, create=True)
                found = lmdb_txn.get(FORMAT_KEY, db=meta) if meta is not None else None
                if found is None:
                    # New: an empty environment, or one that a crash stopped right after it
                    # created the meta database (that database is then empty).
                    if meta is None or names - {b"meta"} or lmdb_txn.stat(meta)["entries"]:
                        raise InvalidConfiguration(
                            f"{self.data_dir} holds an LMDB environment that is not a pulsartxn "
                            "store (no format marker): refusing to write into it"
                        )
                    lmdb_txn.put(FORMAT_KEY, FORMAT, db=meta)
                elif bytes(found) != FORMAT:
                    raise InvalidConfiguration(
                        f"{self.data_dir} holds data of format {bytes(found)!r}, not {FORMAT!r}"
                    )
        except lmdb.IncompatibleError as exc:
            # "meta" is a key of the foreign environment's main database, not a database.
            raise InvalidConfiguration(
                f"{self.data_dir} holds an LMDB environment that is not a pulsartxn store: {exc}"
            ) from None
        except lmdb.MapFullError as exc:
            raise storage_error(exc, self.data_dir) from None

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
                    with self.env.begin(write=True) as lmdb_txn:
                        db = self.env.open_db(name, txn=lmdb_txn, create=True)
                    self._names[id(db)] = name
                except lmdb.DbsFullError:
                    raise InvalidConfiguration(  # no data dir: this may cross the wire
                        f"the store has room for {self._max_dbs} named databases (one per "
                        "partition and coordinator, a few shared): open it with a larger max_dbs"
                    ) from None
                except lmdb.MapFullError as exc:
                    raise storage_error(exc, self.data_dir) from None
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
        if self.headroom is not None:
            with self.commits.commit_lock:  # a caller may still be leading a last group
                self.headroom.close()
        if self.journal is not None:
            self.checkpointer.stop()
            try:
                if self.journal.failed is None:
                    with self.commits.commit_lock:
                        self.journal.checkpoint()  # a reopen then replays nothing
            except StorageError:
                pass  # the journal still holds every acknowledged write: a reopen replays it
            finally:
                self.journal.close()
        elif self.sync:
            self.env.sync(True)
        self.env.close()
        os.close(self._lock_fd)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict:
        """Group commit and journal figures: counters and histograms read as they stand (no
        lock, nothing written). A synced store without its journal syncs LMDB per commit."""
        commits, journal = self.commits, self.journal
        out = {
            "sync": self.sync,
            "journal": journal is not None,
            "groups": commits.groups,
            "records": commits.records,
            "failed_groups": commits.failures.failures,
            "group_records": commits.group_records.snapshot(),
            "commit_seconds": commits.commit_seconds.snapshot(),
            "halted": False,
            "error": None,
        }
        if journal is not None:
            failed = journal.failed
            out.update(
                journal_records=journal.records,
                journal_flushes=journal.flushes,
                journal_write_seconds=journal.write_seconds.snapshot(),
                journal_fsync_seconds=journal.fsync_seconds.snapshot(),
                journal_region_bytes=journal.region,
                checkpoint_lag_bytes=journal.used,
                checkpoint_age_s=round(time.monotonic() - journal.checkpointed_at, 3),
                checkpoints=journal.checkpoints,
                replayed_records=journal.replayed,
                halted=failed is not None,
                error=None if failed is None else str(failed),
            )
        return out


# Files of a store; anything else (dot files and lost+found aside) in a directory without a
# store makes it someone else's directory.
_STORE_FILES = frozenset({"data.mdb", "lock.mdb", JOURNAL, LOCK_FILE})


def _check_directory(path: str) -> None:
    """Create the data directory if missing; refuse a file, an unwritable directory, or a
    directory that holds other things and no store."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidConfiguration(f"data directory {path} is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise InvalidConfiguration(f"cannot create data directory {path}: {exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidConfiguration(f"data directory {path} is not writable")
    for name in ("data.mdb", "lock.mdb"):
        file = os.path.join(path, name)
        if os.path.exists(file) and not os.access(file, os.R_OK | os.W_OK):
            raise InvalidConfiguration(f"{file} is not writable")
    if os.path.exists(os.path.join(path, "data.mdb")):
        return
    foreign = sorted(
        n
        for n in os.listdir(path)
        if n not in _STORE_FILES and not n.startswith(".") and n != "lost+found"
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise InvalidConfiguration(
            f"data directory {path} holds no pulsartxn store but other files ({shown}): "
            "give an empty or a new directory"
        )


def _retire_journal(data_dir: str, data_path: str, map_size: int, max_dbs: int) -> None:
    """A store opened without a journal (sync=False, or journal=False) that was last opened
    with one: what the journal holds beyond its last checkpoint goes into LMDB first, LMDB is
    made durable, and only then is the journal removed."""
    journal = Journal.open(data_dir, 0)
    try:
        if journal.header is not None and os.path.exists(data_path):
            journal.restore_meta(data_path)
            env = lmdb.open(data_dir, map_size=map_size, max_dbs=max_dbs, sync=False)
            try:
                journal.replay(env)
                env.sync(True)
            finally:
                env.close()
    finally:
        journal.close()
    os.unlink(os.path.join(data_dir, JOURNAL))
    fsync_dir(data_dir)


def _lock_directory(path: str) -> int:
    """Take an exclusive flock on <data_dir>/broker.lock, or fail at once."""
    lock_path = os.path.join(path, LOCK_FILE)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InvalidConfiguration(f"cannot open {lock_path}: {exc}") from None
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
