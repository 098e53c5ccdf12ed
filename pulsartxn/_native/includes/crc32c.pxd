# C declarations of csrc/include/pulsartxn/crc32c.h (CRC-32C, hardware path chosen at run time).
from libc.stdint cimport uint32_t


cdef extern from "pulsartxn/crc32c.h" nogil:
    uint32_t ptx_crc32c(uint32_t crc, const void *data, size_t n)
    uint32_t ptx_crc32c_software(uint32_t crc, const void *data, size_t n)
    void ptx_crc32c_init()
    int ptx_crc32c_hardware()
