# cython: language_level=3
"""The entry codec and the LMDB entry log of a partition (the format: entryformat.py).

Encoding first gathers where every message's bytes are (values from a list of bytes, holding a
reference to each, or straight from a pyarrow array's buffers), validating everything before
anything is written; then whole entries are written with memcpy and CRC-32C without the GIL,
by the calling thread and one helper thread claiming entries in turn. Decoding validates every
length against the bytes that are left (never reading out of bounds), sizes the columns in a
first pass and fills numpy arrays in a second, both without the GIL.
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_Check,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_Check
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy, memset

from .includes.crc32c cimport ptx_crc32c, ptx_crc32c_hardware, ptx_crc32c_software

import os
import struct
import threading
from collections.abc import Sequence

import lmdb
import numpy as np

from pulsartxn.errors import CorruptEntry

from .checks import as_entry_ids, as_int, check_bulk, entry_range
from .entryformat import (
    DEFAULT_MAX_ENTRY_BYTES,
    HEADER_SIZE,
    REASONS as _FORMAT_REASONS,
    DecodedEntries,
    EntryHeader,
    arrow_binary,
    check_header_ints,
    encode_properties,
)
from .types import MarkerType


cdef extern from "Python.h":
    void _raw_incref "Py_INCREF"(PyObject *o) noexcept
    void _raw_decref "Py_DECREF"(PyObject *o) noexcept
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL


cdef extern from *:
    """
    #if defined(_MSC_VER)
    #include <intrin.h>
    static __inline Py_ssize_t ptx_claim(Py_ssize_t *next) {
        return (Py_ssize_t)_InterlockedExchangeAdd64((volatile __int64 *)next, 1);
    }
    #else
    static inline Py_ssize_t ptx_claim(Py_ssize_t *next) {
        return __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
    }
    #endif
    """
    # Atomically take the next index (shared by the threads writing one set of entries).
    Py_ssize_t ptx_claim(Py_ssize_t *next) noexcept nogil


__all__ = [
    "HEADER_SIZE",
    "CRC32C_HARDWARE",
    "EntryHeader",
    "DecodedEntries",
    "EntryLog",
    "crc32c",
    "value_sizes",
    "encode_entry",
    "encode_entries",
    "decode_header",
    "decode_entries",
]

CRC32C_HARDWARE = bool(ptx_crc32c_hardware())
REASONS = {**_FORMAT_REASONS, ENTRY_BAD_UTF8: "property key or value is not UTF-8"}
# Bulk appends encode into reused per-thread arenas of about this size, one round at a time.
ARENA_ROUND_BYTES = 8 * 1024 * 1024
# Below this many bytes a bulk encode stays on the calling thread.
PARALLEL_MIN_BYTES = 1 << 20
# Scratch memory (pointer arrays) larger than this is freed after a call rather than kept.
SCRATCH_KEEP_BYTES = 64 * 1024 * 1024

_MARKERS = frozenset(int(m) for m in MarkerType)
_BE64 = struct.Struct(">Q")
_U64_MAX = (1 << 64) - 1
cdef const uint8_t *MAGIC = <const uint8_t *>b"PTXE"
cdef uint8_t EMPTY[1]


# -- CRC-32C --------------------------------------------------------------------------------

def _crc_start(value) -> int:
    value = as_int(value, "crc32c value")
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"crc32c value {value} out of range 0..2^32-1")
    return value


def crc32c(data, value=0) -> int:
    """CRC-32C of a buffer, continuing the running value `value` (0 to start)."""
    cdef uint32_t start = _crc_start(value)
    cdef uint32_t out
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            out = ptx_crc32c(start, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def _crc32c_software(data, value=0) -> int:
    """crc32c through the portable table path whatever the CPU (tests compare the two)."""
    cdef uint32_t start = _crc_start(value)
    cdef uint32_t out
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            out = ptx_crc32c_software(start, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


# -- the format at C level (declared in entrylog.pxd) ---------------------------------------

cdef EntryStatus read_head(const uint8_t *p, size_t size, EntryHead *head) noexcept nogil:
    if size < ENTRY_HEADER_SIZE:
        return ENTRY_SHORT
    if memcmp(p, MAGIC, 4) != 0:
        return ENTRY_BAD_MAGIC
    if p[4] != ENTRY_VERSION:
        return ENTRY_BAD_VERSION
    if p[6] != 0 or p[7] != 0:
        return ENTRY_BAD_FLAGS
    head.marker_type = p[5]
    head.txn_msb = load_u64le(p + 8)
    head.txn_lsb = load_u64le(p + 16)
    head.producer_id = load_u64le(p + 24)
    head.sequence_id = load_u64le(p + 32)
    head.publish_time = <int64_t>load_u64le(p + 40)
    head.message_count = load_u32le(p + 48)
    return ENTRY_OK


cdef uint32_t entry_checksum(const uint8_t *p, size_t size) noexcept nogil:
    return ptx_crc32c(ptx_crc32c(0, p, ENTRY_CRC_OFFSET), p + ENTRY_HEADER_SIZE,
                      size - ENTRY_HEADER_SIZE)


cdef void write_head(uint8_t *out, const EntryHead *head) noexcept nogil:
    memcpy(out, MAGIC, 4)
    out[4] = ENTRY_VERSION
    out[5] = head.marker_type
    out[6] = 0
    out[7] = 0
    store_u64le(out + 8, head.txn_msb)
    store_u64le(out + 16, head.txn_lsb)
    store_u64le(out + 24, head.producer_id)
    store_u64le(out + 32, head.sequence_id)
    store_u64le(out + 40, <uint64_t>head.publish_time)
    store_u32le(out + 48, head.message_count)
    store_u32le(out + 52, 0)


cdef bint utf8_valid(const uint8_t *p, size_t n) noexcept nogil:
    """Strict UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF),
    exactly what Python's bytes.decode("utf-8") accepts."""
    cdef size_t i = 0
    cdef uint8_t c, lo, hi
    cdef int more, k
    while i < n:
        c = p[i]
        if c < 0x80:
            i += 1
            continue
        lo = 0x80
        hi = 0xBF
        if 0xC2 <= c <= 0xDF:
            more = 1
        elif c == 0xE0:
            more = 2
            lo = 0xA0
        elif 0xE1 <= c <= 0xEC or c == 0xEE or c == 0xEF:
            more = 2
        elif c == 0xED:
            more = 2
            hi = 0x9F
        elif c == 0xF0:
            more = 3
            lo = 0x90
        elif 0xF1 <= c <= 0xF3:
            more = 3
        elif c == 0xF4:
            more = 3
            hi = 0x8F
        else:
            return False
        if n - i - 1 < <size_t>more:
            return False
        if not lo <= p[i + 1] <= hi:
            return False
        for k in range(2, more + 1):
            if not 0x80 <= p[i + k] <= 0xBF:
                return False
        i += more + 1
    return True


