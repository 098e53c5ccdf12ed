from libc.stdint cimport uint64_t


cdef class TxnID:
    cdef readonly uint64_t most_sig_bits
    cdef readonly uint64_t least_sig_bits


cdef TxnID txnid_from_halves(uint64_t msb, uint64_t lsb)


cdef class TxnIdAllocator:
    cdef readonly int coordinator_id
    cdef uint64_t _hi          # next sequence, high 48 bits
    cdef uint64_t _lo          # next sequence, low 64 bits
    cdef bint _exhausted       # the whole 2^112 sequence space has been handed out
    cdef readonly object reserved_until
    cdef readonly object block_size
    cdef object _reserve

    cdef _set_next(self, s)
    cdef _ensure_reserved(self, end)
    cdef _exhausted_error(self, n)
