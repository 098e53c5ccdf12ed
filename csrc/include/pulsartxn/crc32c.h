/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI, ext4 and the checksums of
   Pulsar's entries use. crc32c("123456789") == 0xE3069283.

   Every extension links its own copy of the C sources, so the implementation picks itself on first
   use (thread-safe, no init call needed): SSE4.2 crc32 instructions on x86-64 CPUs that have
   them, otherwise a portable slicing-by-8 table loop. */
#ifndef PULSARTXN_CRC32C_H
#define PULSARTXN_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Continue a running CRC (start with 0) over n bytes; returns the new running value. */
uint32_t ptx_crc32c(uint32_t crc, const void *data, size_t n);

/* The portable table-driven path, whatever the CPU (for tests and comparisons). */
uint32_t ptx_crc32c_software(uint32_t crc, const void *data, size_t n);

/* Choose the implementation now (optional: the first ptx_crc32c call does it too). */
void ptx_crc32c_init(void);

/* 1 when the hardware instruction path is in use, else 0 (chooses it first if need be). */
int ptx_crc32c_hardware(void);

#ifdef __cplusplus
}
#endif

#endif