cdef EntryStatus check_entry(const uint8_t *p, size_t size, bint verify,
                             EntrySizes *sizes) noexcept nogil:
    cdef EntryHead head
    cdef EntryStatus status = read_head(p, size, &head)
    if status != ENTRY_OK:
        return status
    if verify and entry_checksum(p, size) != load_u32le(p + ENTRY_CRC_OFFSET):
        return ENTRY_BAD_CHECKSUM
    # `left` counts the bytes not yet consumed; every length is compared with it before use,
    # so nothing here can overflow or read past the end.
    cdef size_t left = size - ENTRY_HEADER_SIZE
    cdef const uint8_t *q = p + ENTRY_HEADER_SIZE
    cdef uint64_t count = head.message_count
    cdef uint64_t j, k, pairs, n
    cdef EntrySizes add
    if count > left / ENTRY_MIN_MESSAGE:
        return ENTRY_BAD_COUNT
    memset(&add, 0, sizeof(add))
    for j in range(count):
        if left < 4:
            return ENTRY_TRUNCATED
        n = load_u32le(q)
        q += 4
        left -= 4
        if n != ENTRY_NO_KEY:
            if n > left:
                return ENTRY_TRUNCATED
            q += n
            left -= n
            add.key_bytes += n
        if left < 4:
            return ENTRY_TRUNCATED
        pairs = load_u32le(q)
        q += 4
        left -= 4
        if pairs > left / 8:
            return ENTRY_TRUNCATED
        for k in range(pairs):
            if left < 4:
                return ENTRY_TRUNCATED
            n = load_u32le(q)
            q += 4
            left -= 4
            if n > left:
                return ENTRY_TRUNCATED
            if not utf8_valid(q, n):
                return ENTRY_BAD_UTF8
            q += n
            left -= n
            add.prop_key_bytes += n
            if left < 4:
                return ENTRY_TRUNCATED
            n = load_u32le(q)
            q += 4
            left -= 4
            if n > left:
                return ENTRY_TRUNCATED
            if not utf8_valid(q, n):
                return ENTRY_BAD_UTF8
            q += n
            left -= n
            add.prop_value_bytes += n
        add.pairs += pairs
        if left < 4:
            return ENTRY_TRUNCATED
        n = load_u32le(q)
        q += 4
        left -= 4
        if n > left:
            return ENTRY_TRUNCATED
        q += n
        left -= n
        add.value_bytes += n
    if left != 0:
        return ENTRY_TRAILING
    sizes.messages += count
    sizes.key_bytes += add.key_bytes
    sizes.value_bytes += add.value_bytes
    sizes.pairs += add.pairs
    sizes.prop_key_bytes += add.prop_key_bytes
    sizes.prop_value_bytes += add.prop_value_bytes
    return ENTRY_OK


# -- where the messages are -----------------------------------------------------------------

cdef struct Column:
    bint present              # False: the column was not given (no keys, no properties)
    const uint8_t **ptr       # gathered from Python objects: item pointers ...
    int64_t *len              # ... and lengths, -1 = absent
    const uint8_t *data       # or a pyarrow array: data buffer,
    const int32_t *offs32     # 32-bit offsets (binary, string) or
    const int64_t *offs64     # 64-bit offsets (large_binary, large_string),
    const uint8_t *valid      # validity bitmap (NULL: all valid)
    int64_t valid_bit         # bit of item 0 in `valid`


cdef struct Messages:
    Py_ssize_t n
    Column values
    Column keys
    Column props              # encoded property blocks (with their u32 count); absent: none


cdef inline int64_t col_item(const Column *c, Py_ssize_t i, const uint8_t **p) noexcept nogil:
    """Length of item i of c (its bytes at p[0]), or -1 when absent."""
    cdef int64_t a, b, bit
    if not c.present:
        return -1
    if c.ptr != NULL:
        p[0] = c.ptr[i]
        return c.len[i]
    if c.valid != NULL:
        bit = c.valid_bit + i
        if not (c.valid[bit >> 3] >> (bit & 7)) & 1:
            return -1
    if c.offs32 != NULL:
        a = c.offs32[i]
        b = c.offs32[i + 1]
    else:
        a = c.offs64[i]
        b = c.offs64[i + 1]
    p[0] = c.data + a
    return b - a


cdef inline uint64_t message_size(const Messages *m, Py_ssize_t i) noexcept nogil:
    cdef const uint8_t *p
    cdef int64_t v = col_item(&m.values, i, &p)
    cdef int64_t k = col_item(&m.keys, i, &p)
    cdef int64_t props = col_item(&m.props, i, &p)
    return 8 + <uint64_t>v + <uint64_t>(k if k > 0 else 0) + <uint64_t>(props if props >= 0 else 4)


cdef class _Scratch:
    """malloc'd arrays reused from call to call on one thread (fresh memory costs a page
    fault per 4 KiB on first touch, more than gathering the pointers itself)."""

    cdef void *blocks[8]
    cdef size_t caps[8]

    cdef void *get(self, int slot, size_t nbytes) except NULL:
        if self.caps[slot] < nbytes or self.blocks[slot] == NULL:
            free(self.blocks[slot])
            self.caps[slot] = 0
            self.blocks[slot] = malloc(nbytes if nbytes > 4096 else 4096)
            if self.blocks[slot] == NULL:
                raise MemoryError(f"{nbytes} bytes of scratch memory")
            self.caps[slot] = nbytes if nbytes > 4096 else 4096
        return self.blocks[slot]

    cdef size_t total(self):
        cdef size_t t = 0
        cdef int i
        for i in range(8):
            t += self.caps[i]
        return t

    def __dealloc__(self):
        cdef int i
        for i in range(8):
            free(self.blocks[i])


