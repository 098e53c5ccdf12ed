# cython: language_level=3
"""AbortSet: the aborted TxnIDs of one partition, probed for every entry dispatch reads.

An open-addressing hash set of 128-bit keys in C (csrc/u128set.c). ``contains_many`` tests a
whole read batch's transaction ids at once without the GIL.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from .includes.u128set cimport (
    ptx_u128,
    ptx_u128set_add,
    ptx_u128set_capacity,
    ptx_u128set_clear,
    ptx_u128set_contains,
    ptx_u128set_contains_many,
    ptx_u128set_discard,
    ptx_u128set_dump,
    ptx_u128set_free,
    ptx_u128set_init,
    ptx_u128set_len,
    ptx_u128set_prune_below,
    ptx_u128set_reserve,
)
from .txnid cimport TxnID, txnid_from_halves

from .checks import as_uint64_array

import operator

import numpy as np

MAGIC = b"PTAS"
VERSION = 1
cdef enum:
    _HEADER = 16  # magic, version, 3 reserved bytes, u64 little-endian count
_MAX_SEQUENCE = (1 << 112) - 1


cdef inline void _put_be64(uint8_t *p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = (v >> (56 - 8 * i)) & 0xFF


cdef inline uint64_t _get_be64(const uint8_t *p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return v


cdef inline TxnID _txnid(object value, str what):
    if not isinstance(value, TxnID):
        raise TypeError(f"{what} takes a TxnID, not {type(value).__name__} ({value!r})")
    return <TxnID>value


cdef class AbortSet:
    """A set of TxnIDs: add, discard, in, len, iteration, bulk probes, pruning, snapshots."""

    def __cinit__(self):
        ptx_u128set_init(&self._set)
        self._version = 0

    def __dealloc__(self):
        ptx_u128set_free(&self._set)

    def __init__(self, members=()):
        for txn in members:
            self.add(txn)

    cdef bint contains_halves(self, uint64_t msb, uint64_t lsb) noexcept nogil:
        return ptx_u128set_contains(&self._set, msb, lsb)

    def add(self, txn) -> None:
        cdef TxnID t = _txnid(txn, "AbortSet.add")
        if ptx_u128set_add(&self._set, t.most_sig_bits, t.least_sig_bits) < 0:
            raise MemoryError(f"AbortSet cannot grow past {len(self)} members")
        self._version += 1

    def discard(self, txn) -> None:
        cdef TxnID t = _txnid(txn, "AbortSet.discard")
        ptx_u128set_discard(&self._set, t.most_sig_bits, t.least_sig_bits)
        self._version += 1

    def remove(self, txn) -> None:
        cdef TxnID t = _txnid(txn, "AbortSet.remove")
        if not ptx_u128set_discard(&self._set, t.most_sig_bits, t.least_sig_bits):
            raise KeyError(txn)
        self._version += 1

    def update(self, members) -> None:
        for txn in members:
            self.add(txn)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def add_many(self, msb, lsb) -> None:
        """Add the TxnIDs given as two arrays of 64-bit halves."""
        hi_arr = as_uint64_array(msb, "msb")
        lo_arr = as_uint64_array(lsb, "lsb")
        if hi_arr.shape[0] != lo_arr.shape[0]:
            raise ValueError(f"msb and lsb differ in length: {hi_arr.shape[0]} != {lo_arr.shape[0]}")
        cdef const uint64_t[::1] hi = hi_arr
        cdef const uint64_t[::1] lo = lo_arr
        cdef Py_ssize_t i, n = hi.shape[0]
        cdef int failed = 0
        if ptx_u128set_reserve(&self._set, ptx_u128set_len(&self._set) + <size_t>n) != 0:
            raise MemoryError(f"AbortSet cannot grow by {n} members")
        with nogil:
            for i in range(n):
                if ptx_u128set_add(&self._set, hi[i], lo[i]) < 0:
                    failed = 1
                    break
        self._version += 1
        if failed:
            raise MemoryError(f"AbortSet cannot grow by {n} members")

    def __contains__(self, txn) -> bool:
        if not isinstance(txn, TxnID):
            return False
        return ptx_u128set_contains(&self._set, (<TxnID>txn).most_sig_bits, (<TxnID>txn).least_sig_bits)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def contains_many(self, msb, lsb):
        """Bool mask: mask[i] is whether TxnID(msb[i], lsb[i]) halves are a member.

        msb, lsb: equal-length integer arrays of the two 64-bit halves (signed halves are
        reinterpreted as unsigned). Runs without the GIL.
        """
        hi_arr = as_uint64_array(msb, "msb")
        lo_arr = as_uint64_array(lsb, "lsb")
        if hi_arr.shape[0] != lo_arr.shape[0]:
            raise ValueError(f"msb and lsb differ in length: {hi_arr.shape[0]} != {lo_arr.shape[0]}")
        cdef Py_ssize_t n = hi_arr.shape[0]
        out = np.empty(n, dtype=np.bool_)
        if n == 0:
            return out
        cdef const uint64_t[::1] hi = hi_arr
        cdef const uint64_t[::1] lo = lo_arr
        cdef uint8_t[::1] mask = out.view(np.uint8)
        with nogil:
            ptx_u128set_contains_many(&self._set, &hi[0], &lo[0], <size_t>n, &mask[0])
        return out

    def prune_below(self, coordinator_id, low_watermark) -> int:
        """Drop coordinator_id's TxnIDs whose sequence is below low_watermark; return how many.

        A coordinator's low watermark says every transaction below it has ended everywhere, so
        a partition no longer needs to remember those aborts once their entries are trimmed.
        """
        c = operator.index(coordinator_id)
        w = operator.index(low_watermark)
        if not 0 <= c <= 0xFFFF:
            raise ValueError(f"coordinator_id {c} out of range 0..65535")
        if not 0 <= w <= _MAX_SEQUENCE + 1:
            raise ValueError(f"low_watermark {w} out of range 0..2^112")
        cdef uint64_t bound_hi, bound_lo
        if w > _MAX_SEQUENCE:
            # Everything of the coordinator is below: use a bound above every sequence.
            bound_hi = (<uint64_t>1 << 48)
            bound_lo = 0
        else:
            bound_hi = w >> 64
            bound_lo = w & 0xFFFFFFFFFFFFFFFF
        cdef size_t removed = ptx_u128set_prune_below(&self._set, <uint64_t>c, bound_hi, bound_lo)
        if removed == <size_t>-1:
            raise MemoryError("AbortSet.prune_below could not allocate the rebuilt table")
        if removed:
            self._version += 1
        return removed

    def clear(self) -> None:
        ptx_u128set_clear(&self._set)
        self._version += 1

    def __len__(self):
        return ptx_u128set_len(&self._set)

    def __bool__(self):
        return ptx_u128set_len(&self._set) > 0

    def __iter__(self):
        cdef Py_ssize_t version = self._version
        cdef size_t i, capacity
        if self._set.has_zero:
            yield txnid_from_halves(0, 0)
            if self._version != version:
                raise RuntimeError("AbortSet changed during iteration")
        capacity = ptx_u128set_capacity(&self._set)
        for i in range(capacity):
            if self._version != version:
                raise RuntimeError("AbortSet changed during iteration")
            if self._set.slots[i].hi | self._set.slots[i].lo:
                yield txnid_from_halves(self._set.slots[i].hi, self._set.slots[i].lo)

    def to_arrays(self):
        """Every member as (msb, lsb) uint64 arrays, sorted ascending."""
        cdef size_t n = ptx_u128set_len(&self._set)
        pairs = np.empty((n, 2), dtype=np.uint64)
        cdef uint64_t[:, ::1] view = pairs
        if n:
            with nogil:
                ptx_u128set_dump(&self._set, <ptx_u128 *>&view[0, 0], 1)
        return np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])

    def to_bytes(self) -> bytes:
        """Canonical snapshot: b"PTAS", version, u64 LE count, then sorted 16-byte BE TxnIDs."""
        cdef size_t n = ptx_u128set_len(&self._set)
        cdef ptx_u128 *pairs = <ptx_u128 *>malloc((n if n else 1) * sizeof(ptx_u128))
        if pairs == NULL:
            raise MemoryError(f"AbortSet.to_bytes: no memory for {n} members")
        cdef bytes out
        cdef uint8_t *p
        cdef size_t i
        try:
            out = PyBytes_FromStringAndSize(NULL, _HEADER + 16 * n)
            p = <uint8_t *>PyBytes_AS_STRING(out)
            p[0] = 80; p[1] = 84; p[2] = 65; p[3] = 83  # b"PTAS"
            p[4] = VERSION
            p[5] = p[6] = p[7] = 0
            with nogil:
                for i in range(8):
                    p[8 + i] = (n >> (8 * i)) & 0xFF
                ptx_u128set_dump(&self._set, pairs, 1)
                for i in range(n):
                    _put_be64(p + _HEADER + 16 * i, pairs[i].hi)
                    _put_be64(p + _HEADER + 16 * i + 8, pairs[i].lo)
        finally:
            free(pairs)
        return out

    @classmethod
    def from_bytes(cls, data):
        """The AbortSet of a to_bytes() snapshot; ValueError names what is wrong with it."""
        cdef const uint8_t[::1] view
        try:
            view = memoryview(data).cast("B")
        except TypeError:
            raise TypeError(f"AbortSet.from_bytes takes bytes, not {type(data).__name__}") from None
        cdef Py_ssize_t size = view.shape[0]
        if size < _HEADER or bytes(view[:4]) != MAGIC:
            raise ValueError("not an AbortSet snapshot: bad magic or too short")
        if view[4] != VERSION:
            raise ValueError(f"AbortSet snapshot version {view[4]} not supported (expected {VERSION})")
        cdef uint64_t n = 0
        cdef int i
        for i in range(8):
            n |= (<uint64_t>view[8 + i]) << (8 * i)
        if n > <uint64_t>((size - _HEADER) // 16) or <Py_ssize_t>(_HEADER + 16 * n) != size:
            raise ValueError(f"AbortSet snapshot of {size} bytes cannot hold {n} members")
        cdef AbortSet result = cls()
        if ptx_u128set_reserve(&result._set, <size_t>n) != 0:
            raise MemoryError(f"AbortSet.from_bytes: no memory for {n} members")
        cdef const uint8_t *p = &view[0]
        cdef size_t k
        cdef int failed = 0
        with nogil:
            for k in range(n):
                if ptx_u128set_add(&result._set, _get_be64(p + _HEADER + 16 * k),
                                   _get_be64(p + _HEADER + 16 * k + 8)) < 0:
                    failed = 1
                    break
        if failed:
            raise MemoryError(f"AbortSet.from_bytes: no memory for {n} members")
        return result

    def copy(self):
        return AbortSet.from_bytes(self.to_bytes())

    def memory_bytes(self) -> int:
        """Bytes held by the table (for stats)."""
        return ptx_u128set_capacity(&self._set) * sizeof(ptx_u128)

    def __eq__(self, other):
        if not isinstance(other, AbortSet):
            return NotImplemented
        if len(self) != len(other):
            return False
        return all(txn in other for txn in self)

    __hash__ = None

    def __reduce__(self):
        return (AbortSet.from_bytes, (self.to_bytes(),))

    def __repr__(self):
        return f"AbortSet(<{len(self)} TxnIDs>)"
