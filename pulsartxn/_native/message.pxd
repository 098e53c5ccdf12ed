cdef class Message:
    cdef object _data
    cdef object _properties
    cdef object _key
    cdef object _id
    cdef object _topic
    cdef object _publish_time
    cdef object _redelivery_count
    cdef object _txn


cdef object message_id_type()