_local = threading.local()


cdef _Scratch _take_scratch():
    pool = getattr(_local, "scratch", None)
    if pool:
        return pool.pop()
    return _Scratch()


cdef void _give_back_scratch(_Scratch s):
    if s.total() > SCRATCH_KEEP_BYTES:
        return
    pool = getattr(_local, "scratch", None)
    if pool is None:
        pool = _local.scratch = []
    if len(pool) < 2:
        pool.append(s)


cdef enum:
    SLOT_REFS = 0
    SLOT_VPTR = 1
    SLOT_VLEN = 2
    SLOT_KPTR = 3
    SLOT_KLEN = 4
    SLOT_PPTR = 5
    SLOT_PLEN = 6


def _as_sequence(obj, str what):
    """A list or tuple of obj (any non-bytes sequence is copied into a list)."""
    if isinstance(obj, (list, tuple)):
        return obj
    if isinstance(obj, (str, bytes, bytearray, memoryview)) or not (
        isinstance(obj, (Sequence, np.ndarray))
    ):
        raise TypeError(
            f"{what} must be a sequence (list, tuple) or a pyarrow array, not {type(obj).__name__}"
        )
    return list(obj)


cdef class _Messages:
    """The messages of one encode call, validated; owns a reference to every Python object
    its pointers point into, so another thread changing the caller's lists cannot free them."""

    cdef Messages c
    cdef _Scratch scratch
    cdef PyObject **refs
    cdef Py_ssize_t nrefs
    cdef list keep

    def __dealloc__(self):
        self.release()

    cdef void release(self):
        cdef Py_ssize_t i
        for i in range(self.nrefs):
            _raw_decref(self.refs[i])
        self.nrefs = 0
        if self.scratch is not None:
            _give_back_scratch(self.scratch)
            self.scratch = None

    cdef inline void hold(self, object o):
        _raw_incref(<PyObject *>o)
        self.refs[self.nrefs] = <PyObject *>o
        self.nrefs += 1

    cdef int arrow_column(self, Column *col, offsets, data, valid, Py_ssize_t valid_bit,
                          str what) except -1:
        """Point col at a pyarrow array's buffers, after checking its offsets stay inside."""
        cdef const int32_t[::1] o32
        cdef const int64_t[::1] o64
        cdef const uint8_t[::1] d = data
        cdef const uint8_t[::1] vb
        cdef Py_ssize_t i, n = offsets.shape[0] - 1
        cdef int64_t prev, cur, longest = 0, size = d.shape[0]
        cdef bint bad = False
        self.keep.extend((offsets, data, valid))
        col.present = True
        col.data = &d[0]
        if offsets.dtype == np.int32:
            o32 = offsets
            col.offs32 = &o32[0]
        else:
            o64 = offsets
            col.offs64 = &o64[0]
        if valid is not None:
            vb = valid
            col.valid = &vb[0]
            col.valid_bit = valid_bit
        with nogil:
            prev = col.offs32[0] if col.offs32 != NULL else col.offs64[0]
            bad = prev < 0
            for i in range(n):
                cur = col.offs32[i + 1] if col.offs32 != NULL else col.offs64[i + 1]
                if cur < prev:
                    bad = True
                    break
                if cur - prev > longest:
                    longest = cur - prev
                prev = cur
            if prev > size:
                bad = True
        if bad:
            raise ValueError(f"{what}: offsets of the pyarrow array point outside its data")
        if longest > ENTRY_MAX_FIELD:
            raise ValueError(f"{what} holds an item of {longest} bytes, over 2^32-2")
        return 0

    cdef int gather_values(self, values) except -1:
        cdef Py_ssize_t i, n
        cdef object v
        arrow = arrow_binary(values)
        if arrow is not None:
            self.c.n = arrow[0].shape[0] - 1
            return self.arrow_column(&self.c.values, arrow[0], arrow[1], None, 0, "values")
        seq = _as_sequence(values, "values")
        n = len(seq)
        self.c.n = n
        self.refs = <PyObject **>self.scratch.get(SLOT_REFS, 3 * (n + 1) * sizeof(PyObject *))
        col = &self.c.values
        col.present = True
        col.ptr = <const uint8_t **>self.scratch.get(SLOT_VPTR, (n + 1) * sizeof(void *))
        col.len = <int64_t *>self.scratch.get(SLOT_VLEN, (n + 1) * sizeof(int64_t))
        for i in range(n):
            v = seq[i]
            if not PyBytes_Check(v):
                if isinstance(v, (bytearray, memoryview)):
                    v = bytes(v)
                else:
                    raise TypeError(f"values[{i}] must be bytes-like, not {type(v).__name__}")
            if PyBytes_GET_SIZE(v) > ENTRY_MAX_FIELD:
                raise ValueError(f"values[{i}] of {PyBytes_GET_SIZE(v)} bytes is over 2^32-2")
            self.hold(v)
            col.ptr[i] = <const uint8_t *>PyBytes_AS_STRING(v)
            col.len[i] = PyBytes_GET_SIZE(v)
        return 0

    cdef int gather_keys(self, keys) except -1:
        cdef Py_ssize_t i, n = self.c.n, size
        cdef object k
        cdef const char *utf8
        if keys is None:
            return 0
        if (type(keys).__module__ or "").startswith("pyarrow"):
            return self.arrow_keys(keys)
        seq = _as_sequence(keys, "keys")
        if len(seq) != n:
            raise ValueError(f"keys has {len(seq)} items for {n} values")
        if self.refs == NULL:  # values came from arrow
            self.refs = <PyObject **>self.scratch.get(SLOT_REFS, 3 * (n + 1) * sizeof(PyObject *))
        col = &self.c.keys
        col.present = True
        col.ptr = <const uint8_t **>self.scratch.get(SLOT_KPTR, (n + 1) * sizeof(void *))
        col.len = <int64_t *>self.scratch.get(SLOT_KLEN, (n + 1) * sizeof(int64_t))
        for i in range(n):
            k = seq[i]
            if k is None:
                col.ptr[i] = NULL
                col.len[i] = -1
                continue
            if PyUnicode_Check(k):
                utf8 = PyUnicode_AsUTF8AndSize(k, &size)
            else:
                if not PyBytes_Check(k):
                    if isinstance(k, (bytearray, memoryview)):
                        k = bytes(k)
                    else:
                        raise TypeError(
                            f"keys[{i}] must be bytes, str or None, not {type(k).__name__}"
                        )
                utf8 = PyBytes_AS_STRING(k)
                size = PyBytes_GET_SIZE(k)
            if size > ENTRY_MAX_FIELD:
                raise ValueError(f"keys[{i}] of {size} bytes is too long")
            self.hold(k)
            col.ptr[i] = <const uint8_t *>utf8
            col.len[i] = size
        return 0

    cdef int arrow_keys(self, keys) except -1:
        import pyarrow as pa

        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        if not isinstance(keys, pa.Array):
            raise TypeError(f"keys must be a pyarrow Array, not {type(keys).__name__}")
        if len(keys) != self.c.n:
            raise ValueError(f"keys has {len(keys)} items for {self.c.n} values")
        t = keys.type
        if pa.types.is_null(t):
            return 0
        if pa.types.is_binary(t) or pa.types.is_string(t):
            dtype = np.int32
        elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
            dtype = np.int64
        else:
            raise TypeError(f"keys must be a binary or string array, not {t}")
        n = len(keys)
        bufs = keys.buffers()
        if bufs[1] is None:
            offsets = np.zeros(n + 1, dtype=dtype)
        else:
            offsets = np.frombuffer(bufs[1], dtype=dtype, count=n + 1,
                                    offset=keys.offset * np.dtype(dtype).itemsize)
        data = (np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and bufs[2].size
                else np.zeros(1, dtype=np.uint8))
        valid = None
        if keys.null_count and bufs[0] is not None:
            valid = np.frombuffer(bufs[0], dtype=np.uint8)
        return self.arrow_column(&self.c.keys, offsets, data, valid, keys.offset, "keys")

    cdef int gather_props(self, properties) except -1:
        cdef Py_ssize_t i, n = self.c.n
        cdef object p
        cdef bytes blob
        if properties is None:
            return 0
        if not isinstance(properties, (list, tuple)):
            raise TypeError(f"properties must be a list, not {type(properties).__name__}")
        if len(properties) != n:
            raise ValueError(f"properties has {len(properties)} items for {n} values")
        if self.refs == NULL:
            self.refs = <PyObject **>self.scratch.get(SLOT_REFS, 3 * (n + 1) * sizeof(PyObject *))
        col = &self.c.props
        col.present = True
        col.ptr = <const uint8_t **>self.scratch.get(SLOT_PPTR, (n + 1) * sizeof(void *))
        col.len = <int64_t *>self.scratch.get(SLOT_PLEN, (n + 1) * sizeof(int64_t))
        for i in range(n):
            p = properties[i]
            if p is None:
                col.ptr[i] = NULL
                col.len[i] = -1
                continue
            blob = encode_properties(p, i)
            self.hold(blob)
            col.ptr[i] = <const uint8_t *>PyBytes_AS_STRING(blob)
            col.len[i] = PyBytes_GET_SIZE(blob)
        return 0


