#include "pulsartxn/uring.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#if defined(__linux__) && __has_include(<linux/io_uring.h>)
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PTX_RING_ENTRIES 4

int ptx_ring_open(ptx_ring *ring) {
    struct io_uring_params p;
    memset(ring, 0, sizeof *ring);
    memset(&p, 0, sizeof p);
    ring->fd = -1;
    int fd = (int)syscall(__NR_io_uring_setup, PTX_RING_ENTRIES, &p);
    if (fd < 0) return -errno;
    ring->sq_ring_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    ring->cq_ring_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    ring->sqes_size = p.sq_entries * sizeof(struct io_uring_sqe);
    ring->sq_ring = mmap(NULL, ring->sq_ring_size, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    ring->cq_ring = mmap(NULL, ring->cq_ring_size, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
    ring->sqes = mmap(NULL, ring->sqes_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                      fd, IORING_OFF_SQES);
    if (ring->sq_ring == MAP_FAILED || ring->cq_ring == MAP_FAILED || ring->sqes == MAP_FAILED) {
        int err = errno;
        if (ring->sq_ring != MAP_FAILED) munmap(ring->sq_ring, ring->sq_ring_size);
        if (ring->cq_ring != MAP_FAILED) munmap(ring->cq_ring, ring->cq_ring_size);
        if (ring->sqes != MAP_FAILED) munmap(ring->sqes, ring->sqes_size);
        close(fd);
        return -err;
    }
    char *sq = ring->sq_ring, *cq = ring->cq_ring;
    ring->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    ring->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    ring->sq_array = (unsigned *)(sq + p.sq_off.array);
    ring->cq_head = (unsigned *)(cq + p.cq_off.head);
    ring->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    ring->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    ring->cqes = cq + p.cq_off.cqes;
#ifdef IORING_FEAT_EXT_ARG
    ring->timed = (p.features & IORING_FEAT_EXT_ARG) != 0;
#endif
    ring->fd = fd;
    return 0;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One io_uring_enter that waits for a completion, for at most left_ns (< 0: no bound). */
static long enter_wait(ptx_ring *ring, int64_t left_ns) {
#ifdef IORING_FEAT_EXT_ARG
    if (left_ns >= 0 && ring->timed) {
        struct __kernel_timespec ts = {left_ns / 1000000000, left_ns % 1000000000};
        struct io_uring_getevents_arg arg;
        memset(&arg, 0, sizeof arg);
        arg.ts = (uint64_t)(uintptr_t)&ts;
        return syscall(__NR_io_uring_enter, ring->fd, 0, 1,
                       IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg, sizeof arg);
    }
#endif
    (void)left_ns;
    return syscall(__NR_io_uring_enter, ring->fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0);
}

int ptx_ring_write(ptx_ring *ring, int fd, const void *addr, unsigned len, uint64_t offset) {
    unsigned tail = *ring->sq_tail;
    unsigned index = tail & *ring->sq_mask;
    struct io_uring_sqe *sqe = (struct io_uring_sqe *)ring->sqes + index;
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = IORING_OP_WRITE;
    sqe->fd = fd;
    sqe->addr = (uint64_t)(uintptr_t)addr;
    sqe->len = len;
    sqe->off = offset;
    ring->sq_array[index] = index;
    /* The kernel reads the entry once it sees the new tail. */
    __atomic_store_n(ring->sq_tail, tail + 1, __ATOMIC_RELEASE);
    for (;;) {
        long n = syscall(__NR_io_uring_enter, ring->fd, 1, 0, 0, NULL, 0);
        if (n == 1) return 0;
        if (n < 0 && errno == EINTR) continue;
        int err = n < 0 ? errno : EAGAIN;
        /* Not taken: withdraw it (nothing else is queued, one operation at a time). */
        __atomic_store_n(ring->sq_tail, tail, __ATOMIC_RELEASE);
        return -err;
    }
}

int64_t ptx_ring_wait(ptx_ring *ring, int64_t timeout_ns, int *err) {
    *err = 0;
    int64_t deadline = timeout_ns < 0 ? -1 : now_ns() + timeout_ns;
    for (;;) {
        unsigned head = *ring->cq_head;
        if (head != __atomic_load_n(ring->cq_tail, __ATOMIC_ACQUIRE)) {
            struct io_uring_cqe *cqe = (struct io_uring_cqe *)ring->cqes + (head & *ring->cq_mask);
            int64_t res = cqe->res;
            __atomic_store_n(ring->cq_head, head + 1, __ATOMIC_RELEASE);
            return res;
        }
        int64_t left = -1;
        if (deadline >= 0) {
            left = deadline - now_ns();
            if (left <= 0) {
                *err = ETIME;
                return -ETIME;
            }
        }
        long n = enter_wait(ring, left);
        if (n < 0 && errno != EINTR && errno != ETIME) {
            *err = errno;
            return -errno;
        }
    }
}

void ptx_ring_close(ptx_ring *ring) {
    if (ring->fd < 0) return;
    munmap(ring->sq_ring, ring->sq_ring_size);
    munmap(ring->cq_ring, ring->cq_ring_size);
    munmap(ring->sqes, ring->sqes_size);
    close(ring->fd);
    ring->fd = -1;
}

#else /* no io_uring here: callers write synchronously */

int ptx_ring_open(ptx_ring *ring) {
    memset(ring, 0, sizeof *ring);
    ring->fd = -1;
    return -ENOSYS;
}
int ptx_ring_write(ptx_ring *ring, int fd, const void *addr, unsigned len, uint64_t offset) {
    (void)ring, (void)fd, (void)addr, (void)len, (void)offset;
    return -ENOSYS;
}
int64_t ptx_ring_wait(ptx_ring *ring, int64_t timeout_ns, int *err) {
    (void)ring, (void)timeout_ns;
    *err = ENOSYS;
    return -ENOSYS;
}
void ptx_ring_close(ptx_ring *ring) { (void)ring; }

#endif
