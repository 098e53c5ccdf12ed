/* Hashing of 64- and 128-bit keys for the native core's open-addressing tables. */
#ifndef PULSARTXN_HASH_H
#define PULSARTXN_HASH_H

#include <stdint.h>

/* The 64-bit finaliser of MurmurHash3: a bijection that spreads every input bit over the word,
   so sequential ids (TxnID sequences, entry ids) land on unrelated slots. */
static inline uint64_t ptx_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Hash of a 128-bit key for table slots (low bits are used): two multiplies fold both halves,
   the shift brings the well-mixed high bits down. Cheap enough for 100M probes/s, and
   sequential ids of one coordinator still spread over the whole table. */
static inline uint64_t ptx_hash128(uint64_t hi, uint64_t lo) {
    uint64_t x = lo * 0x9e3779b97f4a7c15ULL ^ (hi + 0x632be59bd9b4e019ULL) * 0xc2b2ae3d27d4eb4fULL;
    return x ^ (x >> 29) ^ (x >> 47);
}

#endif