cdef _Messages _gather(values, keys, properties):
    cdef _Messages m = _Messages.__new__(_Messages)
    m.keep = []
    m.scratch = _take_scratch()
    try:
        m.gather_values(values)
        m.gather_keys(keys)
        m.gather_props(properties)
    except BaseException:
        m.release()
        raise
    return m


# -- encoding -------------------------------------------------------------------------------

cdef uint8_t *_write_message(uint8_t *p, const Messages *m, Py_ssize_t i) noexcept nogil:
    cdef const uint8_t *src
    cdef int64_t n = col_item(&m.keys, i, &src)
    if n < 0:
        store_u32le(p, ENTRY_NO_KEY)
        p += 4
    else:
        store_u32le(p, <uint32_t>n)
        memcpy(p + 4, src, <size_t>n)
        p += 4 + n
    n = col_item(&m.props, i, &src)
    if n < 0:
        store_u32le(p, 0)
        p += 4
    else:
        memcpy(p, src, <size_t>n)
        p += n
    n = col_item(&m.values, i, &src)
    store_u32le(p, <uint32_t>n)
    memcpy(p + 4, src, <size_t>n)
    return p + 4 + n


cdef void _write_entry(uint8_t *out, const Messages *m, Py_ssize_t i0, Py_ssize_t i1,
                       const EntryHead *head, size_t total) noexcept nogil:
    write_head(out, head)
    cdef uint8_t *p = out + ENTRY_HEADER_SIZE
    cdef Py_ssize_t i
    for i in range(i0, i1):
        p = _write_message(p, m, i)
    store_u32le(out + ENTRY_CRC_OFFSET, entry_checksum(out, total))


cdef class _Plan:
    """How the messages split into entries: entry e holds messages bounds[e]..bounds[e+1]-1,
    takes sizes[e] bytes and is written at out[e]."""

    cdef Py_ssize_t ne
    cdef int64_t *bounds
    cdef uint64_t *sizes
    cdef uint8_t **out
    cdef uint64_t total

    def __dealloc__(self):
        free(self.bounds)
        free(self.sizes)
        free(self.out)


cdef _Plan _make_plan(_Messages msgs, Py_ssize_t batch, uint64_t cap):
    """Consecutive entries of at most `batch` messages and `cap` bytes (a message that is
    larger on its own goes alone)."""
    cdef _Plan plan = _Plan.__new__(_Plan)
    cdef const Messages *m = &msgs.c
    cdef Py_ssize_t n = m.n, i = 0, j, e = 0
    cdef uint64_t total, size
    cdef size_t slots = <size_t>n + 2
    plan.bounds = <int64_t *>malloc(slots * sizeof(int64_t))
    plan.sizes = <uint64_t *>malloc(slots * sizeof(uint64_t))
    plan.out = <uint8_t **>calloc(slots, sizeof(uint8_t *))
    if plan.bounds == NULL or plan.sizes == NULL or plan.out == NULL:
        raise MemoryError()
    with nogil:
        while i < n:
            plan.bounds[e] = i
            total = ENTRY_HEADER_SIZE
            j = i
            while j < n and j - i < batch:
                size = message_size(m, j)
                if j > i and total + size > cap:
                    break
                total += size
                j += 1
            plan.sizes[e] = total
            plan.total += total
            e += 1
            i = j
        plan.bounds[e] = n
        plan.ne = e
    return plan


