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

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p,
                                                                size_t n) {
    uint64_t c = (uint32_t)~crc;
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
    if (__builtin_cpu_supports("sse4.2")) ptx_crc_impl = crc32c_sse42;
#endif
    ptx_crc_ready = 1;
}

uint32_t ptx_crc32c(uint32_t crc, const void *data, size_t n) {
    return ptx_crc_impl(crc, (const uint8_t *)data, n);
}

int ptx_crc32c_hardware(void) { return ptx_crc_impl != crc32c_software; }
