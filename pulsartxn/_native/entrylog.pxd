from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t


cdef enum:
    ENTRY_HEADER_SIZE = 56
    NO_KEY = 0xFFFFFFFF


cdef struct EntryHead:
    uint8_t marker_type
    uint64_t txn_msb
    uint64_t txn_lsb
    uint64_t producer_id
    uint64_t sequence_id
    int64_t publish_time
    uint32_t message_count


cdef class EntryLog:
    cdef readonly object env
    cdef readonly object db
    cdef readonly bytes name