cdef class _EncodeJob:
    """Write entries e0..e1-1 of a plan. Any number of threads may run work() at once: each
    claims the next unwritten entry, so the work balances itself."""

    cdef _Messages msgs
    cdef _Plan plan
    cdef EntryHead head        # message_count and sequence_id are set per entry
    cdef uint64_t first_sequence
    cdef Py_ssize_t next
    cdef Py_ssize_t end

    cdef void work(self) noexcept nogil:
        cdef EntryHead head = self.head
        cdef Py_ssize_t e
        cdef int64_t *bounds = self.plan.bounds
        while True:
            e = ptx_claim(&self.next)
            if e >= self.end:
                return
            head.message_count = <uint32_t>(bounds[e + 1] - bounds[e])
            head.sequence_id = self.first_sequence + <uint64_t>bounds[e]
            _write_entry(self.plan.out[e], &self.msgs.c, bounds[e], bounds[e + 1], &head,
                         self.plan.sizes[e])

    def run(self):
        with nogil:
            self.work()


cdef _EncodeJob _job(_Messages msgs, _Plan plan, Py_ssize_t e0, Py_ssize_t e1, uint8_t marker,
                     uint64_t txn_msb, uint64_t txn_lsb, uint64_t producer_id,
                     uint64_t first_sequence, int64_t publish_time):
    cdef _EncodeJob job = _EncodeJob.__new__(_EncodeJob)
    job.msgs = msgs
    job.plan = plan
    job.next = e0
    job.end = e1
    job.first_sequence = first_sequence
    job.head.marker_type = marker
    job.head.txn_msb = txn_msb
    job.head.txn_lsb = txn_lsb
    job.head.producer_id = producer_id
    job.head.publish_time = publish_time
    return job


_helper_pool = None
_helper_pid = 0
_helper_lock = threading.Lock()


def _helper():
    """The one helper thread of this process (made again after a fork: threads do not
    survive one, and a forked pool would wait forever)."""
    global _helper_pool, _helper_pid
    with _helper_lock:
        if _helper_pool is None or _helper_pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            _helper_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pulsartxn-encode")
            _helper_pid = os.getpid()
        return _helper_pool


cdef _run_job(_EncodeJob job, uint64_t nbytes):
    """Run job on this thread, with the helper thread joining in when it is big enough."""
    future = None
    if nbytes >= <uint64_t>PARALLEL_MIN_BYTES and job.end - job.next > 1:
        future = _helper().submit(job.run)
    try:
        with nogil:
            job.work()
    finally:
        # A helper that never started has nothing left to do; one that did is finishing the
        # entry it claimed, which must land before the memory is used or reused.
        if future is not None and not future.cancel():
            future.result()


cdef object _header_values(txn_msb, txn_lsb, producer_id, sequence_id, publish_time,
                           marker_type):
    check_header_ints(txn_msb, txn_lsb, producer_id, sequence_id, publish_time, marker_type)
    if int(marker_type) not in _MARKERS:
        raise ValueError(
            f"marker_type {marker_type} is not a MarkerType ({', '.join(map(str, sorted(_MARKERS)))})"
        )
    return (int(txn_msb), int(txn_lsb), int(producer_id), int(sequence_id), int(publish_time),
            int(marker_type))


def encode_entry(values, keys=None, properties=None, *, txn_msb=0, txn_lsb=0, producer_id=0,
                 sequence_id=0, publish_time=0, marker_type=0) -> bytes:
    """One entry holding every message of `values` (a marker entry holds zero or one).

    values: bytes-like objects or a pyarrow binary/string array; keys: None or, per message,
    bytes, str or None; properties: None or, per message, a dict[str, str] or None.
    """
    msb, lsb, producer, sequence, publish, marker = _header_values(
        txn_msb, txn_lsb, producer_id, sequence_id, publish_time, marker_type)
    cdef _Messages m = _gather(values, keys, properties)
    cdef _Plan plan
    cdef bytes out
    try:
        if m.c.n > 0xFFFFFFFF:
            raise ValueError(f"{m.c.n} messages do not fit one entry (at most 2^32-1)")
        if marker != 0 and m.c.n > 1:
            raise ValueError(f"a marker entry holds zero or one message, not {m.c.n}")
        plan = _make_plan(m, m.c.n if m.c.n else 1, <uint64_t>-1)
        if plan.ne == 0:  # no messages: a header-only entry
            plan.sizes[0] = ENTRY_HEADER_SIZE
            plan.bounds[1] = 0
            plan.ne = 1
        out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>plan.sizes[0])
        plan.out[0] = <uint8_t *>PyBytes_AS_STRING(out)
        _run_job(_job(m, plan, 0, 1, marker, msb, lsb, producer, sequence, publish), 0)
        return out
    finally:
        m.release()


cdef _Plan _bulk_plan(_Messages m, batch_size, max_entry_bytes, first_sequence_id):
    check_bulk(batch_size, max_entry_bytes, first_sequence_id, m.c.n)
    return _make_plan(m, min(batch_size, 0xFFFFFFFF), min(max_entry_bytes, _U64_MAX))


def encode_entries(values, keys=None, properties=None, *, batch_size=1000,
                   max_entry_bytes=DEFAULT_MAX_ENTRY_BYTES, txn_msb=0, txn_lsb=0, producer_id=0,
                   first_sequence_id=0, publish_time=0) -> list:
    """Split a bulk of messages into consecutive data entries of at most batch_size messages
    and (unless one message alone is larger) max_entry_bytes bytes; sequence ids run on from
    first_sequence_id across the entries."""
    msb, lsb, producer, sequence, publish, _ = _header_values(
        txn_msb, txn_lsb, producer_id, first_sequence_id, publish_time, 0)
    check_bulk(batch_size, max_entry_bytes, sequence, 1)
    cdef _Messages m = _gather(values, keys, properties)
    cdef _Plan plan
    cdef Py_ssize_t e
    cdef list out
    cdef bytes entry
    try:
        plan = _bulk_plan(m, batch_size, max_entry_bytes, sequence)
        out = [None] * plan.ne
        for e in range(plan.ne):
            entry = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>plan.sizes[e])
            plan.out[e] = <uint8_t *>PyBytes_AS_STRING(entry)
            out[e] = entry
        _run_job(_job(m, plan, 0, plan.ne, 0, msb, lsb, producer, sequence, publish), plan.total)
        return out
    finally:
        m.release()


