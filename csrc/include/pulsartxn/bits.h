/* Word-level bit tricks for batch-index bitsets (AckSet). */
#ifndef PULSARTXN_BITS_H
#define PULSARTXN_BITS_H

#include <stddef.h>
#include <stdint.h>

static inline int ptx_popcount64(uint64_t x) { return __builtin_popcountll(x); }

/* Bits lo..hi-1 of one word (0 <= lo < hi <= 64). */
static inline uint64_t ptx_mask_range(unsigned lo, unsigned hi) {
    uint64_t upper = hi == 64 ? ~(uint64_t)0 : (((uint64_t)1 << hi) - 1);
    return upper & ~((((uint64_t)1) << lo) - 1);
}

/* Set (value 1) or clear (value 0) bits [start, end) of a word array. */
static inline void ptx_bits_assign_range(uint64_t *w, size_t start, size_t end, int value) {
    while (start < end) {
        size_t word = start >> 6;
        unsigned lo = (unsigned)(start & 63);
        size_t stop = (word + 1) << 6;
        unsigned hi = (unsigned)((end < stop ? end : stop) - (word << 6));
        uint64_t m = ptx_mask_range(lo, hi);
        if (value) w[word] |= m; else w[word] &= ~m;
        start = (word << 6) + hi;
    }
}

static inline size_t ptx_bits_count(const uint64_t *w, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (size_t)__builtin_popcountll(w[i]);
    return c;
}

/* Whether a & b has any bit set. */
static inline int ptx_bits_overlap(const uint64_t *a, const uint64_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) if (a[i] & b[i]) return 1;
    return 0;
}

/* Whether a & b & ~c has any bit set (a overlaps b outside c). */
static inline int ptx_bits_overlap_outside(const uint64_t *a, const uint64_t *b, const uint64_t *c,
                                           size_t n) {
    for (size_t i = 0; i < n; i++) if (a[i] & b[i] & ~c[i]) return 1;
    return 0;
}

#endif
