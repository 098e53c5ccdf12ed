/* CRC-32C (Castagnoli), as iSCSI, ext4 and Pulsar's entry checksums use. */
#ifndef PULSARTXN_CRC32C_H
#define PULSARTXN_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Build the software tables and pick the hardware path if the CPU has one. Call once before
   use (module init); calling again is harmless. */
void ptx_crc32c_init(void);
/* Continue a running CRC (start with 0) over n bytes. */
uint32_t ptx_crc32c(uint32_t crc, const void *data, size_t n);
/* 1 when the SSE4.2 instruction path is in use. */
int ptx_crc32c_hardware(void);

#endif