@cython.boundscheck(False)
@cython.wraparound(False)
def value_sizes(values):
    """int64 sizes of bytes-like values or of a pyarrow binary/string array."""
    arrow = arrow_binary(values)
    if arrow is not None:
        return np.diff(arrow[0]).astype(np.int64)
    seq = _as_sequence(values, "values")
    cdef Py_ssize_t i, n = len(seq)
    out = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] sizes = out
    cdef object v
    for i in range(n):
        v = seq[i]
        if PyBytes_Check(v):
            sizes[i] = PyBytes_GET_SIZE(v)
        elif isinstance(v, (bytearray, memoryview)):
            sizes[i] = memoryview(v).nbytes
        else:
            raise TypeError(f"values[{i}] must be bytes-like, not {type(v).__name__}")
    return out


# -- decoding -------------------------------------------------------------------------------

def decode_header(buf, verify=True):
    """The EntryHeader of one entry; with verify the whole entry is checked (lengths and
    checksum), without it only the header."""
    cdef Py_buffer view
    cdef EntryHead head
    cdef EntrySizes sizes
    cdef EntryStatus status
    cdef bint check_all = bool(verify)
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        memset(&sizes, 0, sizeof(sizes))
        with nogil:
            status = read_head(<const uint8_t *>view.buf, <size_t>view.len, &head)
            if status == ENTRY_OK and check_all:
                status = check_entry(<const uint8_t *>view.buf, <size_t>view.len, True, &sizes)
        if status != ENTRY_OK:
            raise CorruptEntry(f"entry: {REASONS[status]}")
        return EntryHeader(head.marker_type, head.txn_msb, head.txn_lsb, head.producer_id,
                           head.sequence_id, head.publish_time, head.message_count)
    finally:
        PyBuffer_Release(&view)


def decode_entries(entry_ids, buffers, verify=True) -> DecodedEntries:
    """Decode entries into columns (DecodedEntries). Any malformed, truncated or (with verify)
    checksum-failing entry raises CorruptEntry naming its entry id."""
    ids = as_entry_ids(entry_ids)
    if not isinstance(buffers, (list, tuple)):
        buffers = list(buffers)
    cdef Py_ssize_t ne = len(buffers)
    if ids.shape[0] != ne:
        raise ValueError(f"{ids.shape[0]} entry ids for {ne} buffers")
    cdef Py_buffer *views = <Py_buffer *>calloc(ne if ne else 1, sizeof(Py_buffer))
    if views == NULL:
        raise MemoryError()
    cdef Py_ssize_t acquired = 0, e, bad = -1
    cdef EntrySizes sizes
    cdef EntryStatus status = ENTRY_OK
    cdef bint check_crc = bool(verify)
    memset(&sizes, 0, sizeof(sizes))
    try:
        for e in range(ne):
            PyObject_GetBuffer(buffers[e], &views[e], PyBUF_SIMPLE)
            acquired += 1
        with nogil:
            for e in range(ne):
                status = check_entry(<const uint8_t *>views[e].buf, <size_t>views[e].len,
                                     check_crc, &sizes)
                if status != ENTRY_OK:
                    bad = e
                    break
        if status != ENTRY_OK:
            raise CorruptEntry(f"entry {int(ids[bad])}: {REASONS[status]}")
        return _fill(views, ne, ids, &sizes)
    finally:
        for e in range(acquired):
            PyBuffer_Release(&views[e])
        free(views)


cdef uint8_t *_data_ptr(arr) except? NULL:
    cdef uint8_t[::1] view = arr
    if view.shape[0] == 0:
        return EMPTY
    return &view[0]


