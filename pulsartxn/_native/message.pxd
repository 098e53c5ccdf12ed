from libc.stdint cimport int32_t, int64_t


cdef class MessageId:
    cdef readonly int64_t _ledger_id
    cdef readonly int64_t _entry_id
    cdef readonly int32_t _partition
    cdef readonly int32_t _batch_index
    cdef readonly int32_t _batch_size


cdef class Message:
    cdef object _data
    cdef object _properties
    cdef object _key
    cdef object _id
    cdef object _topic
    cdef object _publish_time
    cdef object _redelivery_count
    cdef object _txn
    cdef object _meta  # None, or (event_timestamp, ordering_key) as sent


cdef MessageId new_message_id(int64_t ledger_id, int64_t entry_id, int32_t partition,
                              int32_t batch_index, int32_t batch_size)
cdef object message_id_type()
