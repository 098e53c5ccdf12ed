# cython: language_level=3
"""The broker's batch flusher's timer: its thread sleeps until the earliest due time of what
it watches, and wakes up again without the GIL when that time has moved later meanwhile, so
it takes the GIL from the threads that produce only when something is due (most due times
move on before they pass: a commit takes its transaction's pending acks). The twin is
``reference/flushtimer.py``; docs/internals.md, "Acknowledgements".
"""

from libc.math cimport INFINITY
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from .includes.pthread cimport (
    pthread_cond_destroy,
    pthread_cond_init,
    pthread_cond_signal,
    pthread_cond_t,
    pthread_cond_timedwait,
    pthread_cond_wait,
    pthread_condattr_destroy,
    pthread_condattr_init,
    pthread_condattr_setclock,
    pthread_condattr_t,
    pthread_mutex_destroy,
    pthread_mutex_init,
    pthread_mutex_lock,
    pthread_mutex_t,
    pthread_mutex_unlock,
)


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef class FlushTimer:
    """``wait()`` returns once the time last given to ``set`` (``time.monotonic()``
    seconds; ``math.inf``: none) has come, or False once stopped. The clock is
    CLOCK_MONOTONIC, the one ``time.monotonic()`` reads."""

    cdef pthread_mutex_t _mutex
    cdef pthread_cond_t _cond
    cdef double _next
    cdef bint _stopped

    def __cinit__(self):
        cdef pthread_condattr_t attr
        pthread_mutex_init(&self._mutex, NULL)
        pthread_condattr_init(&attr)
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        pthread_cond_init(&self._cond, &attr)
        pthread_condattr_destroy(&attr)
        self._next = INFINITY
        self._stopped = False

    def __dealloc__(self):
        pthread_cond_destroy(&self._cond)
        pthread_mutex_destroy(&self._mutex)

    def set(self, double at):
        """The next due time; a waiter wakes at once if it is earlier than the one before
        (a later one: the waiter finds that out when the earlier comes, without the GIL).
        The GIL stays held: the waiter holds the mutex only for moments and never while it
        waits for the GIL, and a release here would offer the GIL to other threads."""
        pthread_mutex_lock(&self._mutex)
        if at < self._next:
            pthread_cond_signal(&self._cond)
        self._next = at
        pthread_mutex_unlock(&self._mutex)

    def wait(self):
        """Sleep, without the GIL, until the due time set last has come: True; or until
        ``stop()``: False. One thread waits."""
        cdef bint stopped
        cdef double now, at
        cdef timespec ts
        with nogil:
            pthread_mutex_lock(&self._mutex)
            while not self._stopped:
                at = self._next
                now = _now()
                if at <= now:
                    break
                if at == INFINITY:
                    pthread_cond_wait(&self._cond, &self._mutex)
                else:
                    ts.tv_sec = <long>at
                    ts.tv_nsec = min(<long>((at - <double>ts.tv_sec) * 1e9), 999999999)
                    pthread_cond_timedwait(&self._cond, &self._mutex, &ts)
            stopped = self._stopped
            pthread_mutex_unlock(&self._mutex)
        return not stopped

    def stop(self):
        """Wake the waiter for good: wait() returns False from now on."""
        pthread_mutex_lock(&self._mutex)
        self._stopped = True
        pthread_cond_signal(&self._cond)
        pthread_mutex_unlock(&self._mutex)
