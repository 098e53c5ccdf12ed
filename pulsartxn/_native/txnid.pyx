# cython: language_level=3
"""TxnID, the 128-bit transaction id, and the per-coordinator allocator of sequences.

Layout (API.md): the highest 16 bits hold the coordinator id, the other 112 bits a sequence.
Held as two unsigned 64-bit halves: ``most_sig_bits = coordinator << 48 | sequence >> 64`` and
``least_sig_bits = sequence & (2^64 - 1)``, as Pulsar's TxnID is two longs.
"""

cimport cython
from libc.stdint cimport uint8_t, uint64_t

import sys

import numpy as np

from .checks import as_int
from ..errors import excerpt

MAX_COORDINATOR = 0xFFFF
MAX_SEQUENCE = (1 << 112) - 1
_MASK64 = (1 << 64) - 1

cdef uint64_t LOW48 = (<uint64_t>1 << 48) - 1
cdef uint64_t HASH_MODULUS = (<uint64_t>1 << 61) - 1
# TxnID hashes like int(txn_id); the C shortcut holds where Python's int hash is mod 2^61 - 1.
cdef bint C_HASH = sys.hash_info.modulus == (1 << 61) - 1


cdef TxnID txnid_from_halves(uint64_t msb, uint64_t lsb):
    cdef TxnID t = TxnID.__new__(TxnID)
    t.most_sig_bits = msb
    t.least_sig_bits = lsb
    return t


cdef class TxnID:
    """A transaction id: TxnID(coordinator_id, sequence). Immutable, ordered, hashable."""

    def __init__(self, coordinator_id, sequence):
        c = as_int(coordinator_id, "coordinator_id")
        s = as_int(sequence, "sequence")
        if not 0 <= c <= MAX_COORDINATOR:
            raise ValueError(f"coordinator_id {c} out of range 0..65535")
        if not 0 <= s <= MAX_SEQUENCE:
            raise ValueError(f"sequence {s} out of range 0..2^112-1")
        self.most_sig_bits = (c << 48) | (s >> 64)
        self.least_sig_bits = s & _MASK64

    @property
    def coordinator_id(self) -> int:
        return self.most_sig_bits >> 48

    @property
    def sequence(self) -> int:
        return ((<object>(self.most_sig_bits & LOW48)) << 64) | self.least_sig_bits

    @classmethod
    def from_int(cls, value):
        """The TxnID whose 128-bit integer is value (0 <= value < 2^128)."""
        v = as_int(value, "value")
        if not 0 <= v < (1 << 128):
            raise ValueError(f"TxnID integer {v} out of range 0..2^128-1")
        return txnid_from_halves(v >> 64, v & _MASK64)

    @classmethod
    def from_halves(cls, most_sig_bits, least_sig_bits):
        """The TxnID of two unsigned 64-bit halves (Pulsar's mostSigBits, leastSigBits)."""
        hi = as_int(most_sig_bits, "most_sig_bits")
        lo = as_int(least_sig_bits, "least_sig_bits")
        if not 0 <= hi <= _MASK64:
            raise ValueError(f"most_sig_bits {hi} out of range 0..2^64-1")
        if not 0 <= lo <= _MASK64:
            raise ValueError(f"least_sig_bits {lo} out of range 0..2^64-1")
        return txnid_from_halves(hi, lo)

    @classmethod
    def parse(cls, text):
        """Parse "<coordinator_id>:<sequence>" (decimal), the form str() gives."""
        if not isinstance(text, str):
            raise TypeError(f"TxnID.parse takes a str, not {type(text).__name__} ({excerpt(text)})")
        parts = text.split(":")
        if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError(
                f"not a TxnID: {excerpt(text)} (expected '<coordinator_id>:<sequence>')"
            )
        return cls(int(parts[0]), int(parts[1]))

    def pack(self) -> bytes:
        """16 bytes, big-endian: the 128-bit integer, so bytes order as TxnIDs do."""
        cdef uint8_t buf[16]
        cdef int i
        for i in range(8):
            buf[i] = (self.most_sig_bits >> (56 - 8 * i)) & 0xFF
            buf[8 + i] = (self.least_sig_bits >> (56 - 8 * i)) & 0xFF
        return (<char *>buf)[:16]

    @classmethod
    def unpack(cls, data):
        """The TxnID of 16 big-endian bytes (what pack() gives)."""
        cdef const uint8_t[::1] view
        try:
            view = memoryview(data).cast("B")
        except TypeError:
            raise TypeError(f"TxnID.unpack takes 16 bytes, not {type(data).__name__}") from None
        if view.shape[0] != 16:
            raise ValueError(f"TxnID.unpack takes exactly 16 bytes, got {view.shape[0]}")
        cdef uint64_t hi = 0, lo = 0
        cdef int i
        for i in range(8):
            hi = (hi << 8) | view[i]
            lo = (lo << 8) | view[8 + i]
        return txnid_from_halves(hi, lo)

    def __int__(self):
        return ((<object>self.most_sig_bits) << 64) | self.least_sig_bits

    def __str__(self):
        return f"{self.coordinator_id}:{self.sequence}"

    def __repr__(self):
        return f"TxnID({self.coordinator_id}, {self.sequence})"

    def __hash__(self):
        if C_HASH:
            # int(self) mod (2^61 - 1), with 2^64 = 8 (mod 2^61 - 1).
            return (((self.most_sig_bits % HASH_MODULUS) * 8) % HASH_MODULUS
                    + self.least_sig_bits % HASH_MODULUS) % HASH_MODULUS
        return hash(int(self))

    def __richcmp__(self, other, int op):
        if not isinstance(other, TxnID):
            return NotImplemented
        cdef TxnID o = <TxnID>other
        cdef int c
        if self.most_sig_bits != o.most_sig_bits:
            c = -1 if self.most_sig_bits < o.most_sig_bits else 1
        elif self.least_sig_bits != o.least_sig_bits:
            c = -1 if self.least_sig_bits < o.least_sig_bits else 1
        else:
            c = 0
        if op == 0:
            return c < 0
        if op == 1:
            return c <= 0
        if op == 2:
            return c == 0
        if op == 3:
            return c != 0
        if op == 4:
            return c > 0
        return c >= 0

    def __reduce__(self):
        return (TxnID, (self.coordinator_id, self.sequence))


