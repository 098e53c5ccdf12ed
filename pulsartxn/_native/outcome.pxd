# The C side of outcome.pyx, cimported by the producer module: the send path takes the lock,
# makes futures and ends batches without a Python call.
cimport cython
from cpython.pythread cimport (
    NOWAIT_LOCK,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from libc.stdint cimport int64_t


@cython.final
cdef class Lock:
    cdef PyThread_type_lock _lock

    cdef inline void take(self) noexcept:
        if not PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            with nogil:
                PyThread_acquire_lock(self._lock, WAIT_LOCK)

    cdef inline void give(self) noexcept:
        PyThread_release_lock(self._lock)


@cython.final
cdef class Outcome:
    cdef readonly object condition
    cdef readonly bint done
    cdef readonly object error
    cdef object partition
    cdef int64_t entry_id
    cdef Py_ssize_t count
    cdef list watched  # futures with waiters or callbacks, answered when the batch ends
    cdef public object on_wait  # on_wait(block): write the batch now (a transaction's)

    cdef object message_id(self, Py_ssize_t index)
    cdef int ask(self, bint block) except -1
    cdef int wait_done(self, object timeout) except -1
    cdef int settle(self, object error) except -1


@cython.final
cdef class MessageFuture:
    cdef Outcome _outcome
    cdef Py_ssize_t _index
    cdef object _message_id
    cdef list _waiter_list
    cdef list _callbacks
    cdef bint _watched

    cdef int watch(self) except -1
    cdef int run_callbacks(self) except -1
