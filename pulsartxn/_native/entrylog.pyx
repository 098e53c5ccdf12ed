# cython: language_level=3
"""The LMDB entry log of a partition: appends, scans and trims of encoded entries.

Entries are encoded by entrycodec.pyx and decoded by entrydecode.pyx: a bulk append cimports the
encoder's message gathering and entry writer and runs them without the GIL.
"""

from cpython.bytes cimport PyBytes_Check
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc

from .entrycodec cimport Messages, entry_end, gather, header_ints_plain, write_entry

import struct
import threading

from .checks import check_bulk, entry_range
from .entrycodec import encode_entries
from .entrydecode import decode_entries
from .entryformat import DEFAULT_MAX_ENTRY_BYTES, DecodedEntries, check_header_ints

_BE64 = struct.Struct(">Q")


# Entries of a bulk append are encoded into a per-thread arena that is reused from call to
# call: fresh memory costs a page fault per 4 KiB on first touch, more than the encoding
# itself. Arena rounds are bounded so the arena stays small.
ARENA_ROUND_BYTES = 16 * 1024 * 1024
_arenas = threading.local()


cdef bytearray _arena(size_t need, int which):
    name = "buf1" if which else "buf0"
    cdef bytearray buf = getattr(_arenas, name, None)
    if buf is None or len(buf) < need:
        buf = bytearray(max(need, 1 << 20))
        setattr(_arenas, name, buf)
    return buf


_encoder_pool = None


def _encoder():
    """The one background thread that encodes the next arena round of bulk appends."""
    global _encoder_pool
    if _encoder_pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _encoder_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pulsartxn-encode")
    return _encoder_pool


cdef class _Round:
    """One arena round of a bulk append: its entries' message ranges, offsets and sequences."""

    cdef Messages m
    cdef readonly list plan
    cdef readonly bytearray buf
    cdef uint64_t txn_msb, txn_lsb, producer_id
    cdef int64_t publish_time

    def __init__(self, Messages m, list plan, bytearray buf, txn_msb, txn_lsb, producer_id,
                 publish_time):
        self.m = m
        self.plan = plan
        self.buf = buf
        self.txn_msb = txn_msb
        self.txn_lsb = txn_lsb
        self.producer_id = producer_id
        self.publish_time = publish_time

    def run(self):
        cdef Py_ssize_t n = len(self.plan), j
        cdef int64_t *spec = <int64_t *>malloc((n * 5 if n else 1) * sizeof(int64_t))
        if spec == NULL:
            raise MemoryError()
        for j in range(n):
            a, b, off, total, seq = self.plan[j]
            spec[5 * j] = a
            spec[5 * j + 1] = b
            spec[5 * j + 2] = off
            spec[5 * j + 3] = total
            spec[5 * j + 4] = <int64_t><uint64_t>seq
        cdef uint8_t *base = <uint8_t *>(<char *>self.buf)
        try:
            with nogil:
                for j in range(n):
                    write_entry(base + spec[5 * j + 2], self.m, spec[5 * j], spec[5 * j + 1], 0,
                                self.txn_msb, self.txn_lsb, self.producer_id,
                                <uint64_t>spec[5 * j + 4], self.publish_time,
                                <size_t>spec[5 * j + 3])
        finally:
            free(spec)


# -- the entry log on LMDB ------------------------------------------------------------------

cdef uint64_t _first_id(first) except? 0:
    if not isinstance(first, int) or isinstance(first, bool) or not 0 <= first < 1 << 63:
        raise ValueError(f"first must be an entry id (0 <= id < 2**63), not {first!r}")
    return first


