# cython: language_level=3
"""The entry codec: entries to bytes and back (format: entryformat.py).

Encoding gathers pointers to every message's bytes once (values from a list of bytes or
straight from a pyarrow array's buffers), then writes whole entries with memcpy and CRC-32C
without the GIL. Decoding validates every length against the bytes that are left (never
reading out of bounds), sizes the output in a first pass and fills numpy columns in a second,
both without the GIL. The entry log's bulk append cimports the encoder (entrycodec.pxd).
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy

from .includes.crc32c cimport ptx_crc32c, ptx_crc32c_hardware, ptx_crc32c_init

import threading

import numpy as np

from pulsartxn.errors import CorruptEntry

from .checks import as_entry_ids, check_bulk
from .entryformat import (
    DEFAULT_MAX_ENTRY_BYTES,
    HEADER_SIZE,
    REASONS,
    DecodedEntries,
    EntryHeader,
    arrow_binary,
    check_header_ints,
    normalize_keys,
    normalize_properties,
)

ptx_crc32c_init()

CRC32C_HARDWARE = bool(ptx_crc32c_hardware())
cdef const uint8_t *MAGIC = <const uint8_t *>b"PTXE"
cdef uint8_t EMPTY[1]


# -- little-endian fields -------------------------------------------------------------------

cdef inline void put_u32(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = (v >> 24) & 0xFF


cdef inline void put_u64(uint8_t *p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = (v >> (8 * i)) & 0xFF


cdef inline uint32_t get_u32(const uint8_t *p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint64_t get_u64(const uint8_t *p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


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
cdef Messages gather(values, keys, properties):
    cdef Messages m = Messages.__new__(Messages)
    cdef Py_ssize_t i, n
    cdef const int32_t[::1] o32
    cdef const int64_t[::1] o64
    cdef const uint8_t[::1] data
    cdef object v
    cdef size_t count
    m.keep = []
    arrow = arrow_binary(values)
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
    return m


cdef void write_entry(uint8_t *out, Messages m, Py_ssize_t i0, Py_ssize_t i1, uint8_t marker,
                      uint64_t txn_msb, uint64_t txn_lsb, uint64_t producer_id,
                      uint64_t sequence_id, int64_t publish_time, size_t total) noexcept nogil:
    memcpy(out, MAGIC, 4)
    out[4] = 1
    out[5] = marker
    out[6] = 0
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
                 sequence_id=0, publish_time=0, marker_type=0) -> bytes:
    """One entry holding every message of `values` (a marker entry holds zero or one)."""
    check_header_ints(txn_msb, txn_lsb, producer_id, sequence_id, publish_time, marker_type)
    cdef Messages m = gather(values, keys, properties)
    if m.n > 0xFFFFFFFF:
        raise ValueError(f"{m.n} messages do not fit one entry")
    return _encodeentry_range(m, 0, m.n, marker_type, txn_msb, txn_lsb, producer_id, sequence_id,
                         publish_time)


def encode_entries(values, keys=None, properties=None, *, batch_size=1000,
                   max_entry_bytes=DEFAULT_MAX_ENTRY_BYTES, txn_msb=0, txn_lsb=0, producer_id=0,
                   first_sequence_id=0, publish_time=0) -> list:
    """Split a bulk of messages into consecutive entries of at most batch_size messages and
    (unless one message alone is larger) max_entry_bytes bytes; sequence ids run on."""
    check_header_ints(txn_msb, txn_lsb, producer_id, first_sequence_id, publish_time, 0)
    check_bulk(batch_size, max_entry_bytes, first_sequence_id, 1)
    cdef Messages m = gather(values, keys, properties)
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


# -- decoding -------------------------------------------------------------------------------

cdef struct _Totals:
    uint64_t messages
    uint64_t key_bytes
    uint64_t value_bytes
    uint64_t pairs
    uint64_t pkey_bytes
    uint64_t pval_bytes


cdef int _check_entry(const uint8_t *p, uint64_t size, bint verify, _Totals *t) noexcept nogil:
    """0 when the entry is well formed (adding its sizes to t), else a REASONS code."""
    if size < ENTRY_HEADER_SIZE:
        return 1
    if memcmp(p, MAGIC, 4) != 0:
        return 2
    if p[4] != 1:
        return 3
    if p[6] != 0 or p[7] != 0:
        return 4
    cdef uint32_t crc
    if verify:
        crc = ptx_crc32c(0, p, 52)
        crc = ptx_crc32c(crc, p + ENTRY_HEADER_SIZE, size - ENTRY_HEADER_SIZE)
        if crc != get_u32(p + 52):
            return 5
    cdef uint64_t count = get_u32(p + 48)
    cdef uint64_t pos = ENTRY_HEADER_SIZE, n, k, pairs
    cdef uint64_t j
    if count * 12 > size - ENTRY_HEADER_SIZE:
        return 8
    for j in range(count):
        if size - pos < 4:
            return 6
        n = get_u32(p + pos)
        pos += 4
        if n != NO_KEY:
            if n > size - pos:
                return 6
            pos += n
            t.key_bytes += n
        if size - pos < 4:
            return 6
        pairs = get_u32(p + pos)
        pos += 4
        if pairs * 8 > size - pos:
            return 6
        for k in range(pairs):
            # Every u32 read is preceded by a check that its 4 bytes are there: the bound on
            # pairs above limits only their total, not where one pair's lengths end.
            if size - pos < 4:
                return 6
            n = get_u32(p + pos)
            pos += 4
            if n > size - pos or size - pos - n < 4:
                return 6
            pos += n
            t.pkey_bytes += n
            n = get_u32(p + pos)
            pos += 4
            if n > size - pos:
                return 6
            pos += n
            t.pval_bytes += n
        t.pairs += pairs
        if size - pos < 4:
            return 6
        n = get_u32(p + pos)
        pos += 4
        if n > size - pos:
            return 6
        pos += n
        t.value_bytes += n
    if pos != size:
        return 7
    t.messages += count
    return 0


def decode_header(buf, verify=True):
    """The EntryHeader of one entry (with verify, the whole entry is checked first)."""
    cdef Py_buffer view
    cdef _Totals t
    cdef int code
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        p = <const uint8_t *>view.buf
        t.messages = t.key_bytes = t.value_bytes = t.pairs = t.pkey_bytes = t.pval_bytes = 0
        if verify:
            code = _check_entry(p, view.len, True, &t)
        elif view.len < ENTRY_HEADER_SIZE:
            code = 1
        elif memcmp(p, MAGIC, 4) != 0:
            code = 2
        else:
            code = 0
        if code:
            raise CorruptEntry(f"entry: {REASONS[code]}")
        return EntryHeader(p[5], get_u64(p + 8), get_u64(p + 16), get_u64(p + 24),
                           get_u64(p + 32), <int64_t>get_u64(p + 40), get_u32(p + 48))
    finally:
        PyBuffer_Release(&view)


@cython.boundscheck(False)
@cython.wraparound(False)
def header_columns(buffers):
    """(message_count int64, marker_type uint8, txn_msb uint64, txn_lsb uint64) from each
    entry's header, without decoding its messages or checking its checksum (recovery scans
    read only these). A buffer too short for a header, or without the magic, raises
    CorruptEntry naming its index in `buffers`."""
    if not isinstance(buffers, (list, tuple)):
        buffers = list(buffers)
    cdef Py_ssize_t n = len(buffers), i, length
    counts = np.empty(n, np.int64)
    markers = np.empty(n, np.uint8)
    msb = np.empty(n, np.uint64)
    lsb = np.empty(n, np.uint64)
    cdef int64_t[::1] c = counts
    cdef uint8_t[::1] m = markers
    cdef uint64_t[::1] hi = msb
    cdef uint64_t[::1] lo = lsb
    cdef Py_buffer view
    cdef const uint8_t *p
    cdef int bad
    for i in range(n):
        PyObject_GetBuffer(buffers[i], &view, PyBUF_SIMPLE)
        p = <const uint8_t *>view.buf
        length = view.len
        bad = 1 if length < ENTRY_HEADER_SIZE else (2 if memcmp(p, MAGIC, 4) != 0 else 0)
        if not bad:
            c[i] = get_u32(p + 48)
            m[i] = p[5]
            hi[i] = get_u64(p + 8)
            lo[i] = get_u64(p + 16)
        PyBuffer_Release(&view)
        if bad:
            raise CorruptEntry(f"entry {i} of the scan: {REASONS[bad]}")
    return counts, markers, msb, lsb


@cython.boundscheck(False)
@cython.wraparound(False)
def decode_entries(entry_ids, buffers, verify=True) -> DecodedEntries:
    """Decode entries into columns. Any malformed entry raises CorruptEntry naming its id."""
    ids_arr = as_entry_ids(entry_ids)
    if not isinstance(buffers, (list, tuple)):
        buffers = list(buffers)
    cdef Py_ssize_t ne = len(buffers)
    if ids_arr.shape[0] != ne:
        raise ValueError(f"{ids_arr.shape[0]} entry ids for {ne} buffers")
    cdef Py_buffer *views = <Py_buffer *>calloc(ne if ne else 1, sizeof(Py_buffer))
    if views == NULL:
        raise MemoryError()
    cdef Py_ssize_t acquired = 0, e
    cdef _Totals t
    cdef int code = 0
    cdef Py_ssize_t bad = -1
    cdef bint do_verify = bool(verify)
    try:
        for e in range(ne):
            PyObject_GetBuffer(buffers[e], &views[e], PyBUF_SIMPLE)
            acquired += 1
        t.messages = t.key_bytes = t.value_bytes = t.pairs = t.pkey_bytes = t.pval_bytes = 0
        with nogil:
            for e in range(ne):
                code = _check_entry(<const uint8_t *>views[e].buf, views[e].len, do_verify, &t)
                if code:
                    bad = e
                    break
        if code:
            raise CorruptEntry(f"entry {int(ids_arr[bad])}: {REASONS[code]}")
        return _fill(views, ne, ids_arr, &t)
    finally:
        for e in range(acquired):
            PyBuffer_Release(&views[e])
        free(views)


cdef uint8_t *_data_ptr(object arr) except? NULL:
    cdef uint8_t[::1] view = arr
    if view.shape[0] == 0:
        return EMPTY
    return &view[0]


@cython.boundscheck(False)
@cython.wraparound(False)
cdef object _fill(Py_buffer *views, Py_ssize_t ne, ids_arr, _Totals *t):
    cdef Py_ssize_t nm = t.messages
    a = {
        "entry_id": np.ascontiguousarray(ids_arr, dtype=np.uint64),
        "txn_msb": np.empty(ne, np.uint64), "txn_lsb": np.empty(ne, np.uint64),
        "producer_id": np.empty(ne, np.uint64), "sequence_id": np.empty(ne, np.uint64),
        "publish_time": np.empty(ne, np.int64), "marker_type": np.empty(ne, np.uint8),
        "message_count": np.empty(ne, np.uint32), "first_message": np.empty(ne, np.int64),
        "msg_entry": np.empty(nm, np.int64), "batch_index": np.empty(nm, np.int32),
        "key_offsets": np.empty(nm + 1, np.int64), "key_data": np.empty(t.key_bytes, np.uint8),
        "key_valid": np.empty(nm, np.bool_),
        "value_offsets": np.empty(nm + 1, np.int64), "value_data": np.empty(t.value_bytes, np.uint8),
        "prop_offsets": np.empty(nm + 1, np.int64),
        "prop_key_offsets": np.empty(t.pairs + 1, np.int64),
        "prop_key_data": np.empty(t.pkey_bytes, np.uint8),
        "prop_value_offsets": np.empty(t.pairs + 1, np.int64),
        "prop_value_data": np.empty(t.pval_bytes, np.uint8),
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
    cdef uint64_t j, k, count, pairs, n, pos
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
            txn_msb[e] = get_u64(p + 8)
            txn_lsb[e] = get_u64(p + 16)
            producer[e] = get_u64(p + 24)
            sequence[e] = get_u64(p + 32)
            publish[e] = <int64_t>get_u64(p + 40)
            count = get_u32(p + 48)
            mcount[e] = <uint32_t>count
            first[e] = m
            pos = ENTRY_HEADER_SIZE
            for j in range(count):
                msg_entry[m] = e
                batch_index[m] = <int32_t>j
                n = get_u32(p + pos)
                pos += 4
                if n == NO_KEY:
                    key_valid[m] = 0
                else:
                    key_valid[m] = 1
                    memcpy(key_data + kb, p + pos, n)
                    kb += n
                    pos += n
                key_off[m + 1] = kb
                pairs = get_u32(p + pos)
                pos += 4
                for k in range(pairs):
                    n = get_u32(p + pos)
                    pos += 4
                    memcpy(pk_data + pkb, p + pos, n)
                    pkb += n
                    pos += n
                    pk_off[pair + 1] = pkb
                    n = get_u32(p + pos)
                    pos += 4
                    memcpy(pv_data + pvb, p + pos, n)
                    pvb += n
                    pos += n
                    pv_off[pair + 1] = pvb
                    pair += 1
                prop_off[m + 1] = pair
                n = get_u32(p + pos)
                pos += 4
                memcpy(val_data + vb, p + pos, n)
                vb += n
                pos += n
                val_off[m + 1] = vb
                m += 1
    return DecodedEntries(**a)
