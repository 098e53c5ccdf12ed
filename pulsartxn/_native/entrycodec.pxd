from cpython.bool cimport PyBool_Check
from cpython.long cimport PyLong_Check
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t


cdef enum:
    ENTRY_HEADER_SIZE = 56
    NO_KEY = 0xFFFFFFFF


# -- the magic and little-endian fields (the encoder writes them, the decoder reads them) ----

cdef inline void put_magic(uint8_t *p) noexcept nogil:
    p[0] = 0x50     # "PTXE"
    p[1] = 0x54
    p[2] = 0x58
    p[3] = 0x45


cdef inline bint has_magic(const uint8_t *p) noexcept nogil:
    return p[0] == 0x50 and p[1] == 0x54 and p[2] == 0x58 and p[3] == 0x45


cdef inline void put_u32(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = (v >> 24) & 0xFF


cdef inline void put_u64(uint8_t *p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = (v >> (8 * i)) & 0xFF


cdef inline uint32_t get_u32(const uint8_t *p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint64_t get_u64(const uint8_t *p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


cdef struct EntryHead:
    uint8_t marker_type
    uint64_t txn_msb
    uint64_t txn_lsb
    uint64_t producer_id
    uint64_t sequence_id
    int64_t publish_time
    uint32_t message_count


# Declared here with their inline methods so that a module cimporting this one (the entry
# log's bulk append) reads the messages at C speed, without a virtual call per message.
cdef class Messages:
    cdef Py_ssize_t n
    cdef bint arrow
    cdef const uint8_t *data        # arrow: the data buffer
    cdef const int32_t *offs32      # arrow: offsets, 32-bit (binary/string) ...
    cdef const int64_t *offs64      # ... or 64-bit (large_binary/large_string)
    cdef const uint8_t **vptr       # list: value pointers
    cdef uint64_t *vlen             # list: value lengths
    cdef const uint8_t **kptr       # NULL when no message has a key
    cdef int64_t *klen              # -1: no key
    cdef const uint8_t **pptr       # NULL when no message has properties
    cdef uint64_t *plen
    cdef const uint8_t **mptr       # NULL when no message has metadata (FLAG_METADATA)
    cdef uint64_t *mlen
    cdef list keep                  # the Python objects the pointers point into

    cdef inline void value(self, Py_ssize_t i, const uint8_t **ptr, uint64_t *length) noexcept nogil:
        cdef int64_t a, b
        if self.arrow:
            if self.offs32 != NULL:
                a = self.offs32[i]
                b = self.offs32[i + 1]
            else:
                a = self.offs64[i]
                b = self.offs64[i + 1]
            ptr[0] = self.data + a
            length[0] = <uint64_t>(b - a)
        else:
            ptr[0] = self.vptr[i]
            length[0] = self.vlen[i]

    cdef inline uint64_t size(self, Py_ssize_t i) noexcept nogil:
        cdef const uint8_t *ptr
        cdef uint64_t length
        self.value(i, &ptr, &length)
        cdef uint64_t s = 8 + length     # the key and payload length fields
        if self.kptr != NULL and self.klen[i] >= 0:
            s += <uint64_t>self.klen[i]
        s += self.plen[i] if self.pptr != NULL else 4
        if self.mptr != NULL:
            s += self.mlen[i]
        return s


# Header fields that are plain ints in range: checked here without a Python call; anything
# else goes to entryformat.check_header_ints, which accepts numpy ints and raises the errors.
cdef inline bint _int(object v):
    return PyLong_Check(v) and not PyBool_Check(v)  # IntEnum members count, bools do not


cdef inline bint _u64_int(object v):
    return _int(v) and 0 <= v <= 0xFFFFFFFFFFFFFFFF


cdef inline bint header_ints_plain(object txn_msb, object txn_lsb, object producer_id,
                                   object sequence_id, object publish_time, object marker_type):
    return (_u64_int(txn_msb) and _u64_int(txn_lsb) and _u64_int(producer_id)
            and _u64_int(sequence_id) and _int(publish_time)
            and -0x8000000000000000 <= publish_time <= 0x7FFFFFFFFFFFFFFF
            and _int(marker_type) and 0 <= marker_type <= 255)


cdef Messages gather(values, keys, properties, metadata=*)
cdef void write_entry(uint8_t *out, Messages m, Py_ssize_t i0, Py_ssize_t i1, uint8_t marker,
                      uint64_t txn_msb, uint64_t txn_lsb, uint64_t producer_id,
                      uint64_t sequence_id, int64_t publish_time, size_t total) noexcept nogil
cdef Py_ssize_t entry_end(Messages m, Py_ssize_t i0, Py_ssize_t limit, uint64_t cap,
                          uint64_t *total) noexcept
