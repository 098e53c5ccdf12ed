#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "pulsartxn/hash.h"
#include "pulsartxn/u128set.h"

#define PTX_MIN_CAPACITY 16
#define PTX_PREFETCH_DISTANCE 24
#define PTX_CACHED_TABLE_BYTES (256 * 1024)

static inline int is_empty(const ptx_u128 *slot) { return (slot->hi | slot->lo) == 0; }

static inline size_t home(const ptx_u128set *s, uint64_t hi, uint64_t lo) {
    return (size_t)ptx_hash128(hi, lo) & s->mask;
}

/* Largest load: 7/10 for large tables, so 10M keys fit a 2^24-slot table (256 MiB); 3/10 while
   the table is small (at most 64 Ki slots, 1 MiB), where memory is cheap and short probe runs
   make misses (the common answer when dispatch filters a batch) nearly as fast as hits. */
static inline int too_full(size_t used, size_t capacity) {
    if (capacity <= 65536) return used * 10 > capacity * 3;
    return used * 10 > capacity * 7;
}

void ptx_u128set_init(ptx_u128set *s) {
    s->slots = NULL;
    s->mask = 0;
    s->used = 0;
    s->has_zero = 0;
}

void ptx_u128set_free(ptx_u128set *s) {
    free(s->slots);
    ptx_u128set_init(s);
}

void ptx_u128set_clear(ptx_u128set *s) { ptx_u128set_free(s); }

size_t ptx_u128set_len(const ptx_u128set *s) { return s->used + (s->has_zero ? 1 : 0); }

size_t ptx_u128set_capacity(const ptx_u128set *s) { return s->slots ? s->mask + 1 : 0; }

/* Insert a key known to be absent and non-zero into a table with room for it. */
static inline void place(ptx_u128 *slots, size_t mask, uint64_t hi, uint64_t lo) {
    size_t i = (size_t)ptx_hash128(hi, lo) & mask;
    while (!is_empty(&slots[i])) i = (i + 1) & mask;
    slots[i].hi = hi;
    slots[i].lo = lo;
}

#define PTX_HUGE_PAGE ((size_t)2 << 20)

/* Zeroed slots. Tables of 2 MiB and more are aligned to and advised for transparent huge
   pages: a probe of a large table is a random access, and with 4 KiB pages most of them would
   also miss the TLB. */
static ptx_u128 *alloc_slots(size_t capacity) {
    size_t bytes = capacity * sizeof(ptx_u128);
    if (bytes < PTX_HUGE_PAGE) return (ptx_u128 *)calloc(capacity, sizeof(ptx_u128));
    void *p = NULL;
    if (posix_memalign(&p, PTX_HUGE_PAGE, bytes) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    memset(p, 0, bytes);
    return (ptx_u128 *)p;
}

static int rehash(ptx_u128set *s, size_t capacity) {
    ptx_u128 *fresh = alloc_slots(capacity);
    if (fresh == NULL) return -1;
    if (s->slots != NULL) {
        size_t old_capacity = s->mask + 1;
        for (size_t i = 0; i < old_capacity; i++) {
            if (!is_empty(&s->slots[i])) place(fresh, capacity - 1, s->slots[i].hi, s->slots[i].lo);
        }
        free(s->slots);
    }
    s->slots = fresh;
    s->mask = capacity - 1;
    return 0;
}

static size_t capacity_for(size_t n) {
    size_t capacity = PTX_MIN_CAPACITY;
    while (too_full(n, capacity)) capacity <<= 1;
    return capacity;
}

int ptx_u128set_reserve(ptx_u128set *s, size_t n) {
    size_t capacity = capacity_for(n);
    if (s->slots != NULL && capacity <= s->mask + 1) return 0;
    return rehash(s, capacity);
}

static inline int probe(const ptx_u128set *s, size_t i, uint64_t hi, uint64_t lo) {
    const ptx_u128 *slots = s->slots;
    const size_t mask = s->mask;
    for (;;) {
        uint64_t a = slots[i].hi, b = slots[i].lo;
        int found = ((a ^ hi) | (b ^ lo)) == 0;
        int empty = (a | b) == 0;
        /* One branch for "the run ends here", taken by most probes at our loads, instead of
           a hit/miss branch that a mixed batch mispredicts half the time. */
        if (found | empty) return found;
        i = (i + 1) & mask;
    }
}

int ptx_u128set_contains(const ptx_u128set *s, uint64_t hi, uint64_t lo) {
    if ((hi | lo) == 0) return s->has_zero;
    if (s->slots == NULL) return 0;
    return probe(s, home(s, hi, lo), hi, lo);
}

int ptx_u128set_add(ptx_u128set *s, uint64_t hi, uint64_t lo) {
    if ((hi | lo) == 0) {
        int added = !s->has_zero;
        s->has_zero = 1;
        return added;
    }
    if (ptx_u128set_contains(s, hi, lo)) return 0;
    if (s->slots == NULL || too_full(s->used + 1, s->mask + 1)) {
        if (ptx_u128set_reserve(s, s->used + 1 > 2 * s->used ? s->used + 1 : 2 * s->used) != 0)
            return -1;
    }
    place(s->slots, s->mask, hi, lo);
    s->used++;
    return 1;
}

int ptx_u128set_discard(ptx_u128set *s, uint64_t hi, uint64_t lo) {
    if ((hi | lo) == 0) {
        int removed = s->has_zero;
        s->has_zero = 0;
        return removed;
    }
    if (s->slots == NULL) return 0;
    size_t mask = s->mask;
    size_t i = home(s, hi, lo);
    for (;;) {
        if (s->slots[i].hi == hi && s->slots[i].lo == lo) break;
        if (is_empty(&s->slots[i])) return 0;
        i = (i + 1) & mask;
    }
    /* Backward shift: pull later members of the probe run into the hole when their home slot
       does not lie cyclically in (hole, their slot], so every lookup still finds them. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (is_empty(&s->slots[j])) break;
        size_t k = home(s, s->slots[j].hi, s->slots[j].lo);
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        s->slots[i] = s->slots[j];
        i = j;
    }
    s->slots[i].hi = 0;
    s->slots[i].lo = 0;
    s->used--;
    return 1;
}

void ptx_u128set_contains_many(const ptx_u128set *s, const uint64_t *hi, const uint64_t *lo,
                               size_t n, uint8_t *out) {
    if (s->slots == NULL) {
        for (size_t i = 0; i < n; i++) out[i] = ((hi[i] | lo[i]) == 0) ? (uint8_t)s->has_zero : 0;
        return;
    }
    if ((s->mask + 1) * sizeof(ptx_u128) <= PTX_CACHED_TABLE_BYTES) {
        /* The table sits in cache: prefetching would only add work. */
        for (size_t i = 0; i < n; i++) {
            uint64_t h = hi[i], l = lo[i];
            out[i] = (h | l) == 0 ? (uint8_t)s->has_zero : (uint8_t)probe(s, home(s, h, l), h, l);
        }
        return;
    }
    /* A rolling prefetch: the slot of probe i + D is requested while probe i runs, so up to D
       cache misses are in flight instead of one. */
    const size_t D = PTX_PREFETCH_DISTANCE;
    size_t ahead = n < D ? n : D;
    for (size_t k = 0; k < ahead; k++) __builtin_prefetch(&s->slots[home(s, hi[k], lo[k])]);
    for (size_t i = 0; i < n; i++) {
        if (i + D < n) __builtin_prefetch(&s->slots[home(s, hi[i + D], lo[i + D])]);
        uint64_t h = hi[i], l = lo[i];
        out[i] = (h | l) == 0 ? (uint8_t)s->has_zero : (uint8_t)probe(s, home(s, h, l), h, l);
    }
}