@cython.boundscheck(False)
@cython.wraparound(False)
cdef object _fill(Py_buffer *views, Py_ssize_t ne, ids, const EntrySizes *t):
    """Second pass over entries check_entry accepted: copy them into the columns."""
    cdef Py_ssize_t nm = <Py_ssize_t>t.messages, npairs = <Py_ssize_t>t.pairs
    a = {
        "entry_id": np.ascontiguousarray(ids, dtype=np.uint64),
        "txn_msb": np.empty(ne, np.uint64),
        "txn_lsb": np.empty(ne, np.uint64),
        "producer_id": np.empty(ne, np.uint64),
        "sequence_id": np.empty(ne, np.uint64),
        "publish_time": np.empty(ne, np.int64),
        "marker_type": np.empty(ne, np.uint8),
        "message_count": np.empty(ne, np.uint32),
        "first_message": np.empty(ne, np.int64),
        "msg_entry": np.empty(nm, np.int64),
        "batch_index": np.empty(nm, np.int32),
        "key_offsets": np.empty(nm + 1, np.int64),
        "key_data": np.empty(<Py_ssize_t>t.key_bytes, np.uint8),
        "key_valid": np.empty(nm, np.bool_),
        "value_offsets": np.empty(nm + 1, np.int64),
        "value_data": np.empty(<Py_ssize_t>t.value_bytes, np.uint8),
        "prop_offsets": np.empty(nm + 1, np.int64),
        "prop_key_offsets": np.empty(npairs + 1, np.int64),
        "prop_key_data": np.empty(<Py_ssize_t>t.prop_key_bytes, np.uint8),
        "prop_value_offsets": np.empty(npairs + 1, np.int64),
        "prop_value_data": np.empty(<Py_ssize_t>t.prop_value_bytes, np.uint8),
    }
    cdef uint64_t[::1] txn_msb = a["txn_msb"], txn_lsb = a["txn_lsb"]
    cdef uint64_t[::1] producer = a["producer_id"], sequence = a["sequence_id"]
    cdef int64_t[::1] publish = a["publish_time"], first = a["first_message"]
    cdef uint8_t[::1] marker = a["marker_type"]
    cdef uint32_t[::1] mcount = a["message_count"]
    cdef int64_t[::1] msg_entry = a["msg_entry"]
    cdef int32_t[::1] batch_index = a["batch_index"]
    cdef int64_t[::1] key_off = a["key_offsets"], val_off = a["value_offsets"]
    cdef int64_t[::1] prop_off = a["prop_offsets"]
    cdef int64_t[::1] pk_off = a["prop_key_offsets"], pv_off = a["prop_value_offsets"]
    cdef uint8_t[::1] key_valid = a["key_valid"].view(np.uint8)
    cdef uint8_t *key_data = _data_ptr(a["key_data"])
    cdef uint8_t *val_data = _data_ptr(a["value_data"])
    cdef uint8_t *pk_data = _data_ptr(a["prop_key_data"])
    cdef uint8_t *pv_data = _data_ptr(a["prop_value_data"])
    cdef Py_ssize_t e, m = 0, pair = 0
    cdef uint32_t j, k, count, pairs, n
    cdef int64_t kb = 0, vb = 0, pkb = 0, pvb = 0
    cdef const uint8_t *p
    with nogil:
        key_off[0] = 0
        val_off[0] = 0
        prop_off[0] = 0
        pk_off[0] = 0
        pv_off[0] = 0
        for e in range(ne):
            p = <const uint8_t *>views[e].buf
            marker[e] = p[5]
            txn_msb[e] = load_u64le(p + 8)
            txn_lsb[e] = load_u64le(p + 16)
            producer[e] = load_u64le(p + 24)
            sequence[e] = load_u64le(p + 32)
            publish[e] = <int64_t>load_u64le(p + 40)
            count = load_u32le(p + 48)
            mcount[e] = count
            first[e] = m
            p += ENTRY_HEADER_SIZE
            for j in range(count):
                msg_entry[m] = e
                batch_index[m] = <int32_t>j
                n = load_u32le(p)
                p += 4
                if n == ENTRY_NO_KEY:
                    key_valid[m] = 0
                else:
                    key_valid[m] = 1
                    memcpy(key_data + kb, p, n)
                    kb += n
                    p += n
                key_off[m + 1] = kb
                pairs = load_u32le(p)
                p += 4
                for k in range(pairs):
                    n = load_u32le(p)
                    memcpy(pk_data + pkb, p + 4, n)
                    pkb += n
                    p += 4 + n
                    pk_off[pair + 1] = pkb
                    n = load_u32le(p)
                    memcpy(pv_data + pvb, p + 4, n)
                    pvb += n
                    p += 4 + n
                    pv_off[pair + 1] = pvb
                    pair += 1
                prop_off[m + 1] = pair
                n = load_u32le(p)
                memcpy(val_data + vb, p + 4, n)
                vb += n
                p += 4 + n
                val_off[m + 1] = vb
                m += 1
    return DecodedEntries(**a)


# -- the entry log on LMDB ------------------------------------------------------------------

cdef _check_txn(txn):
    if not isinstance(txn, lmdb.Transaction):
        raise TypeError(f"txn must be an lmdb Transaction, not {type(txn).__name__}")


_arenas = threading.local()


cdef bytearray _arena(int which, size_t need):
    """Reused per-thread arena `which` (0 or 1) of at least `need` bytes; a need far over the
    round size (one huge entry) gets a buffer of its own that is not kept."""
    if need > 2 * <size_t>ARENA_ROUND_BYTES:
        return bytearray(need)
    pair = getattr(_arenas, "pair", None)
    if pair is None:
        pair = _arenas.pair = [None, None]
    cdef bytearray buf = pair[which]
    if buf is None or <size_t>len(buf) < need:
        buf = bytearray(max(need, <size_t>ARENA_ROUND_BYTES))
        pair[which] = buf
    return buf


cdef _EncodeJob _prepare_round(_Messages m, _Plan plan, tuple rnd, int which, list arenas,
                               tuple head):
    """Point the entries of one round at arena `which` and make the job that writes them."""
    cdef Py_ssize_t e, r0 = rnd[0], r1 = rnd[1]
    cdef uint64_t off = 0
    arena = _arena(which, rnd[2])
    cdef uint8_t *base = <uint8_t *>(<char *>arena)
    for e in range(r0, r1):
        plan.out[e] = base + off
        off += plan.sizes[e]
    arenas[which] = arena
    msb, lsb, producer, sequence, publish = head
    return _job(m, plan, r0, r1, 0, msb, lsb, producer, sequence, publish)


