# C-level declarations of pulsartxn._native.entrylog, for other Cython modules to cimport:
#     from pulsartxn._native.entrylog cimport EntryHead, read_head, check_entry, ...
# The format itself is described in pulsartxn/_native/entryformat.py.
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t


cdef extern from *:
    """
    #define PTX_ENTRY_NO_KEY 0xFFFFFFFFu
    #define PTX_ENTRY_MAX_FIELD 0xFFFFFFFEu
    """
    const uint32_t ENTRY_NO_KEY "PTX_ENTRY_NO_KEY"        # key_len of a message without a key
    const uint32_t ENTRY_MAX_FIELD "PTX_ENTRY_MAX_FIELD"  # longest key or payload


cdef enum:
    ENTRY_HEADER_SIZE = 56
    ENTRY_VERSION = 1
    ENTRY_CRC_OFFSET = 52
    ENTRY_MIN_MESSAGE = 12    # key_len + n_properties + payload_len, all empty


# What a validation found; the Python modules turn a code into words (REASONS).
cdef enum EntryStatus:
    ENTRY_OK = 0
    ENTRY_SHORT = 1           # shorter than the header
    ENTRY_BAD_MAGIC = 2
    ENTRY_BAD_VERSION = 3
    ENTRY_BAD_FLAGS = 4
    ENTRY_BAD_CHECKSUM = 5
    ENTRY_TRUNCATED = 6       # a length runs past the end
    ENTRY_TRAILING = 7        # bytes after the last message
    ENTRY_BAD_COUNT = 8       # more messages than the bytes can hold
    ENTRY_BAD_UTF8 = 9        # a property key or value is not UTF-8


cdef struct EntryHead:
    uint8_t marker_type
    uint64_t txn_msb
    uint64_t txn_lsb
    uint64_t producer_id
    uint64_t sequence_id
    int64_t publish_time
    uint32_t message_count


# Running totals of validated entries: the sizes of the columns they decode into.
cdef struct EntrySizes:
    uint64_t messages
    uint64_t key_bytes
    uint64_t value_bytes
    uint64_t pairs
    uint64_t prop_key_bytes
    uint64_t prop_value_bytes


cdef inline uint32_t load_u32le(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


cdef inline uint64_t load_u64le(const uint8_t *p) noexcept nogil:
    return <uint64_t>load_u32le(p) | (<uint64_t>load_u32le(p + 4) << 32)


cdef inline void store_u32le(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>v
    p[1] = <uint8_t>(v >> 8)
    p[2] = <uint8_t>(v >> 16)
    p[3] = <uint8_t>(v >> 24)


cdef inline void store_u64le(uint8_t *p, uint64_t v) noexcept nogil:
    store_u32le(p, <uint32_t>v)
    store_u32le(p + 4, <uint32_t>(v >> 32))


# Header checks only (size, magic, version, flags), filling `head`.
cdef EntryStatus read_head(const uint8_t *p, size_t size, EntryHead *head) noexcept nogil
# The CRC-32C an entry of `size` bytes should carry (over [0:52] and [56:size]); size >= 56.
cdef uint32_t entry_checksum(const uint8_t *p, size_t size) noexcept nogil
# Whole-entry validation: every length checked against the bytes left (no read out of bounds),
# the checksum when `verify`; adds the entry's column sizes to `sizes` when it is well formed.
cdef EntryStatus check_entry(const uint8_t *p, size_t size, bint verify,
                             EntrySizes *sizes) noexcept nogil
# Write the 56-byte header for `head` (checksum field zero) at out.
cdef void write_head(uint8_t *out, const EntryHead *head) noexcept nogil


cdef class EntryLog:
    cdef readonly object env
    cdef readonly object db
    cdef readonly bytes name
