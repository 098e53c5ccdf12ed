/* A set of 128-bit keys (two uint64 halves): open addressing, linear probing, backward-shift
   deletion (no tombstones), 16-byte slots so one probe is one cache line at most.
   The all-zero key marks an empty slot; the key (0, 0) itself is kept in a flag beside the table. */
#ifndef PULSARTXN_U128SET_H
#define PULSARTXN_U128SET_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t hi;
    uint64_t lo;
} ptx_u128;

typedef struct {
    ptx_u128 *slots;   /* capacity entries, capacity a power of two (0 when empty) */
    size_t mask;       /* capacity - 1 */
    size_t used;       /* keys in slots (the zero key not counted) */
    int has_zero;      /* whether the key (0, 0) is a member */
} ptx_u128set;

void ptx_u128set_init(ptx_u128set *s);
void ptx_u128set_free(ptx_u128set *s);
size_t ptx_u128set_len(const ptx_u128set *s);
size_t ptx_u128set_capacity(const ptx_u128set *s);
/* Make room for n keys without growing again. 0 on success, -1 when out of memory. */
int ptx_u128set_reserve(ptx_u128set *s, size_t n);
int ptx_u128set_contains(const ptx_u128set *s, uint64_t hi, uint64_t lo);
/* 1 when added, 0 when already there, -1 when out of memory (set unchanged). */
int ptx_u128set_add(ptx_u128set *s, uint64_t hi, uint64_t lo);
/* 1 when removed, 0 when absent. */
int ptx_u128set_discard(ptx_u128set *s, uint64_t hi, uint64_t lo);
/* out[i] = 1 when (hi[i], lo[i]) is a member; probes are prefetched in small groups. */
void ptx_u128set_contains_many(const ptx_u128set *s, const uint64_t *hi, const uint64_t *lo,
                               size_t n, uint8_t *out);
/* Remove the keys for which hi >> 48 == top and (hi & 2^48-1, lo) < (bound_hi, bound_lo);
   returns how many, or (size_t)-1 when out of memory (set unchanged). */
size_t ptx_u128set_prune_below(ptx_u128set *s, uint64_t top, uint64_t bound_hi, uint64_t bound_lo);
/* Copy every member into out (room for ptx_u128set_len keys), sorted ascending when sort != 0. */
void ptx_u128set_dump(const ptx_u128set *s, ptx_u128 *out, int sort);
void ptx_u128set_clear(ptx_u128set *s);

#endif
