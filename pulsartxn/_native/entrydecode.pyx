# cython: language_level=3
"""The entry decoder: entries back to columns (format: entryformat.py; encoding: entrycodec.pyx).

Decoding validates every length against the bytes that are left (never reading out of
bounds), sizes the output in a first pass and fills numpy columns in a second, both without
the GIL. Recovery scans read only the headers (header_columns).
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from .entrycodec cimport ENTRY_HEADER_SIZE, NO_KEY, get_u32, get_u64, has_magic
from .includes.crc32c cimport ptx_crc32c, ptx_crc32c_init

import numpy as np

from pulsartxn.errors import CorruptEntry

from .checks import as_entry_ids
from .entryformat import REASONS, DecodedEntries, EntryHeader

ptx_crc32c_init()

cdef uint8_t EMPTY[1]


cdef struct _Totals:
    uint64_t messages
    uint64_t key_bytes
    uint64_t value_bytes
    uint64_t pairs
    uint64_t pkey_bytes
    uint64_t pval_bytes
    uint64_t meta_entries     # entries with FLAG_METADATA
    uint64_t okey_bytes


cdef int _check_entry(const uint8_t *p, uint64_t size, bint verify, _Totals *t) noexcept nogil:
    """0 when the entry is well formed (adding its sizes to t), else a REASONS code."""
    if size < ENTRY_HEADER_SIZE:
        return 1
    if not has_magic(p):
        return 2
    if p[4] != 1:
        return 3
    if (p[6] & ~1) != 0 or p[7] != 0:  # FLAG_METADATA alone is known
        return 4
    cdef bint meta = p[6] & 1
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
        if meta:
            if size - pos < 20:
                return 6
            n = get_u32(p + pos + 16)
            pos += 20
            if n != NO_KEY:
                if n > size - pos:
                    return 6
                pos += n
                t.okey_bytes += n
    if pos != size:
        return 7
    t.messages += count
    t.meta_entries += meta
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
        t.meta_entries = t.okey_bytes = 0
        if verify:
            code = _check_entry(p, view.len, True, &t)
        elif view.len < ENTRY_HEADER_SIZE:
            code = 1
        elif not has_magic(p):
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
        bad = 1 if length < ENTRY_HEADER_SIZE else (2 if not has_magic(p) else 0)
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
        t.meta_entries = t.okey_bytes = 0
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


cdef inline uint64_t _copy_field(const uint8_t *p, uint64_t pos, uint8_t *out,
                                 int64_t *filled) noexcept nogil:
    """Copy the length-prefixed field at p + pos (checked by _check_entry) to out + filled,
    moving filled past it; the position after the field."""
    cdef uint64_t n = get_u32(p + pos)
    memcpy(out + filled[0], p + pos + 4, n)
    filled[0] += n
    return pos + 4 + n


cdef uint8_t *_data_ptr(object arr) except? NULL:
    cdef uint8_t[::1] view = arr
    if view.shape[0] == 0:
        return EMPTY
    return &view[0]


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.initializedcheck(False)
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
    cdef bint with_meta = t.meta_entries > 0
    if with_meta:
        a.update(event_time=np.empty(nm, np.int64), deliver_at=np.empty(nm, np.int64),
                 okey_offsets=np.empty(nm + 1, np.int64),
                 okey_data=np.empty(t.okey_bytes, np.uint8), okey_valid=np.empty(nm, np.bool_))
    # Without metadata these views stay unbound (and are never touched): no cost to acquire.
    cdef int64_t[::1] event_time, deliver_at, okey_off
    cdef uint8_t[::1] okey_valid
    cdef uint8_t *okey_data = EMPTY
    if with_meta:
        event_time = a["event_time"]
        deliver_at = a["deliver_at"]
        okey_off = a["okey_offsets"]
        okey_valid = a["okey_valid"].view(np.uint8)
        okey_data = _data_ptr(a["okey_data"])
    cdef int64_t ob = 0
    cdef bint meta
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
        if with_meta:
            okey_off[0] = 0
        for e in range(ne):
            p = <const uint8_t *>views[e].buf
            meta = p[6] & 1
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
                    pos = _copy_field(p, pos, pk_data, &pkb)
                    pk_off[pair + 1] = pkb
                    pos = _copy_field(p, pos, pv_data, &pvb)
                    pv_off[pair + 1] = pvb
                    pair += 1
                prop_off[m + 1] = pair
                pos = _copy_field(p, pos, val_data, &vb)
                val_off[m + 1] = vb
                if with_meta:
                    if meta:
                        event_time[m] = <int64_t>get_u64(p + pos)
                        deliver_at[m] = <int64_t>get_u64(p + pos + 8)
                        n = get_u32(p + pos + 16)
                        pos += 20
                        okey_valid[m] = n != NO_KEY
                        if n != NO_KEY:
                            memcpy(okey_data + ob, p + pos, n)
                            ob += n
                            pos += n
                    else:
                        event_time[m] = 0
                        deliver_at[m] = 0
                        okey_valid[m] = 0
                    okey_off[m + 1] = ob
                m += 1
    return DecodedEntries(**a)
