/* CRC-32C: run-time choice between the SSE4.2 instruction and slicing-by-8 tables. */
#include <string.h>

#include "pulsartxn/crc32c.h"

#define PTX_CRC32C_POLY 0x82F63B78u /* Castagnoli, bit-reflected */

#if defined(__GNUC__) || defined(__clang__)
#define PTX_LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define PTX_STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#else
#define PTX_LOAD_ACQUIRE(p) (*(p))
#define PTX_STORE_RELEASE(p, v) (*(p) = (v))
#endif

typedef uint32_t (*ptx_crc_fn)(uint32_t, const uint8_t *, size_t);

/* ptx_crc_table[k][b]: the CRC register after byte b followed by k zero bytes. */
static uint32_t ptx_crc_table[8][256];

static void ptx_build_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ PTX_CRC32C_POLY : c >> 1;
        ptx_crc_table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = ptx_crc_table[0][b];
        for (int k = 1; k < 8; k++) {
            c = ptx_crc_table[0][c & 0xFF] ^ (c >> 8);
            ptx_crc_table[k][b] = c;
        }
    }
}

static uint32_t ptx_crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = ptx_crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        /* Bytes are read one by one, so the result does not depend on the CPU's byte order. */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = ptx_crc_table[7][lo & 0xFF] ^ ptx_crc_table[6][(lo >> 8) & 0xFF] ^
            ptx_crc_table[5][(lo >> 16) & 0xFF] ^ ptx_crc_table[4][lo >> 24] ^
            ptx_crc_table[3][p[4]] ^ ptx_crc_table[2][p[5]] ^ ptx_crc_table[1][p[6]] ^
            ptx_crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) c = ptx_crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PTX_CRC32C_NO_HW)
#include <nmmintrin.h>
#define PTX_HAVE_SSE42_PATH 1

/* The crc32 instruction has a latency of about 3 cycles and a throughput of 1, so one stream
   uses a third of it. Blocks of 3 * PTX_LANE bytes are run as three independent streams and
   the partial CRCs joined: moving a raw CRC register over n zero bytes is linear in the
   register, so it is 4 lookups in a table built once per distance (PTX_LANE and 2 * PTX_LANE). */
#define PTX_LANE 1024
static uint32_t ptx_shift1[4][256];
static uint32_t ptx_shift2[4][256];

__attribute__((target("sse4.2"))) static uint32_t ptx_zeros_hw(uint32_t c, size_t n) {
    uint64_t r = c;
    for (size_t i = 0; i < n / 8; i++) r = _mm_crc32_u64(r, 0);
    return (uint32_t)r;
}

__attribute__((target("sse4.2"))) static void ptx_build_shift_tables(void) {
    for (int k = 0; k < 4; k++) {
        for (uint32_t b = 0; b < 256; b++) {
            ptx_shift1[k][b] = ptx_zeros_hw(b << (8 * k), PTX_LANE);
            ptx_shift2[k][b] = ptx_zeros_hw(b << (8 * k), 2 * PTX_LANE);
        }
    }
}

static inline uint32_t ptx_shift(uint32_t table[4][256], uint32_t c) {
    return table[0][c & 0xFF] ^ table[1][(c >> 8) & 0xFF] ^ table[2][(c >> 16) & 0xFF] ^
           table[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t ptx_crc_sse42(uint32_t crc, const uint8_t *p,
                                                                 size_t n) {
    uint64_t c = (uint32_t)~crc;
    while (n >= 3 * PTX_LANE) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < PTX_LANE; i += 8) {
            uint64_t v0, v1, v2;
            memcpy(&v0, p + i, 8);
            memcpy(&v1, p + PTX_LANE + i, 8);
            memcpy(&v2, p + 2 * PTX_LANE + i, 8);
            c = _mm_crc32_u64(c, v0);
            c1 = _mm_crc32_u64(c1, v1);
            c2 = _mm_crc32_u64(c2, v2);
        }
        c = ptx_shift(ptx_shift2, (uint32_t)c) ^ ptx_shift(ptx_shift1, (uint32_t)c1) ^
            (uint32_t)c2;
        p += 3 * PTX_LANE;
        n -= 3 * PTX_LANE;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

static uint32_t ptx_crc_resolve(uint32_t crc, const uint8_t *p, size_t n);

static ptx_crc_fn ptx_crc_impl = ptx_crc_resolve;
static int ptx_tables_ready = 0;

static void ptx_ensure_tables(void) {
    /* Concurrent first calls may both build: they write the same values, and the flag is
       published only after the tables. */
    if (PTX_LOAD_ACQUIRE(&ptx_tables_ready)) return;
    ptx_build_tables();
    PTX_STORE_RELEASE(&ptx_tables_ready, 1);
}

void ptx_crc32c_init(void) {
    if (PTX_LOAD_ACQUIRE(&ptx_crc_impl) != ptx_crc_resolve) return;
    ptx_ensure_tables();
    ptx_crc_fn chosen = ptx_crc_sw;
#ifdef PTX_HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        ptx_build_shift_tables();
        chosen = ptx_crc_sse42;
    }
#endif
    PTX_STORE_RELEASE(&ptx_crc_impl, chosen);
}

static uint32_t ptx_crc_resolve(uint32_t crc, const uint8_t *p, size_t n) {
    ptx_crc32c_init();
    return PTX_LOAD_ACQUIRE(&ptx_crc_impl)(crc, p, n);
}

uint32_t ptx_crc32c(uint32_t crc, const void *data, size_t n) {
    return PTX_LOAD_ACQUIRE(&ptx_crc_impl)(crc, (const uint8_t *)data, n);
}

uint32_t ptx_crc32c_software(uint32_t crc, const void *data, size_t n) {
    ptx_ensure_tables();
    return ptx_crc_sw(crc, (const uint8_t *)data, n);
}

int ptx_crc32c_hardware(void) {
    ptx_crc32c_init();
    return PTX_LOAD_ACQUIRE(&ptx_crc_impl) != ptx_crc_sw;
}
