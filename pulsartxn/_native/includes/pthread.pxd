from posix.time cimport timespec
from posix.types cimport clockid_t


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    ctypedef struct pthread_condattr_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *mutex, const void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *mutex)
    int pthread_mutex_lock(pthread_mutex_t *mutex)
    int pthread_mutex_unlock(pthread_mutex_t *mutex)
    int pthread_condattr_init(pthread_condattr_t *attr)
    int pthread_condattr_destroy(pthread_condattr_t *attr)
    int pthread_condattr_setclock(pthread_condattr_t *attr, clockid_t clock)
    int pthread_cond_init(pthread_cond_t *cond, const pthread_condattr_t *attr)
    int pthread_cond_destroy(pthread_cond_t *cond)
    int pthread_cond_wait(pthread_cond_t *cond, pthread_mutex_t *mutex)
    int pthread_cond_timedwait(pthread_cond_t *cond, pthread_mutex_t *mutex,
                               const timespec *abstime)
    int pthread_cond_signal(pthread_cond_t *cond)
