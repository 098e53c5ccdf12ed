"""Twin of ``_native/recording.pyx``: the changes a group's LMDB write transaction makes,
recorded as it makes them, for the synced store's journal. The module docstring of the native
module states the contract and the record layout."""

from __future__ import annotations

import struct

from ...errors import Unrecordable

PUT, DELETE, NAME = 1, 2, 3
MAIN_DB = 0xFFFF
_OP = struct.Struct("<BHII")
OP_SIZE = _OP.size


class Recorder:
    """The ops of one record (see the native module)."""

    __slots__ = ("_parts", "_names", "_index", "_size")

    def __init__(self, names: dict) -> None:
        self._parts: list = []
        self._names = names
        self._index: dict = {}
        self._size = 0

    @property
    def size(self) -> int:
        return self._size

    def payload(self) -> bytes:
        return b"".join(self._parts)

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
            self._parts += (_OP.pack(NAME, index, len(name), 0), name)
            self._size += OP_SIZE + len(name)
        return index

    def _record(self, kind: int, db, key, value) -> None:
        index = self._db(db)
        # Copies: a caller may pass views of a buffer it reuses once the write returns.
        key = bytes(key)
        value = b"" if value is None else bytes(value)
        self._parts += (_OP.pack(kind, index, len(key), len(value)), key, value)
        self._size += OP_SIZE + len(key) + len(value)

    def put(self, db, key, value) -> None:
        self._record(PUT, db, key, value)

    def put_rows(self, db, rows: list) -> None:
        for key, value in rows:
            self._record(PUT, db, key, value)

    def delete(self, db, key) -> None:
        self._record(DELETE, db, key, None)


class RecordingCursor:
    """A py-lmdb cursor whose writes are recorded; reads pass through."""

    __slots__ = ("_cursor", "_rec", "_db")

    def __init__(self, cursor, rec: Recorder, db) -> None:
        self._cursor = cursor
        self._rec = rec
        self._db = db

    def __getattr__(self, name):
        if name == "drop":
            raise Unrecordable("cursor.drop is not journaled")
        return getattr(self._cursor, name)

    # The reads the ops make, passed through without __getattr__ (as the native module).

    def first(self):
        return self._cursor.first()

    def last(self):
        return self._cursor.last()

    def next(self):
        return self._cursor.next()

    def prev(self):
        return self._cursor.prev()

    def key(self):
        return self._cursor.key()

    def value(self):
        return self._cursor.value()

    def item(self):
        return self._cursor.item()

    def set_key(self, key):
        return self._cursor.set_key(key)

    def set_range(self, key):
        return self._cursor.set_range(key)

    def __iter__(self):
        return iter(self._cursor)

    def put(self, key, value, dupdata=False, overwrite=True, append=False) -> bool:
        if overwrite is False:
            raise Unrecordable("put(overwrite=False) is not journaled")
        done = self._cursor.put(key, value, dupdata, overwrite, append)
        if done:
            self._rec.put(self._db, key, value)
        return done

    def putmulti(self, items, dupdata=False, overwrite=True, append=False):
        if overwrite is False:
            raise Unrecordable("putmulti(overwrite=False) is not journaled")
        rows = items if type(items) is list else list(items)
        consumed, added = self._cursor.putmulti(rows, dupdata, overwrite, append)
        if added != len(rows):
            raise Unrecordable(f"putmulti wrote {added} of {len(rows)} rows")
        self._rec.put_rows(self._db, rows)
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
        key = bytes(self._cursor.key())
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

    def put(self, key, value, db=None, *, dupdata=False, overwrite=True, append=False) -> bool:
        if overwrite is False:
            raise Unrecordable("put(overwrite=False) is not journaled")
        done = self._txn.put(key, value, dupdata, overwrite, append, db)
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
