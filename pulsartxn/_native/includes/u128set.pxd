from libc.stdint cimport uint8_t, uint64_t


cdef extern from "pulsartxn/hash.h" nogil:
    uint64_t ptx_mix64(uint64_t x)
    uint64_t ptx_hash128(uint64_t hi, uint64_t lo)


cdef extern from "pulsartxn/u128set.h" nogil:
    ctypedef struct ptx_u128:
        uint64_t hi
        uint64_t lo

    ctypedef struct ptx_u128set:
        ptx_u128 *slots
        size_t mask
        size_t used
        int has_zero

    void ptx_u128set_init(ptx_u128set *s)
    void ptx_u128set_free(ptx_u128set *s)
    void ptx_u128set_clear(ptx_u128set *s)
    size_t ptx_u128set_len(const ptx_u128set *s)
    size_t ptx_u128set_capacity(const ptx_u128set *s)
    int ptx_u128set_reserve(ptx_u128set *s, size_t n)
    int ptx_u128set_contains(const ptx_u128set *s, uint64_t hi, uint64_t lo)
    int ptx_u128set_add(ptx_u128set *s, uint64_t hi, uint64_t lo)
    int ptx_u128set_discard(ptx_u128set *s, uint64_t hi, uint64_t lo)
    void ptx_u128set_contains_many(const ptx_u128set *s, const uint64_t *hi, const uint64_t *lo,
                                   size_t n, uint8_t *out)
    size_t ptx_u128set_prune_below(ptx_u128set *s, uint64_t top, uint64_t bound_hi,
                                   uint64_t bound_lo)
    void ptx_u128set_dump(const ptx_u128set *s, ptx_u128 *out, int sort)
