/* One write at a time through an io_uring: submit it, do something else, wait for it.

   A direct (O_DIRECT) write submitted this way is handed to the block layer before the submit
   returns, so the device works on it while the caller goes on. Linux only; elsewhere, and
   where io_uring is refused (kernel too old, seccomp, kernel.io_uring_disabled), open fails
   with the errno the kernel gave and the caller writes synchronously. */
#ifndef PULSARTXN_URING_H
#define PULSARTXN_URING_H

#include <stddef.h>
#include <stdint.h>

typedef struct ptx_ring {
    int fd; /* the ring's descriptor, -1 once closed */
    void *sq_ring, *cq_ring, *sqes;
    size_t sq_ring_size, cq_ring_size, sqes_size;
    unsigned *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    void *cqes;
    int timed; /* the kernel bounds a wait (IORING_FEAT_EXT_ARG, Linux 5.11) */
} ptx_ring;

/* 0, or -errno (the ring is then unusable and needs no close). */
int ptx_ring_open(ptx_ring *ring);
/* Queue and submit one write of len bytes at addr to fd at offset: 0 or -errno. */
int ptx_ring_write(ptx_ring *ring, int fd, const void *addr, unsigned len, uint64_t offset);
/* Wait for the one submitted operation: its result (bytes written, or -errno), or -errno of
   the wait itself in *err (then the operation may still be in flight). timeout_ns >= 0 bounds
   the wait where the kernel can (ring->timed; else it is unbounded): past it, -ETIME in *err.
   Takes no lock. */
int64_t ptx_ring_wait(ptx_ring *ring, int64_t timeout_ns, int *err);
void ptx_ring_close(ptx_ring *ring);

#endif