/* Whether a TxnID key is of coordinator `top` with a sequence below (bound_hi, bound_lo). */
static inline int is_below(const ptx_u128 *key, uint64_t top, uint64_t bound_hi, uint64_t bound_lo) {
    const uint64_t low48 = (((uint64_t)1) << 48) - 1;
    uint64_t seq_hi = key->hi & low48;
    return (key->hi >> 48) == top && (seq_hi < bound_hi || (seq_hi == bound_hi && key->lo < bound_lo));
}

size_t ptx_u128set_prune_below(ptx_u128set *s, uint64_t top, uint64_t bound_hi, uint64_t bound_lo) {
    size_t removed = 0;
    if (s->has_zero && top == 0 && (bound_hi | bound_lo) != 0) {
        s->has_zero = 0;
        removed++;
    }
    if (s->slots == NULL) return removed;
    size_t capacity = s->mask + 1;
    size_t survivors = 0;
    for (size_t i = 0; i < capacity; i++) {
        const ptx_u128 *slot = &s->slots[i];
        if (!is_empty(slot) && !is_below(slot, top, bound_hi, bound_lo)) survivors++;
    }
    size_t dropped = s->used - survivors;
    if (dropped == 0) return removed;
    /* Rebuild: it also shrinks the table after a large prune. */
    size_t fresh_capacity = capacity_for(survivors);
    ptx_u128 *fresh = alloc_slots(fresh_capacity);
    if (fresh == NULL) {
        if (removed) s->has_zero = 1; /* leave the set as it was */
        return (size_t)-1;
    }
    for (size_t i = 0; i < capacity; i++) {
        const ptx_u128 *slot = &s->slots[i];
        if (!is_empty(slot) && !is_below(slot, top, bound_hi, bound_lo))
            place(fresh, fresh_capacity - 1, slot->hi, slot->lo);
    }
    free(s->slots);
    s->slots = fresh;
    s->mask = fresh_capacity - 1;
    s->used = survivors;
    return removed + dropped;
}

static int compare_u128(const void *a, const void *b) {
    const ptx_u128 *x = (const ptx_u128 *)a, *y = (const ptx_u128 *)b;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return 0;
}

void ptx_u128set_dump(const ptx_u128set *s, ptx_u128 *out, int sort) {
    size_t n = 0;
    if (s->has_zero) {
        out[n].hi = 0;
        out[n].lo = 0;
        n++;
    }
    if (s->slots != NULL) {
        size_t capacity = s->mask + 1;
        for (size_t i = 0; i < capacity; i++) {
            if (!is_empty(&s->slots[i])) out[n++] = s->slots[i];
        }
    }
    if (sort && n > 1) qsort(out, n, sizeof(ptx_u128), compare_u128);
}
