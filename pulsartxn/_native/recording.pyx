# cython: language_level=3, boundscheck=False, wraparound=False
"""The changes a group's LMDB write transaction makes, recorded as it makes them, for the
synced store's journal (``pulsartxn/storage/journal.py``; docs/internals.md).

``RecordingTxn`` and ``RecordingCursor`` stand in for py-lmdb's transaction and cursor in
every op of a group: reads pass through, and each put and delete that lands is appended to the
group's ``Recorder`` (a copy: callers pass views of buffers they reuse). The record is blind
writes of whole keys in order, so applying it on any state at or before the one it was taken
on gives the state after it (``pulsartxn.storage.recording.apply_record``). Writes that cannot
be replayed faithfully (a put that must not overwrite, a partial putmulti, dropping a
database) raise ``Unrecordable``. The twin is ``reference/recording.py``.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint16_t, uint32_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

from ..errors import Unrecordable

# Record layout: ops of <kind u8, database u16, key length u32, value length u32> (little
# endian) then the key and the value. A NAME op gives a database's name the first time the
# record writes into it; 0xFFFF is LMDB's main database.
cdef enum:
    _PUT = 1
    _DELETE = 2
    _NAME = 3
    _MAIN_DB = 0xFFFF
    _OP_SIZE = 11

PUT = _PUT
DELETE = _DELETE
NAME = _NAME
MAIN_DB = _MAIN_DB
OP_SIZE = _OP_SIZE


cdef inline void _put_u32(char *p, uint32_t v) noexcept nogil:
    p[0] = <char>(v & 0xFF)
    p[1] = <char>((v >> 8) & 0xFF)
    p[2] = <char>((v >> 16) & 0xFF)
    p[3] = <char>((v >> 24) & 0xFF)


cdef class Recorder:
    """The ops of one record. `names` maps ``id(db handle)`` to the database's name for every
    handle the store opened."""

    cdef char *_buf
    cdef Py_ssize_t _used
    cdef Py_ssize_t _cap
    cdef dict _names
    cdef dict _index

    def __cinit__(self, dict names):
        self._buf = NULL
        self._used = 0
        self._cap = 0
        self._names = names
        self._index = {}

    def __dealloc__(self):
        free(self._buf)

    @property
    def size(self):
        """Bytes of the record so far."""
        return self._used

    def payload(self):
        """The record, as bytes."""
        return PyBytes_FromStringAndSize(self._buf, self._used)

    cdef int _reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t cap
        cdef char *grown
        if self._used + n <= self._cap:
            return 0
        cap = max(self._cap * 2, self._used + n, 4096)
        grown = <char *>realloc(self._buf, cap)
        if grown == NULL:
            raise MemoryError()
        self._buf = grown
        self._cap = cap
        return 0

    cdef int _op(self, uint8_t kind, uint16_t db, const char *key, Py_ssize_t klen,
                 const char *value, Py_ssize_t vlen) except -1:
        if klen > 0xFFFFFFFF or vlen > 0xFFFFFFFF:
            raise Unrecordable(f"a key or value of {max(klen, vlen)} bytes")
        self._reserve(_OP_SIZE + klen + vlen)
        cdef char *p = self._buf + self._used
        p[0] = <char>kind
        p[1] = <char>(db & 0xFF)
        p[2] = <char>(db >> 8)
        _put_u32(p + 3, <uint32_t>klen)
        _put_u32(p + 7, <uint32_t>vlen)
        if klen:
            memcpy(p + _OP_SIZE, key, klen)
        if vlen:
            memcpy(p + _OP_SIZE + klen, value, vlen)
        self._used += _OP_SIZE + klen + vlen
        return 0

    cdef int _db(self, object db) except -1:
        if db is None:
            return _MAIN_DB
        cdef object key = id(db)
        cdef object index = self._index.get(key)
        if index is not None:
            return <int>index
        name = self._names.get(key)
        if name is None:
            raise Unrecordable(f"write into a database the store did not open: {db!r}")
        cdef int i = len(self._index)
        self._index[key] = i
        cdef const char *n = name
        self._op(_NAME, <uint16_t>i, n, len(name), NULL, 0)
        return i

    cdef int _record(self, uint8_t kind, object db, object key, object value) except -1:
        cdef int index = self._db(db)
        cdef Py_buffer kb, vb
        PyObject_GetBuffer(key, &kb, PyBUF_SIMPLE)
        try:
            if value is None:
                self._op(kind, <uint16_t>index, <const char *>kb.buf, kb.len, NULL, 0)
            else:
                PyObject_GetBuffer(value, &vb, PyBUF_SIMPLE)
                try:
                    self._op(kind, <uint16_t>index, <const char *>kb.buf, kb.len,
                             <const char *>vb.buf, vb.len)
                finally:
                    PyBuffer_Release(&vb)
        finally:
            PyBuffer_Release(&kb)
        return 0

    def put(self, db, key, value):
        self._record(_PUT, db, key, value)

    def put_rows(self, db, list rows):
        cdef tuple row
        for row in rows:
            self._record(_PUT, db, row[0], row[1])

    def delete(self, db, key):
        self._record(_DELETE, db, key, None)


cdef class RecordingCursor:
    """A py-lmdb cursor whose writes are recorded; reads pass through."""

    cdef object _cursor
    cdef Recorder _rec
    cdef object _db

    def __cinit__(self, cursor, Recorder rec, db):
        self._cursor = cursor
        self._rec = rec
        self._db = db

    def __getattr__(self, name):
        if name == "drop":
            raise Unrecordable("cursor.drop is not journaled")
        return getattr(self._cursor, name)

    # The reads the ops make, passed through without __getattr__ (which runs only after a
    # failed lookup has raised and caught an AttributeError).

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

    def put(self, key, value, dupdata=False, overwrite=True, append=False):
        if overwrite is False:
            raise Unrecordable("put(overwrite=False) is not journaled")
        done = self._cursor.put(key, value, dupdata, overwrite, append)
        if done:
            self._rec._record(_PUT, self._db, key, value)
        return done

    def putmulti(self, items, dupdata=False, overwrite=True, append=False):
        if overwrite is False:
            raise Unrecordable("putmulti(overwrite=False) is not journaled")
        cdef list rows = items if type(items) is list else list(items)
        consumed, added = self._cursor.putmulti(rows, dupdata, overwrite, append)
        if added != len(rows):
            # An append that met a key out of order stopped part way: which rows landed is
            # not known here. The caller fails the group (EntryLog checks the count).
            raise Unrecordable(f"putmulti wrote {added} of {len(rows)} rows")
        cdef tuple row
        for row in rows:
            self._rec._record(_PUT, self._db, row[0], row[1])
        return consumed, added

    def replace(self, key, value):
        old = self._cursor.replace(key, value)
        self._rec._record(_PUT, self._db, key, value)
        return old

    def pop(self, key):
        old = self._cursor.pop(key)
        if old is not None:
            self._rec._record(_DELETE, self._db, key, None)
        return old

    def delete(self, dupdata=False):
        key = bytes(self._cursor.key())
        done = self._cursor.delete(dupdata)
        if done:
            self._rec._record(_DELETE, self._db, key, None)
        return done


cdef class RecordingTxn:
    """A py-lmdb write transaction whose writes are recorded; reads pass through."""

    cdef object _txn
    cdef Recorder _rec

    def __cinit__(self, txn, Recorder rec):
        self._txn = txn
        self._rec = rec

    def get(self, key, default=None, db=None):
        return self._txn.get(key, default, db)

    def stat(self, db):
        return self._txn.stat(db)

    def id(self):
        return self._txn.id()

    def cursor(self, db=None):
        return RecordingCursor(self._txn.cursor(db=db), self._rec, db)

    def put(self, key, value, db=None, *, dupdata=False, overwrite=True, append=False):
        if overwrite is False:
            raise Unrecordable("put(overwrite=False) is not journaled")
        done = self._txn.put(key, value, dupdata, overwrite, append, db)
        if done:
            self._rec._record(_PUT, db, key, value)
        return done

    def replace(self, key, value, db=None):
        old = self._txn.replace(key, value, db=db)
        self._rec._record(_PUT, db, key, value)
        return old

    def pop(self, key, db=None):
        old = self._txn.pop(key, db=db)
        if old is not None:
            self._rec._record(_DELETE, db, key, None)
        return old

    def delete(self, key, value=b"", db=None):
        if value:
            raise Unrecordable("delete of one duplicate is not journaled")
        done = self._txn.delete(key, db=db)
        if done:
            self._rec._record(_DELETE, db, key, None)
        return done

    def drop(self, db, delete=True):
        raise Unrecordable("drop is not journaled")
