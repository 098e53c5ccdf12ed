from libc.stdint cimport uint32_t


cdef extern from "pulsartxn/crc32c.h" nogil:
    void ptx_crc32c_init()
    uint32_t ptx_crc32c(uint32_t crc, const void *data, size_t n)
    int ptx_crc32c_hardware()
