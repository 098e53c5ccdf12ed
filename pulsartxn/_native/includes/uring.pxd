from libc.stdint cimport int64_t, uint64_t


cdef extern from "pulsartxn/uring.h" nogil:
    ctypedef struct ptx_ring:
        int fd
        int timed
    int ptx_ring_open(ptx_ring *ring)
    int ptx_ring_write(ptx_ring *ring, int fd, const void *addr, unsigned len, uint64_t offset)
    int64_t ptx_ring_wait(ptx_ring *ring, int64_t timeout_ns, int *err)
    void ptx_ring_close(ptx_ring *ring)