cdef class EntryLog:
    """One partition's ledger: a named LMDB database of u64 big-endian entry id -> entry.

    Every method takes the caller's py-lmdb transaction, so appends share the caller's (group)
    commit. Entry ids are never reused: trim_below keeps the last entry, the one the next id
    is counted from.
    """

    def __init__(self, env, name):
        if not isinstance(env, lmdb.Environment):
            raise TypeError(f"env must be an lmdb Environment, not {type(env).__name__}")
        if not isinstance(name, bytes):
            raise TypeError(f"EntryLog name must be bytes, not {type(name).__name__}")
        if not name:
            raise ValueError("EntryLog name must not be empty")
        self.env = env
        self.name = name
        self.db = env.open_db(name, create=True)

    def __repr__(self):
        return f"EntryLog({self.name!r})"

    def last_entry_id(self, txn) -> int:
        """The highest entry id, -1 when the log is empty."""
        _check_txn(txn)
        with txn.cursor(db=self.db) as cursor:
            return _BE64.unpack(cursor.key())[0] if cursor.last() else -1

    def first_entry_id(self, txn) -> int:
        """The lowest entry id, -1 when the log is empty."""
        _check_txn(txn)
        with txn.cursor(db=self.db) as cursor:
            return _BE64.unpack(cursor.key())[0] if cursor.first() else -1

    def count(self, txn) -> int:
        _check_txn(txn)
        return txn.stat(self.db)["entries"]

    def _next_ids(self, txn, Py_ssize_t n) -> int:
        first = self.last_entry_id(txn) + 1
        if first + n - 1 > _U64_MAX:
            raise ValueError(f"{self.name!r}: {n} more entries pass entry id 2^64-1")
        return first

    def append(self, txn, entries) -> int:
        """Append encoded entries after the last one, in one putmulti; returns the first new
        entry id. Each entry's header is checked first: a bad one writes nothing."""
        _check_txn(txn)
        if not isinstance(entries, (list, tuple)):
            raise TypeError(f"entries must be a list of bytes, not {type(entries).__name__}")
        cdef Py_ssize_t i, n = len(entries)
        cdef Py_buffer view
        cdef EntryHead head
        cdef EntryStatus status
        for i in range(n):
            entry = entries[i]
            if not isinstance(entry, (bytes, bytearray, memoryview)):
                raise TypeError(f"entries[{i}] must be bytes, not {type(entry).__name__}")
            PyObject_GetBuffer(entry, &view, PyBUF_SIMPLE)
            status = read_head(<const uint8_t *>view.buf, <size_t>view.len, &head)
            PyBuffer_Release(&view)
            if status != ENTRY_OK:
                raise ValueError(f"entries[{i}] is not an entry: {REASONS[status]}")
        first = self._next_ids(txn, n)
        if n == 0:
            return first
        pack = _BE64.pack
        rows = [(pack(first + i), entries[i]) for i in range(n)]
        with txn.cursor(db=self.db) as cursor:
            _, added = cursor.putmulti(rows, append=True)
        if added != n:
            raise RuntimeError(f"{self.name!r}: appended {added} of {n} entries")
        return first

    def append_messages(self, txn, values, keys=None, properties=None, *, batch_size=1000,
                        max_entry_bytes=DEFAULT_MAX_ENTRY_BYTES, txn_msb=0, txn_lsb=0,
                        producer_id=0, first_sequence_id=0, publish_time=0):
        """encode_entries + append without making a bytes object per entry: entries are
        written into reused per-thread arenas, a round at a time, the next round being
        encoded (without the GIL) while LMDB copies the last one.

        Returns (first entry id, messages per entry). Arguments are all checked before
        anything is written.
        """
        _check_txn(txn)
        msb, lsb, producer, sequence, publish, _ = _header_values(
            txn_msb, txn_lsb, producer_id, first_sequence_id, publish_time, 0)
        check_bulk(batch_size, max_entry_bytes, sequence, 1)
        cdef _Messages m = _gather(values, keys, properties)
        cdef _Plan plan
        cdef Py_ssize_t e, e0, ne, k
        cdef uint64_t used
        cdef list rounds = []
        try:
            plan = _bulk_plan(m, batch_size, max_entry_bytes, sequence)
            ne = plan.ne
            first = self._next_ids(txn, ne)
            counts = np.diff(np.asarray(<int64_t[:ne + 1]>plan.bounds)).tolist()
            if ne == 0:
                return first, counts
            # Rounds of consecutive entries of at most ARENA_ROUND_BYTES (or one entry).
            e0 = 0
            used = 0
            for e in range(ne):
                if e > e0 and used + plan.sizes[e] > <uint64_t>ARENA_ROUND_BYTES:
                    rounds.append((e0, e, used))
                    e0 = e
                    used = 0
                used += plan.sizes[e]
            rounds.append((e0, ne, used))
            with txn.cursor(db=self.db) as cursor:
                self._pipeline(cursor, m, plan, rounds, first,
                               (msb, lsb, producer, sequence, publish))
            return first, counts
        finally:
            m.release()

    def _pipeline(self, cursor, _Messages m, _Plan plan, list rounds, first, tuple head):
        cdef Py_ssize_t k, e, e0, e1, nr = len(rounds)
        cdef uint64_t off
        arenas = [None, None]
        jobs = [None, None]
        jobs[0] = _prepare_round(m, plan, rounds[0], 0, arenas, head)
        _run_job(<_EncodeJob>jobs[0], rounds[0][2])
        pack = _BE64.pack
        future = None
        try:
            for k in range(nr):
                if k + 1 < nr:
                    jobs[(k + 1) % 2] = _prepare_round(m, plan, rounds[k + 1], (k + 1) % 2, arenas,
                                                       head)
                    future = _helper().submit((<_EncodeJob>jobs[(k + 1) % 2]).run)
                e0, e1, _ = rounds[k]
                view = memoryview(arenas[k % 2])
                rows = []
                off = 0
                for e in range(e0, e1):
                    rows.append((pack(first + e), view[off:off + plan.sizes[e]]))
                    off += plan.sizes[e]
                _, added = cursor.putmulti(rows, append=True)
                del rows, view
                if added != e1 - e0:
                    raise RuntimeError(f"{self.name!r}: appended {added} of {e1 - e0} entries")
                if future is not None:
                    with nogil:  # help the helper finish the next round
                        (<_EncodeJob>jobs[(k + 1) % 2]).work()
                    if not future.cancel():
                        future.result()
                    future = None
        finally:
            if future is not None and not future.cancel():
                try:
                    future.result()  # never leave the helper writing into an arena
                except BaseException:
                    pass

    def scan(self, txn, start=0, end=None, limit=None):
        """(entry ids, buffers) of entries start..end-1, at most `limit` of them; the buffers
        are what py-lmdb returns (memoryviews with buffers=True, valid while txn is open)."""
        _check_txn(txn)
        lo, hi, cap = entry_range(start, end, limit)
        ids = []
        bufs = []
        if cap == 0 or (hi is not None and lo >= hi):
            return ids, bufs
        unpack = _BE64.unpack
        with txn.cursor(db=self.db) as cursor:
            if not cursor.set_range(_BE64.pack(lo)):
                return ids, bufs
            for key, value in cursor.iternext():
                entry_id = unpack(key)[0]
                if hi is not None and entry_id >= hi:
                    break
                ids.append(entry_id)
                bufs.append(value)
                if cap is not None and len(ids) >= cap:
                    break
        return ids, bufs

    def read(self, txn, start=0, end=None, limit=None, verify=True) -> DecodedEntries:
        """scan + decode_entries: entries start..end-1 as columns."""
        ids, bufs = self.scan(txn, start, end, limit)
        return decode_entries(ids, bufs, verify)

    def trim_below(self, txn, entry_id) -> int:
        """Delete the entries below entry_id, except the last entry of the log (ids are never
        reused); returns how many were deleted."""
        _check_txn(txn)
        bound, _, _ = entry_range(entry_id, None, None)
        last = self.last_entry_id(txn)
        if last < 0:
            return 0
        bound = min(bound, last)
        removed = 0
        unpack = _BE64.unpack
        with txn.cursor(db=self.db) as cursor:
            if not cursor.first():
                return 0
            while unpack(cursor.key())[0] < bound:
                if not cursor.delete():
                    break
                removed += 1
        return removed
