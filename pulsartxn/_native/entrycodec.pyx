# cython: language_level=3
"""The entry encoder: messages to entries (format: entryformat.py; decoding: entrydecode.pyx).

Encoding gathers pointers to every message's bytes once (values from a list of bytes or
straight from a pyarrow array's buffers), then writes whole entries with memcpy and CRC-32C
without the GIL. The entry log's bulk append cimports the encoder (entrycodec.pxd), which
also holds the little-endian field helpers both halves share.
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from .includes.crc32c cimport ptx_crc32c, ptx_crc32c_hardware, ptx_crc32c_init

import threading

import numpy as np

from .checks import check_bulk
from .entryformat import (
    DEFAULT_MAX_ENTRY_BYTES,
    HEADER_SIZE,
    arrow_binary,
    check_header_ints,
    normalize_keys,
    normalize_metadata,
    normalize_properties,
)

ptx_crc32c_init()

CRC32C_HARDWARE = bool(ptx_crc32c_hardware())


def crc32c(data, value=0) -> int:
    """CRC-32C of a buffer, continuing the running value `value`."""
    cdef Py_buffer view
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"crc32c value must be an int in 0..2^32-1, not {value!r}")
    cdef uint32_t start = value
    cdef uint32_t out
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            out = ptx_crc32c(start, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


# -- encoding -------------------------------------------------------------------------------

cdef class Messages:
    """Where n messages' values, keys and encoded properties are, without copying them.

    Values come from a pyarrow array's offsets and data buffers, or from a list of bytes
    (pointers gathered into per-thread scratch memory that is reused, since fresh memory costs
    a page fault per 4 KiB). Keys and properties, when given, are pointed at the same way.
    """


_scratch = threading.local()


cdef char *_scratch_bytes(str name, size_t need) except NULL:
    """Per-thread scratch memory that is kept and reused (warm pages)."""
    cdef bytearray buf = getattr(_scratch, name, None)
    if buf is None or len(buf) < need:
        buf = bytearray(max(need, 4096))
        setattr(_scratch, name, buf)
    return <char *>buf


@cython.boundscheck(False)
@cython.wraparound(False)
cdef Messages gather(values, keys, properties, metadata=None):
    cdef Messages m = Messages.__new__(Messages)
    cdef Py_ssize_t i, n
    cdef const int32_t[::1] o32
    cdef const int64_t[::1] o64
    cdef const uint8_t[::1] data
    cdef object v
    cdef size_t count
    m.keep = []
    # A list or tuple is never an Arrow array: only other types are asked.
    arrow = None if type(values) is list or type(values) is tuple else arrow_binary(values)
    if arrow is not None:
        offsets_arr, data_arr = arrow
        n = len(offsets_arr) - 1
    else:
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"values must be a list of bytes or a pyarrow array, not {type(values).__name__}")
        n = len(values)
    if n > 0xFFFFFFFF:
        raise ValueError(f"{n} messages do not fit one entry log call")
    key_list = normalize_keys(keys, n)
    prop_list = normalize_properties(properties, n)
    meta_list = normalize_metadata(metadata, n)
    m.n = n
    count = n if n else 1
    if arrow is not None:
        m.arrow = True
        m.keep.extend((offsets_arr, data_arr, values))
        data = data_arr
        m.data = &data[0]
        if offsets_arr.dtype == np.int32:
            o32 = offsets_arr
            m.offs32 = &o32[0]
            lengths = np.diff(offsets_arr)
        else:
            o64 = offsets_arr
            m.offs64 = &o64[0]
            lengths = np.diff(offsets_arr)
        if n and lengths.max() > 0xFFFFFFFE:
            i = int(lengths.argmax())
            raise ValueError(f"values[{i}] of {int(lengths[i])} bytes is too long")
    else:
        m.arrow = False
        m.keep.append(values)
        m.vptr = <const uint8_t **>_scratch_bytes("vptr", count * sizeof(uint8_t *))
        m.vlen = <uint64_t *>_scratch_bytes("vlen", count * sizeof(uint64_t))
        for i in range(n):
            v = values[i]
            if not PyBytes_Check(v):
                if isinstance(v, (bytearray, memoryview)):
                    v = bytes(v)
                    m.keep.append(v)
                else:
                    raise TypeError(f"values[{i}] must be bytes, not {type(v).__name__}")
            if PyBytes_GET_SIZE(v) > 0xFFFFFFFE:
                raise ValueError(f"values[{i}] of {PyBytes_GET_SIZE(v)} bytes is too long")
            m.vptr[i] = <const uint8_t *>PyBytes_AS_STRING(v)
            m.vlen[i] = PyBytes_GET_SIZE(v)
    if key_list is not None:
        m.keep.append(key_list)
        m.kptr = <const uint8_t **>_scratch_bytes("kptr", count * sizeof(uint8_t *))
        m.klen = <int64_t *>_scratch_bytes("klen", count * sizeof(int64_t))
        for i in range(n):
            if key_list[i] is None:
                m.kptr[i] = NULL
                m.klen[i] = -1
            else:
                m.kptr[i] = <const uint8_t *>PyBytes_AS_STRING(key_list[i])
                m.klen[i] = PyBytes_GET_SIZE(key_list[i])
    if prop_list is not None:
        m.keep.append(prop_list)
        m.pptr = <const uint8_t **>_scratch_bytes("pptr", count * sizeof(uint8_t *))
        m.plen = <uint64_t *>_scratch_bytes("plen", count * sizeof(uint64_t))
        for i in range(n):
            m.pptr[i] = <const uint8_t *>PyBytes_AS_STRING(prop_list[i])
            m.plen[i] = PyBytes_GET_SIZE(prop_list[i])
    if meta_list is not None:
        m.keep.append(meta_list)
        m.mptr = <const uint8_t **>_scratch_bytes("mptr", count * sizeof(uint8_t *))
        m.mlen = <uint64_t *>_scratch_bytes("mlen", count * sizeof(uint64_t))
        for i in range(n):
            m.mptr[i] = <const uint8_t *>PyBytes_AS_STRING(meta_list[i])
            m.mlen[i] = PyBytes_GET_SIZE(meta_list[i])
    return m


cdef void write_entry(uint8_t *out, Messages m, Py_ssize_t i0, Py_ssize_t i1, uint8_t marker,
                      uint64_t txn_msb, uint64_t txn_lsb, uint64_t producer_id,
                      uint64_t sequence_id, int64_t publish_time, size_t total) noexcept nogil:
    put_magic(out)
    out[4] = 1
    out[5] = marker
    out[6] = 1 if m.mptr != NULL else 0  # FLAG_METADATA
    out[7] = 0
    put_u64(out + 8, txn_msb)
    put_u64(out + 16, txn_lsb)
    put_u64(out + 24, producer_id)
    put_u64(out + 32, sequence_id)
    put_u64(out + 40, <uint64_t>publish_time)
    put_u32(out + 48, <uint32_t>(i1 - i0))
    cdef uint8_t *p = out + ENTRY_HEADER_SIZE
    cdef Py_ssize_t i
    cdef const uint8_t *vp
    cdef uint64_t vl
    for i in range(i0, i1):
        if m.kptr == NULL or m.klen[i] < 0:
            put_u32(p, NO_KEY)
            p += 4
        else:
            put_u32(p, <uint32_t>m.klen[i])
            p += 4
            memcpy(p, m.kptr[i], m.klen[i])
            p += m.klen[i]
        if m.pptr == NULL:
            put_u32(p, 0)
            p += 4
        else:
            memcpy(p, m.pptr[i], m.plen[i])
            p += m.plen[i]
        m.value(i, &vp, &vl)
        put_u32(p, <uint32_t>vl)
        p += 4
        memcpy(p, vp, vl)
        p += vl
        if m.mptr != NULL:
            memcpy(p, m.mptr[i], m.mlen[i])
            p += m.mlen[i]
    cdef uint32_t crc = ptx_crc32c(0, out, 52)
    crc = ptx_crc32c(crc, out + ENTRY_HEADER_SIZE, total - ENTRY_HEADER_SIZE)
    put_u32(out + 52, crc)


cdef bytes _encodeentry_range(Messages m, Py_ssize_t i0, Py_ssize_t i1, uint8_t marker,
                         uint64_t txn_msb, uint64_t txn_lsb, uint64_t producer_id,
                         uint64_t sequence_id, int64_t publish_time):
    cdef size_t total = ENTRY_HEADER_SIZE
    cdef Py_ssize_t i
    for i in range(i0, i1):
        total += m.size(i)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t *buf = <uint8_t *>PyBytes_AS_STRING(out)
    with nogil:
        write_entry(buf, m, i0, i1, marker, txn_msb, txn_lsb, producer_id, sequence_id,
                    publish_time, total)
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def value_sizes(values):
    """int64 sizes of a list of bytes or a pyarrow binary/string array (TypeError otherwise)."""
    arrow = arrow_binary(values)
    if arrow is not None:
        return np.diff(arrow[0]).astype(np.int64)
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"values must be a list of bytes or a pyarrow array, not {type(values).__name__}")
    cdef Py_ssize_t i, n = len(values)
    out = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] sizes = out
    cdef object v
    for i in range(n):
        v = values[i]
        if PyBytes_Check(v):
            sizes[i] = PyBytes_GET_SIZE(v)
        elif isinstance(v, (bytearray, memoryview)):
            sizes[i] = len(v)
        else:
            raise TypeError(f"values[{i}] must be bytes, not {type(v).__name__}")
    return out


def encode_entry(values, keys=None, properties=None, *, txn_msb=0, txn_lsb=0, producer_id=0,
                 sequence_id=0, publish_time=0, marker_type=0, metadata=None) -> bytes:
    """One entry holding every message of `values` (a marker entry holds zero or one)."""
    if not header_ints_plain(txn_msb, txn_lsb, producer_id, sequence_id, publish_time, marker_type):
        check_header_ints(txn_msb, txn_lsb, producer_id, sequence_id, publish_time, marker_type)
    cdef Messages m = gather(values, keys, properties, metadata)
    if m.n > 0xFFFFFFFF:
        raise ValueError(f"{m.n} messages do not fit one entry")
    return _encodeentry_range(m, 0, m.n, marker_type, txn_msb, txn_lsb, producer_id, sequence_id,
                         publish_time)


def encode_entries(values, keys=None, properties=None, *, batch_size=1000,
                   max_entry_bytes=DEFAULT_MAX_ENTRY_BYTES, txn_msb=0, txn_lsb=0, producer_id=0,
                   first_sequence_id=0, publish_time=0, metadata=None) -> list:
    """Split a bulk of messages into consecutive entries of at most batch_size messages and
    (unless one message alone is larger) max_entry_bytes bytes; sequence ids run on."""
    if not header_ints_plain(txn_msb, txn_lsb, producer_id, first_sequence_id, publish_time, 0):
        check_header_ints(txn_msb, txn_lsb, producer_id, first_sequence_id, publish_time, 0)
    check_bulk(batch_size, max_entry_bytes, first_sequence_id, 1)
    cdef Messages m = gather(values, keys, properties, metadata)
    check_bulk(batch_size, max_entry_bytes, first_sequence_id, m.n)
    cdef list out = []
    cdef Py_ssize_t i0 = 0, i
    cdef uint64_t seq = first_sequence_id
    while i0 < m.n:
        i = entry_end(m, i0, batch_size, max_entry_bytes, NULL)
        out.append(_encodeentry_range(m, i0, i, 0, txn_msb, txn_lsb, producer_id, seq, publish_time))
        seq += <uint64_t>(i - i0)
        i0 = i
    return out


cdef Py_ssize_t entry_end(Messages m, Py_ssize_t i0, Py_ssize_t limit, uint64_t cap,
                          uint64_t *total) noexcept:
    """Where the entry starting at message i0 ends: at most `limit` messages and `cap` bytes
    (a single larger message goes alone)."""
    cdef uint64_t bytes_now = ENTRY_HEADER_SIZE, size
    cdef Py_ssize_t i = i0
    while i < m.n and i - i0 < limit:
        size = m.size(i)
        if i > i0 and bytes_now + size > cap:
            break
        bytes_now += size
        i += 1
    if total != NULL:
        total[0] = bytes_now
    return i
