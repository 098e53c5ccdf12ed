# The entry codec's C types, cimportable from here as before the codec had its own module.
from .entrycodec cimport ENTRY_HEADER_SIZE, NO_KEY, EntryHead


cdef class EntryLog:
    cdef readonly object env
    cdef readonly object db
    cdef readonly bytes name
