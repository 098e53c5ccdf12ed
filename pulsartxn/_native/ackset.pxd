from libc.stdint cimport uint64_t


cdef enum:
    INLINE_WORDS = 4


cdef class AckSet:
    cdef uint64_t *words
    cdef uint64_t inline_words[INLINE_WORDS]
    cdef Py_ssize_t nbits
    cdef Py_ssize_t nwords

    cdef int _alloc(self, Py_ssize_t n) except -1
    cdef int _check_index(self, Py_ssize_t i) except -1
    cdef int _check_same(self, AckSet other) except -1
    cdef AckSet _clone(self)


cdef class _Held:
    cdef dict owners
    cdef AckSet union
    cdef Py_ssize_t size


cdef class PendingAckIndex:
    cdef dict _entries       # (ledger_id, entry_id) -> _Held
    cdef dict _by_txn        # txn -> set of (ledger_id, entry_id)

    cdef object _conflict(self, _Held held, object txn, AckSet acks, tuple pos)
