#include <string.h>

#include "pulsartxn/crc32c.h"

#define PTX_CRC32C_POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t ptx_crc_table[8][256];
static int ptx_crc_ready = 0;

static uint32_t crc32c_software(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        /* Slicing-by-8, byte order independent: the bytes are read one by one. */
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        crc = ptx_crc_table[7][lo & 0xFF] ^ ptx_crc_table[6][(lo >> 8) & 0xFF] ^
              ptx_crc_table[5][(lo >> 16) & 0xFF] ^ ptx_crc_table[4][lo >> 24] ^
              ptx_crc_table[3][p[4]] ^ ptx_crc_table[2][p[5]] ^ ptx_crc_table[1][p[6]] ^
              ptx_crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) crc = ptx_crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define PTX_HAVE_HW_PATH 1

/* Three independent streams hide the crc32 instruction's 3-cycle latency. A block of 3 x LANE
   bytes is split in three; the three partial CRCs are combined by shifting the first two over
   the bytes after them: shifting a raw CRC register over n zero bytes is linear in the register,
   so it is four table lookups (tables built once from the instruction itself). */
#define PTX_LANE 1024
static uint32_t ptx_shift_lane[4][256];
static uint32_t ptx_shift_2lanes[4][256];

__attribute__((target("sse4.2"))) static uint32_t crc32c_zeros(uint32_t c, size_t n) {
    uint64_t r = c;
    for (size_t i = 0; i < n / 8; i++) r = _mm_crc32_u64(r, 0);
    return (uint32_t)r;
}

__attribute__((target("sse4.2"))) static void crc32c_build_shift_tables(void) {
    for (int k = 0; k < 4; k++) {
        for (uint32_t b = 0; b < 256; b++) {
            ptx_shift_lane[k][b] = crc32c_zeros(b << (8 * k), PTX_LANE);
            ptx_shift_2lanes[k][b] = crc32c_zeros(b << (8 * k), 2 * PTX_LANE);
        }
    }
}

static inline uint32_t crc32c_shift(const uint32_t table[4][256], uint32_t c) {
    return table[0][c & 0xFF] ^ table[1][(c >> 8) & 0xFF] ^ table[2][(c >> 16) & 0xFF] ^
           table[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p,
                                                                size_t n) {
    uint32_t c = ~crc;
    while (n >= 3 * PTX_LANE) {
        uint64_t c0 = c, c1 = 0, c2 = 0;
        for (size_t i = 0; i < PTX_LANE; i += 8) {
            uint64_t v0, v1, v2;
            memcpy(&v0, p + i, 8);
            memcpy(&v1, p + PTX_LANE + i, 8);
            memcpy(&v2, p + 2 * PTX_LANE + i, 8);
            c0 = _mm_crc32_u64(c0, v0);
            c1 = _mm_crc32_u64(c1, v1);
            c2 = _mm_crc32_u64(c2, v2);
        }
        c = crc32c_shift(ptx_shift_2lanes, (uint32_t)c0) ^ crc32c_shift(ptx_shift_lane, (uint32_t)c1) ^
            (uint32_t)c2;
        p += 3 * PTX_LANE;
        n -= 3 * PTX_LANE;
    }
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c64;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

static uint32_t (*ptx_crc_impl)(uint32_t, const uint8_t *, size_t) = crc32c_software;

void ptx_crc32c_init(void) {
    if (ptx_crc_ready) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ PTX_CRC32C_POLY : c >> 1;
        ptx_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = ptx_crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = ptx_crc_table[0][c & 0xFF] ^ (c >> 8);
            ptx_crc_table[t][i] = c;
        }
    }
#ifdef PTX_HAVE_HW_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc32c_build_shift_tables();
        ptx_crc_impl = crc32c_sse42;
    }
#endif
    ptx_crc_ready = 1;
}

uint32_t ptx_crc32c(uint32_t crc, const void *data, size_t n) {
    return ptx_crc_impl(crc, (const uint8_t *)data, n);
}

int ptx_crc32c_hardware(void) { return ptx_crc_impl != crc32c_software; }
