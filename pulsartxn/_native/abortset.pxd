from libc.stdint cimport uint64_t

from .includes.u128set cimport ptx_u128set


cdef class AbortSet:
    cdef ptx_u128set _set
    cdef Py_ssize_t _version   # bumped by every mutation, so iteration can detect them

    cdef bint contains_halves(self, uint64_t msb, uint64_t lsb) noexcept nogil