cdef class EntryLog:
    """One partition's ledger: a named LMDB database, u64 big-endian entry id -> entry.

    Every method takes the caller's py-lmdb transaction, so appends share the caller's (group)
    commit. Entry ids are never reused: trimming keeps the last entry.
    """

    def __init__(self, env, name, db=None):
        """The log in the named database `name` of `env` (or the handle `db` of it, opened by
        the caller). A database is opened inside a write transaction begun here: py-lmdb's
        open_db without one takes LMDB's writer lock while holding the GIL, and deadlocks
        with a thread that holds the writer lock and waits for the GIL."""
        if not isinstance(name, bytes) or not name:
            raise TypeError(f"EntryLog name must be non-empty bytes, not {name!r}")
        self.env = env
        self.name = name
        if db is None:
            with env.begin(write=True) as txn:
                db = env.open_db(name, txn=txn, create=True)
        self.db = db

    def last_entry_id(self, txn) -> int:
        cursor = txn.cursor(db=self.db)
        if not cursor.last():
            return -1
        return _BE64.unpack(cursor.key())[0]

    def first_entry_id(self, txn) -> int:
        cursor = txn.cursor(db=self.db)
        if not cursor.first():
            return -1
        return _BE64.unpack(cursor.key())[0]

    def count(self, txn) -> int:
        return txn.stat(self.db)["entries"]

    def append(self, txn, entries, first=None) -> int:
        """Append entries after the last one in one putmulti; returns the first new entry id.
        `first`: their ids start there instead (after the last one, or into ids that hold no
        entry: a claim made before later entries were written; ValueError if one does)."""
        if not isinstance(entries, (list, tuple)):
            raise TypeError(f"entries must be a list of bytes, not {type(entries).__name__}")
        cdef Py_ssize_t i, n = len(entries)
        for i in range(n):
            if not PyBytes_Check(entries[i]):
                raise TypeError(f"entries[{i}] must be bytes, not {type(entries[i]).__name__}")
        pack = _BE64.pack
        cdef int64_t last
        cdef uint64_t start
        if first is None:
            start = self.last_entry_id(txn) + 1
        else:
            start = _first_id(first)
            if n == 1 and txn.put(pack(start), entries[0], db=self.db, append=True):
                return start  # after the last entry (LMDB refuses an append below it)
        if n == 0:
            return start
        last = self.last_entry_id(txn)
        if <int64_t>start <= last:  # filling claimed ids below the last entry
            for i in range(n):
                if txn.get(pack(start + i), db=self.db) is not None:
                    raise ValueError(f"{self.name!r}: entry {start + i} exists already")
            for i in range(n):
                txn.put(pack(start + i), entries[i], db=self.db)
            return start
        if n == 1:  # one put, no row list (a single send, a marker)
            if not txn.put(pack(start), entries[0], db=self.db, append=True):
                raise RuntimeError(f"{self.name!r}: appended 0 of 1 entries")
            return start
        rows = [(pack(start + i), entries[i]) for i in range(n)]
        consumed, added = txn.cursor(db=self.db).putmulti(rows, append=True)
        if added != n:
            raise RuntimeError(f"{self.name!r}: appended {added} of {n} entries")
        return start

    def append_messages(self, txn, values, keys=None, properties=None, *, batch_size=1000,
                        max_entry_bytes=DEFAULT_MAX_ENTRY_BYTES, txn_msb=0, txn_lsb=0,
                        producer_id=0, first_sequence_id=0, publish_time=0, metadata=None,
                        first_entry_id=None):
        """Encode a bulk of messages into entries (as encode_entries) and append them (from
        `first_entry_id` on, if given: after the last entry, else ValueError).

        Returns (first entry id, messages per entry). The entries are written from a reused
        per-thread arena, never materialised as bytes objects.
        """
        if not header_ints_plain(txn_msb, txn_lsb, producer_id, first_sequence_id, publish_time, 0):
            check_header_ints(txn_msb, txn_lsb, producer_id, first_sequence_id, publish_time, 0)
        check_bulk(batch_size, max_entry_bytes, first_sequence_id, 1)
        cdef Messages m = gather(values, keys, properties, metadata)
        check_bulk(batch_size, max_entry_bytes, first_sequence_id, m.n)
        cdef int64_t last = self.last_entry_id(txn)
        cdef uint64_t first = last + 1 if first_entry_id is None else _first_id(first_entry_id)
        if <int64_t>first <= last:
            raise ValueError(f"{self.name!r}: entry {first} is not after the last ({last})")
        cdef uint64_t seq = first_sequence_id, total
        cdef Py_ssize_t i0 = 0, i
        cdef size_t used
        cdef list counts = []
        cdef list rounds = []
        cdef list plan = []
        # Plan every entry, in rounds of at most ARENA_ROUND_BYTES.
        used = 0
        while i0 < m.n:
            i = entry_end(m, i0, batch_size, max_entry_bytes, &total)
            if plan and used + total > ARENA_ROUND_BYTES:
                rounds.append(plan)
                plan = []
                used = 0
            plan.append((i0, i, used, total, seq))
            used += total
            seq += <uint64_t>(i - i0)
            counts.append(i - i0)
            i0 = i
        if plan:
            rounds.append(plan)
        cdef _Round r
        encoded = [_Round(m, p, _arena(p[-1][2] + p[-1][3], k % 2), txn_msb, txn_lsb, producer_id,
                          publish_time) for k, p in enumerate(rounds[:2])]
        cursor = txn.cursor(db=self.db)
        pack = _BE64.pack
        next_id = first
        pending = None
        # Two arenas: while LMDB copies round k from one, round k + 1 is encoded into the other
        # (without the GIL, on the encoder thread), so the copy and the encoding overlap.
        try:
            for k in range(len(rounds)):
                if k == 0:
                    (<_Round>encoded[0]).run()
                else:
                    pending.result()
                r = encoded[k % 2]
                if k + 1 < len(rounds):
                    if k + 1 >= 2:
                        encoded[(k + 1) % 2] = _Round(
                            m, rounds[k + 1], _arena(rounds[k + 1][-1][2] + rounds[k + 1][-1][3], (k + 1) % 2),
                            txn_msb, txn_lsb, producer_id, publish_time)
                    pending = _encoder().submit((<_Round>encoded[(k + 1) % 2]).run)
                view = memoryview(r.buf)
                try:
                    rows = [(pack(next_id + j), view[e[2]:e[2] + e[3]]) for j, e in enumerate(r.plan)]
                    consumed, added = cursor.putmulti(rows, append=True)
                finally:
                    rows = None
                    view.release()
                if added != len(r.plan):
                    if pending is not None:
                        pending.result()
                    raise RuntimeError(f"{self.name!r}: appended {added} of {len(r.plan)} entries")
                next_id += len(r.plan)
        finally:
            if pending is not None:
                try:
                    pending.result()  # never leave the encoder writing into an arena we reuse
                except BaseException:
                    pass
        return first, counts

    def scan(self, txn, start=0, end=None, limit=None):
        """(entry ids, buffers) of entries start..end-1; buffers live as long as txn."""
        lo, hi, cap = entry_range(start, end, limit)
        ids = []
        bufs = []
        if cap == 0 or (hi is not None and lo >= hi):
            return ids, bufs
        cursor = txn.cursor(db=self.db)
        if not cursor.set_range(_BE64.pack(lo)):
            return ids, bufs
        unpack = _BE64.unpack
        for key, value in cursor.iternext():
            entry_id = unpack(key)[0]
            if hi is not None and entry_id >= hi:
                break
            ids.append(entry_id)
            bufs.append(value)
            if cap is not None and len(ids) >= cap:
                break
        return ids, bufs

    def read(self, txn, start=0, end=None, limit=None, verify=True) -> DecodedEntries:
        ids, bufs = self.scan(txn, start, end, limit)
        return decode_entries(ids, bufs, verify)

    def trim_below(self, txn, entry_id) -> int:
        """Delete the entries below entry_id (the last entry always stays); returns how many."""
        bound, _, _ = entry_range(entry_id, None, None)
        last = self.last_entry_id(txn)
        if last < 0:
            return 0
        bound = min(bound, last)
        cursor = txn.cursor(db=self.db)
        removed = 0
        if not cursor.first():
            return 0
        while _BE64.unpack(cursor.key())[0] < bound:
            if not cursor.delete():
                break
            removed += 1
        return removed
