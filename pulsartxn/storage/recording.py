"""The changes a group's LMDB write transaction makes, recorded as it makes them, for the
journal (journal.py): ``RecordingTxn`` and ``RecordingCursor`` stand in for py-lmdb's
transaction and cursor in every op of a group and note each put and delete that lands; the
journal record is those changes in order, and ``apply_record`` makes them again at recovery.

A record is blind writes of whole keys (the value a put left, a key a delete removed), so
applying it in order on any state at or before the one it was taken on gives the state after
it. Writes the recorder cannot replay faithfully (dropping a database, a put that must not
overwrite) raise instead of being left out.

Record layout: a sequence of ops, each ``<kind u8, database u16, key length u32, value length
u32>`` then the key and the value. NAME ops give a database's name the first time the record
names it (index 0xFFFF is LMDB's main database, never named).
"""

from __future__ import annotations

import struct

PUT, DELETE, NAME = 1, 2, 3
MAIN_DB = 0xFFFF
_OP = struct.Struct("<BHII")


class Unrecordable(Exception):
    """A write the journal cannot replay exactly."""


class Recorder:
    """The ops of one record. `names` maps ``id(db handle)`` to the database's name, for every
    handle the store has opened (Storage.open_db registers them)."""

    __slots__ = ("parts", "_names", "_index", "size")

    def __init__(self, names: dict) -> None:
        self.parts: list = []
        self._names = names
        self._index: dict = {}
        self.size = 0  # bytes of the record so far

    def _db(self, db) -> int:
        if db is None:
            return MAIN_DB
        index = self._index.get(id(db))
        if index is None:
            name = self._names.get(id(db))
            if name is None:
                raise Unrecordable(f"write into a database the store did not open: {db!r}")
            index = len(self._index)
            self._index[id(db)] = index
            self.parts += (_OP.pack(NAME, index, len(name), 0), name)
            self.size += _OP.size + len(name)
        return index

    def put(self, db, key, value) -> None:
        # Copies: a caller may pass views of a buffer it reuses once the put returns.
        key = key if type(key) is bytes else bytes(key)
        value = value if type(value) is bytes else bytes(value)
        self.parts += (_OP.pack(PUT, self._db(db), len(key), len(value)), key, value)
        self.size += _OP.size + len(key) + len(value)

    def put_rows(self, db, rows) -> None:
        index = self._db(db)
        pack = _OP.pack
        parts = self.parts
        size = 0
        for key, value in rows:
            key = key if type(key) is bytes else bytes(key)
            value = value if type(value) is bytes else bytes(value)
            parts += (pack(PUT, index, len(key), len(value)), key, value)
            size += len(key) + len(value)
        self.size += size + _OP.size * len(rows)

    def delete(self, db, key) -> None:
        key = key if type(key) is bytes else bytes(key)
        self.parts += (_OP.pack(DELETE, self._db(db), len(key), 0), key)
        self.size += _OP.size + len(key)


def _no_overwrite(kwargs) -> bool:
    return kwargs.get("overwrite", True) is False


class RecordingCursor:
    """A py-lmdb cursor whose writes are recorded; reads pass through."""

    __slots__ = ("_cursor", "_rec", "_db")

    def __init__(self, cursor, rec: Recorder, db) -> None:
        self._cursor = cursor
        self._rec = rec
        self._db = db

    def __getattr__(self, name):
        if name in ("drop",):
            raise Unrecordable(f"cursor.{name} is not journaled")
        return getattr(self._cursor, name)

    def __iter__(self):
        return iter(self._cursor)

    def put(self, key, value, **kwargs) -> bool:
        if _no_overwrite(kwargs):
            raise Unrecordable("put(overwrite=False) is not journaled")
        done = self._cursor.put(key, value, **kwargs)
        if done:
            self._rec.put(self._db, key, value)
        return done

    def putmulti(self, items, **kwargs):
        if _no_overwrite(kwargs):
            raise Unrecordable("putmulti(overwrite=False) is not journaled")
        items = items if isinstance(items, list) else list(items)
        consumed, added = self._cursor.putmulti(items, **kwargs)
        if added != len(items):
            # An append that met a key out of order stopped part way: which rows landed is
            # not known here. The caller fails the group (EntryLog checks the count).
            raise Unrecordable(f"putmulti wrote {added} of {len(items)} rows")
        self._rec.put_rows(self._db, items)
        return consumed, added

    def replace(self, key, value):
        old = self._cursor.replace(key, value)
        self._rec.put(self._db, key, value)
        return old

    def pop(self, key):
        old = self._cursor.pop(key)
        if old is not None:
            self._rec.delete(self._db, key)
        return old

    def delete(self, dupdata: bool = False) -> bool:
        key = self._cursor.key()
        key = bytes(key)
        done = self._cursor.delete(dupdata)
        if done:
            self._rec.delete(self._db, key)
        return done


class RecordingTxn:
    """A py-lmdb write transaction whose writes are recorded; reads pass through."""

    __slots__ = ("_txn", "_rec")

    def __init__(self, txn, rec: Recorder) -> None:
        self._txn = txn
        self._rec = rec

    def get(self, key, default=None, db=None):
        return self._txn.get(key, default, db)

    def stat(self, db):
        return self._txn.stat(db)

    def id(self) -> int:
        return self._txn.id()

    def cursor(self, db=None) -> RecordingCursor:
        return RecordingCursor(self._txn.cursor(db=db), self._rec, db)

    def put(self, key, value, db=None, **kwargs) -> bool:
        if _no_overwrite(kwargs):
            raise Unrecordable("put(overwrite=False) is not journaled")
        done = self._txn.put(key, value, db=db, **kwargs)
        if done:
            self._rec.put(db, key, value)
        return done

    def replace(self, key, value, db=None):
        old = self._txn.replace(key, value, db=db)
        self._rec.put(db, key, value)
        return old

    def pop(self, key, db=None):
        old = self._txn.pop(key, db=db)
        if old is not None:
            self._rec.delete(db, key)
        return old

    def delete(self, key, value=b"", db=None) -> bool:
        if value:
            raise Unrecordable("delete of one duplicate is not journaled")
        done = self._txn.delete(key, db=db)
        if done:
            self._rec.delete(db, key)
        return done

    def drop(self, db, delete: bool = True):
        raise Unrecordable("drop is not journaled")


def apply_record(env, txn, payload, handles: dict) -> int:
    """Make the writes of one record again in the write transaction `txn`; `handles` caches
    database handles by name across records. Returns the number of writes."""
    view = memoryview(payload)
    unpack = _OP.unpack_from
    size = _OP.size
    names: dict[int, object] = {MAIN_DB: None}
    pos = 0
    end = len(view)
    writes = 0
    while pos < end:
        kind, index, klen, vlen = unpack(view, pos)
        pos += size
        key = view[pos : pos + klen]
        pos += klen
        if kind == NAME:
            name = bytes(key)
            handle = handles.get(name)
            if handle is None:
                handle = handles[name] = env.open_db(name, txn=txn, create=True)
            names[index] = handle
            continue
        db = names[index]
        if kind == PUT:
            txn.put(key, view[pos : pos + vlen], db=db)
            pos += vlen
        elif kind == DELETE:
            txn.delete(key, db=db)
        else:
            raise ValueError(f"journal record op {kind} at byte {pos - size - klen}")
        writes += 1
    if pos != end:
        raise ValueError(f"journal record overruns its length ({pos} > {end})")
    return writes