cdef class TxnIdAllocator:
    """Hands out one coordinator's TxnIDs: strictly increasing sequences, never reused.

    With ``reserve`` (a callable taking the new exclusive high-water mark, which it must make
    durable before returning), sequences are reserved in blocks of ``block_size``: no id at or
    past the last reserved mark is handed out until ``reserve`` has returned. After a restart the
    coordinator passes the persisted mark as ``next_sequence``, so no sequence is issued twice;
    the unused rest of the last block is skipped. If ``reserve`` raises, nothing is handed out.
    """

    def __init__(self, coordinator_id, next_sequence=0, *, block_size=None, reserve=None):
        c = as_int(coordinator_id, "coordinator_id")
        if not 0 <= c <= MAX_COORDINATOR:
            raise ValueError(f"coordinator_id {c} out of range 0..65535")
        s = as_int(next_sequence, "next_sequence")
        if not 0 <= s <= MAX_SEQUENCE + 1:
            raise ValueError(f"next_sequence {s} out of range 0..2^112")
        if reserve is not None and not callable(reserve):
            raise TypeError(f"reserve must be callable, not {type(reserve).__name__}")
        if block_size is None:
            block_size = 1024 if reserve is not None else 0
        b = as_int(block_size, "block_size")
        if reserve is not None and b < 1:
            raise ValueError(f"block_size {b} must be at least 1 when reserve is given")
        if b < 0:
            raise ValueError(f"block_size {b} must not be negative")
        self.coordinator_id = c
        self._set_next(s)
        self.block_size = b
        self._reserve = reserve
        self.reserved_until = s if reserve is not None else None

    cdef _set_next(self, s):
        self._exhausted = s > MAX_SEQUENCE
        if self._exhausted:
            self._hi = 0
            self._lo = 0
        else:
            self._hi = s >> 64
            self._lo = s & _MASK64

    @property
    def next_sequence(self) -> int:
        """The sequence the next TxnID will have (2^112 once the space is used up)."""
        if self._exhausted:
            return MAX_SEQUENCE + 1
        return ((<object>self._hi) << 64) | self._lo

    cdef _ensure_reserved(self, end):
        """Make sure sequences below `end` (exclusive) are reserved, calling reserve once."""
        if self._reserve is None or end <= self.reserved_until:
            return
        mark = min(max(end, self.next_sequence + self.block_size), MAX_SEQUENCE + 1)
        self._reserve(mark)
        self.reserved_until = mark

    cdef _exhausted_error(self, n):
        return OverflowError(
            f"coordinator {self.coordinator_id}: cannot allocate {n} more TxnIDs, "
            f"sequence space (2^112) exhausted at {self.next_sequence}"
        )

    def next(self) -> TxnID:
        """The next TxnID of this coordinator."""
        if self._exhausted:
            raise self._exhausted_error(1)
        if self._reserve is not None:
            self._ensure_reserved(self.next_sequence + 1)
        cdef TxnID t = txnid_from_halves((<uint64_t>self.coordinator_id << 48) | self._hi, self._lo)
        self._lo += 1
        if self._lo == 0:
            self._hi += 1
            if self._hi > LOW48:
                self._exhausted = True
        return t

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def allocate(self, n):
        """The next n TxnIDs as two uint64 numpy arrays (most_sig_bits, least_sig_bits)."""
        cdef Py_ssize_t count = as_int(n, "n")
        if count < 0:
            raise ValueError(f"n {count} must not be negative")
        start = self.next_sequence
        if start + count > MAX_SEQUENCE + 1:
            raise self._exhausted_error(count)
        if self._reserve is not None:
            self._ensure_reserved(start + count)
        msb_arr = np.empty(count, dtype=np.uint64)
        lsb_arr = np.empty(count, dtype=np.uint64)
        cdef uint64_t[::1] msb = msb_arr
        cdef uint64_t[::1] lsb = lsb_arr
        cdef uint64_t top = <uint64_t>self.coordinator_id << 48
        cdef uint64_t hi = self._hi, lo = self._lo
        cdef Py_ssize_t i
        with nogil:
            for i in range(count):
                msb[i] = top | hi
                lsb[i] = lo
                lo += 1
                if lo == 0:
                    hi += 1
        self._set_next(start + count)
        return msb_arr, lsb_arr

    def __repr__(self):
        return (f"TxnIdAllocator(coordinator_id={self.coordinator_id}, "
                f"next_sequence={self.next_sequence}, reserved_until={self.reserved_until})")
