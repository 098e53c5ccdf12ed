"""Pure-Python twin of pulsartxn._native.entrylog: a partition's ledger in LMDB. The codec's twins
are reference/entrycodec.py and reference/entrydecode.py."""

from __future__ import annotations

import struct

from ..checks import entry_range
from ..entryformat import DEFAULT_MAX_ENTRY_BYTES, DecodedEntries
from .entrycodec import encode_entries
from .entrydecode import decode_entries, decode_header

__all__ = ["EntryLog"]

_BE64 = struct.Struct(">Q")


def _first_id(first) -> int:
    if not isinstance(first, int) or isinstance(first, bool) or not 0 <= first < 1 << 63:
        raise ValueError(f"first must be an entry id (0 <= id < 2**63), not {first!r}")
    return first


class EntryLog:
    """One partition's ledger in a named LMDB database (see the native module)."""

    def __init__(self, env, name, db=None):
        """The log in the named database `name` of `env` (or the handle `db` of it, opened by
        the caller). A database is opened inside a write transaction begun here: py-lmdb's
        open_db without one takes LMDB's writer lock while holding the GIL, and deadlocks
        with a thread that holds the writer lock and waits for the GIL."""
        if not isinstance(name, bytes) or not name:
            raise TypeError(f"EntryLog name must be non-empty bytes, not {name!r}")
        self.env = env
        self.name = name
        if db is None:
            with env.begin(write=True) as txn:
                db = env.open_db(name, txn=txn, create=True)
        self.db = db

    def last_entry_id(self, txn) -> int:
        cursor = txn.cursor(db=self.db)
        return _BE64.unpack(cursor.key())[0] if cursor.last() else -1

    def first_entry_id(self, txn) -> int:
        cursor = txn.cursor(db=self.db)
        return _BE64.unpack(cursor.key())[0] if cursor.first() else -1

    def count(self, txn) -> int:
        return txn.stat(self.db)["entries"]

    def append(self, txn, entries, first=None) -> int:
        if not isinstance(entries, (list, tuple)):
            raise TypeError(f"entries must be a list of bytes, not {type(entries).__name__}")
        for i, entry in enumerate(entries):
            if not isinstance(entry, bytes):
                raise TypeError(f"entries[{i}] must be bytes, not {type(entry).__name__}")
        if first is None:
            start = self.last_entry_id(txn) + 1
        else:
            start = _first_id(first)
            key = _BE64.pack(start)
            if len(entries) == 1 and txn.put(key, entries[0], db=self.db, append=True):
                return start  # after the last entry (LMDB refuses an append below it)
        if not entries:
            return start
        last = self.last_entry_id(txn)
        keys = [_BE64.pack(start + i) for i in range(len(entries))]
        if start <= last:  # filling claimed ids below the last entry
            for i, key in enumerate(keys):
                if txn.get(key, db=self.db) is not None:
                    raise ValueError(f"{self.name!r}: entry {start + i} exists already")
            for key, entry in zip(keys, entries):
                txn.put(key, entry, db=self.db)
            return start
        _, added = txn.cursor(db=self.db).putmulti(list(zip(keys, entries)), append=True)
        if added != len(entries):
            raise RuntimeError(f"{self.name!r}: appended {added} of {len(entries)} entries")
        return start

    def append_messages(
        self,
        txn,
        values,
        keys=None,
        properties=None,
        *,
        batch_size=1000,
        max_entry_bytes=DEFAULT_MAX_ENTRY_BYTES,
        txn_msb=0,
        txn_lsb=0,
        producer_id=0,
        first_sequence_id=0,
        publish_time=0,
        metadata=None,
        first_entry_id=None,
    ):
        entries = encode_entries(
            values,
            keys,
            properties,
            batch_size=batch_size,
            max_entry_bytes=max_entry_bytes,
            txn_msb=txn_msb,
            txn_lsb=txn_lsb,
            producer_id=producer_id,
            first_sequence_id=first_sequence_id,
            publish_time=publish_time,
            metadata=metadata,
        )
        counts = [decode_header(e, verify=False).message_count for e in entries]
        last = self.last_entry_id(txn)
        first = last + 1 if first_entry_id is None else _first_id(first_entry_id)
        if first <= last:
            raise ValueError(f"{self.name!r}: entry {first} is not after the last ({last})")
        return self.append(txn, entries, first), counts

    def scan(self, txn, start=0, end=None, limit=None):
        lo, hi, cap = entry_range(start, end, limit)
        ids, bufs = [], []
        if cap == 0 or (hi is not None and lo >= hi):
            return ids, bufs
        cursor = txn.cursor(db=self.db)
        if not cursor.set_range(_BE64.pack(lo)):
            return ids, bufs
        for key, value in cursor.iternext():
            entry_id = _BE64.unpack(key)[0]
            if hi is not None and entry_id >= hi:
                break
            ids.append(entry_id)
            bufs.append(value)
            if cap is not None and len(ids) >= cap:
                break
        return ids, bufs

    def read(self, txn, start=0, end=None, limit=None, verify=True) -> DecodedEntries:
        ids, bufs = self.scan(txn, start, end, limit)
        return decode_entries(ids, bufs, verify)

    def trim_below(self, txn, entry_id) -> int:
        bound, _, _ = entry_range(entry_id, None, None)
        last = self.last_entry_id(txn)
        if last < 0:
            return 0
        bound = min(bound, last)
        cursor = txn.cursor(db=self.db)
        removed = 0
        if not cursor.first():
            return 0
        while _BE64.unpack(cursor.key())[0] < bound:
            if not cursor.delete():
                break
            removed += 1
        return removed
