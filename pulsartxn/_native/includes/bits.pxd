from libc.stdint cimport uint64_t


cdef extern from "pulsartxn/bits.h" nogil:
    int ptx_popcount64(uint64_t x)
    uint64_t ptx_mask_range(unsigned lo, unsigned hi)
    void ptx_bits_assign_range(uint64_t *w, size_t start, size_t end, int value)
    size_t ptx_bits_count(const uint64_t *w, size_t n)
    int ptx_bits_overlap(const uint64_t *a, const uint64_t *b, size_t n)
    int ptx_bits_overlap_outside(const uint64_t *a, const uint64_t *b, const uint64_t *c, size_t n)
