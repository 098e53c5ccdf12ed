# cython: language_level=3
"""AckSet, the batch-index bitset of one entry, and PendingAckIndex, a subscription's pending acks.

AckSet: bit i set means batch index i is in the set (acknowledged, or held by a transaction's
pending ack). Pulsar's ack_set words carry the complement (the indexes still unacknowledged);
``to_pulsar_words``/``from_pulsar_words`` convert. Sets of up to 256 indexes keep their words
inline, with no allocation.
"""

cimport cython
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memset

from .includes.bits cimport (
    ptx_bits_assign_range,
    ptx_bits_count,
    ptx_bits_overlap,
    ptx_bits_overlap_outside,
    ptx_mask_range,
)

import operator

from pulsartxn.errors import TransactionConflict

from .checks import as_int

MAX_SIZE = 1 << 20
_U64 = (1 << 64) - 1


cdef inline Py_ssize_t _as_index(object value, str what) except? -1:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__} ({value!r})") from None


cdef class AckSet:
    """A bitset over the batch indexes 0..size-1 of one entry."""

    def __cinit__(self, *args, **kwargs):
        self.words = self.inline_words
        self.nbits = 0
        self.nwords = 0

    def __dealloc__(self):
        if self.words != self.inline_words:
            free(self.words)

    def __init__(self, size, full=False):
        cdef Py_ssize_t n = _as_index(size, "size")
        if not 1 <= n <= MAX_SIZE:
            raise ValueError(f"AckSet size {n} out of range 1..{MAX_SIZE}")
        self._alloc(n)
        if full:
            ptx_bits_assign_range(self.words, 0, n, 1)

    cdef int _alloc(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t nw = (n + 63) >> 6
        if self.words != self.inline_words:
            free(self.words)
            self.words = self.inline_words
        if nw > INLINE_WORDS:
            self.words = <uint64_t *>malloc(nw * sizeof(uint64_t))
            if self.words == NULL:
                self.words = self.inline_words
                raise MemoryError(f"no memory for an AckSet of {n} bits")
        memset(self.words, 0, nw * sizeof(uint64_t))
        self.nbits = n
        self.nwords = nw
        return 0

    cdef AckSet _clone(self):
        cdef AckSet out = AckSet.__new__(AckSet)
        out._alloc(self.nbits)
        memcpy(out.words, self.words, self.nwords * sizeof(uint64_t))
        return out

    cdef int _check_index(self, Py_ssize_t i) except -1:
        if not 0 <= i < self.nbits:
            raise IndexError(f"batch index {i} out of range 0..{self.nbits - 1}")
        return 0

    cdef int _check_same(self, AckSet other) except -1:
        if other.nbits != self.nbits:
            raise ValueError(f"AckSet sizes differ: {self.nbits} and {other.nbits}")
        return 0

    @property
    def size(self) -> int:
        return self.nbits

    def set(self, i) -> None:
        cdef Py_ssize_t k = _as_index(i, "index")
        self._check_index(k)
        self.words[k >> 6] |= (<uint64_t>1) << (k & 63)

    def clear(self, i) -> None:
        cdef Py_ssize_t k = _as_index(i, "index")
        self._check_index(k)
        self.words[k >> 6] &= ~((<uint64_t>1) << (k & 63))

    def _range(self, start, end):
        cdef Py_ssize_t s = _as_index(start, "start"), e = _as_index(end, "end")
        if not 0 <= s <= e <= self.nbits:
            raise ValueError(f"range [{s}, {e}) is not within 0..{self.nbits}")
        return s, e

    def set_range(self, start, end) -> None:
        s, e = self._range(start, end)
        ptx_bits_assign_range(self.words, s, e, 1)

    def clear_range(self, start, end) -> None:
        s, e = self._range(start, end)
        ptx_bits_assign_range(self.words, s, e, 0)

    def test(self, i) -> bool:
        cdef Py_ssize_t k = _as_index(i, "index")
        self._check_index(k)
        return (self.words[k >> 6] >> (k & 63)) & 1 == 1

    def __contains__(self, i) -> bool:
        if isinstance(i, bool) or not isinstance(i, int):
            return False
        cdef Py_ssize_t k = i
        if not 0 <= k < self.nbits:
            return False
        return (self.words[k >> 6] >> (k & 63)) & 1 == 1

    def overlaps(self, AckSet other not None) -> bool:
        self._check_same(other)
        return ptx_bits_overlap(self.words, other.words, self.nwords) != 0

    def overlaps_outside(self, AckSet other not None, AckSet exclude not None) -> bool:
        """Whether self & other & ~exclude is not empty (other's bits not held in exclude)."""
        self._check_same(other)
        self._check_same(exclude)
        return ptx_bits_overlap_outside(self.words, other.words, exclude.words, self.nwords) != 0

    @cython.boundscheck(False)
    def union(self, AckSet other not None) -> AckSet:
        self._check_same(other)
        cdef AckSet out = self._clone()
        cdef Py_ssize_t i
        for i in range(self.nwords):
            out.words[i] |= other.words[i]
        return out

    def intersection(self, AckSet other not None) -> AckSet:
        self._check_same(other)
        cdef AckSet out = self._clone()
        cdef Py_ssize_t i
        for i in range(self.nwords):
            out.words[i] &= other.words[i]
        return out

    def difference(self, AckSet other not None) -> AckSet:
        self._check_same(other)
        cdef AckSet out = self._clone()
        cdef Py_ssize_t i
        for i in range(self.nwords):
            out.words[i] &= ~other.words[i]
        return out

    def update(self, AckSet other not None) -> None:
        self._check_same(other)
        cdef Py_ssize_t i
        for i in range(self.nwords):
            self.words[i] |= other.words[i]

    def difference_update(self, AckSet other not None) -> None:
        self._check_same(other)
        cdef Py_ssize_t i
        for i in range(self.nwords):
            self.words[i] &= ~other.words[i]

    def __or__(self, other):
        if not isinstance(other, AckSet):
            return NotImplemented
        return self.union(other)

    def __and__(self, other):
        if not isinstance(other, AckSet):
            return NotImplemented
        return self.intersection(other)

    def __sub__(self, other):
        if not isinstance(other, AckSet):
            return NotImplemented
        return self.difference(other)

    def __ior__(self, other):
        if not isinstance(other, AckSet):
            return NotImplemented
        self.update(other)
        return self

    def __isub__(self, other):
        if not isinstance(other, AckSet):
            return NotImplemented
        self.difference_update(other)
        return self

    def cardinality(self) -> int:
        return ptx_bits_count(self.words, self.nwords)

    def __len__(self):
        return ptx_bits_count(self.words, self.nwords)

    def is_empty(self) -> bool:
        cdef Py_ssize_t i
        for i in range(self.nwords):
            if self.words[i]:
                return False
        return True

    def is_full(self) -> bool:
        return <Py_ssize_t>ptx_bits_count(self.words, self.nwords) == self.nbits

    def __iter__(self):
        cdef Py_ssize_t i, b
        cdef uint64_t w
        for i in range(self.nwords):
            w = self.words[i]
            while w:
                b = __builtin_ctzll(w)
                yield (i << 6) + b
                w &= w - 1

    def to_words(self) -> list:
        return [self.words[i] for i in range(self.nwords)]

    @classmethod
    def from_words(cls, words, size) -> AckSet:
        """The set of unsigned 64-bit words (signed int64 words are reinterpreted)."""
        cdef AckSet out = cls(size)
        values = _word_list(words)
        if len(values) != out.nwords:
            raise ValueError(f"{len(values)} words for an AckSet of size {out.nbits} "
                             f"(needs {out.nwords})")
        cdef Py_ssize_t i
        for i in range(out.nwords):
            out.words[i] = values[i]
        cdef Py_ssize_t tail = out.nbits & 63
        if tail and out.words[out.nwords - 1] & ~ptx_mask_range(0, tail):
            raise ValueError(f"words have bits set past size {out.nbits}")
        return out

    def to_pulsar_words(self) -> list:
        """Pulsar's ack_set: the indexes NOT in this set, as signed int64 words."""
        out = []
        cdef Py_ssize_t i, tail = self.nbits & 63
        cdef uint64_t w
        for i in range(self.nwords):
            w = ~self.words[i]
            if i == self.nwords - 1 and tail:
                w &= ptx_mask_range(0, tail)
            out.append(<int64_t>w)
        return out

    @classmethod
    def from_pulsar_words(cls, words, size) -> AckSet:
        """The set of a Pulsar ack_set (whose set bits are the unacknowledged indexes)."""
        cdef AckSet remaining = cls.from_words(words, size)
        cdef AckSet out = cls(size, full=True)
        out.difference_update(remaining)
        return out

    def copy(self) -> AckSet:
        return self._clone()

    def __eq__(self, other):
        if not isinstance(other, AckSet):
            return NotImplemented
        cdef AckSet o = <AckSet>other
        return o.nbits == self.nbits and memcmp(o.words, self.words, self.nwords * sizeof(uint64_t)) == 0

    __hash__ = None

    def __reduce__(self):
        return (AckSet.from_words, (self.to_words(), self.nbits))

    def __repr__(self):
        return f"AckSet(size={self.nbits}, {list(self)})"


cdef extern from *:
    int __builtin_ctzll(unsigned long long x) nogil


def _word_list(words) -> list:
    if hasattr(words, "tolist"):
        words = words.tolist()
    out = []
    for w in words:
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"AckSet words must be ints, not {type(w).__name__}")
        if -(1 << 63) <= w < 0:
            w &= _U64
        elif not 0 <= w <= _U64:
            raise ValueError(f"AckSet word {w} is not a 64-bit value")
        out.append(w)
    return out


# -- pending acks ---------------------------------------------------------------------------

cdef class _Held:
    """The pending acks on one entry: per transaction, its AckSet (None: the whole entry).

    union is None while the entry is held whole; size is the batch size the sets use.
    """

    def __init__(self):
        self.owners = {}
        self.union = None
        self.size = 0


cdef inline object _position(object ledger_id, object entry_id):
    cdef object lid = as_int(ledger_id, "ledger_id")
    cdef object eid = as_int(entry_id, "entry_id")
    if not 0 <= lid <= _U64:
        raise ValueError(f"ledger_id {lid} out of range 0..2^64-1")
    if not 0 <= eid <= _U64:
        raise ValueError(f"entry_id {eid} out of range 0..2^64-1")
    return (lid, eid)


cdef class PendingAckIndex:
    """A subscription's pending acks: (ledger_id, entry_id) -> transactions -> batch indexes.

    ``add`` refuses (TransactionConflict, nothing changed) an ack that overlaps batch indexes
    another transaction holds on the entry; a whole-entry ack (ack_set None) overlaps all.
    The check costs O(words): each entry keeps the union of what its holders hold.
    """

    def __init__(self):
        self._entries = {}
        self._by_txn = {}

    cdef object _conflict(self, _Held held, object txn, AckSet acks, tuple pos):
        """The other transaction a new ack conflicts with, or None. O(words) unless there is
        a conflict: the holders are only looked at one by one to name the one in the way."""
        cdef Py_ssize_t n = len(held.owners)
        if n == 0 or (n == 1 and txn in held.owners):
            return None
        if acks is None or held.union is None:
            for t in held.owners:
                if t != txn:
                    return t
        if acks.nbits != held.size:
            raise ValueError(f"AckSet size {acks.nbits} differs from size {held.size} held on "
                             f"ledger {pos[0]} entry {pos[1]}")
        own = held.owners.get(txn)
        if own is None:
            if not acks.overlaps(held.union):
                return None
        elif not acks.overlaps_outside(held.union, own):
            return None
        for t, theirs in held.owners.items():
            if t != txn and acks.overlaps(theirs):
                return t
        return None

    def check(self, ledger_id, entry_id, txn, ack_set=None):
        """The transaction this ack would conflict with, or None. Changes nothing."""
        pos = _position(ledger_id, entry_id)
        if ack_set is not None and not isinstance(ack_set, AckSet):
            raise TypeError(f"ack_set must be an AckSet or None, not {type(ack_set).__name__}")
        held = self._entries.get(pos)
        if held is None:
            return None
        return self._conflict(<_Held>held, txn, ack_set, pos)

    def add(self, ledger_id, entry_id, txn, ack_set=None) -> None:
        pos = _position(ledger_id, entry_id)
        if ack_set is not None and not isinstance(ack_set, AckSet):
            raise TypeError(f"ack_set must be an AckSet or None, not {type(ack_set).__name__}")
        hash(txn)
        cdef _Held held = self._entries.get(pos)
        cdef AckSet acks = ack_set
        if held is not None:
            other = self._conflict(held, txn, acks, pos)
            if other is not None:
                raise TransactionConflict(
                    f"ledger {pos[0]} entry {pos[1]}: ack by transaction {txn} conflicts with "
                    f"the pending ack of transaction {other}"
                )
        else:
            held = _Held()
        if acks is None:
            held.owners[txn] = None
            held.union = None
            held.size = 0
        elif txn in held.owners and held.owners[txn] is None:
            pass  # already holds the whole entry
        else:
            if held.owners and held.union is None:
                pass  # unreachable: a whole holder conflicts with any other
            mine = held.owners.get(txn)
            held.owners[txn] = acks.copy() if mine is None else (<AckSet>mine).union(acks)
            held.size = acks.nbits
            if held.union is None:
                held.union = acks.copy()
            else:
                held.union.update(acks)
        self._entries[pos] = held
        keys = self._by_txn.get(txn)
        if keys is None:
            keys = self._by_txn[txn] = set()
        keys.add(pos)

    def is_pending(self, ledger_id, entry_id, batch_index=-1) -> bool:
        """Whether a transaction holds the entry (batch_index -1) or that batch index of it."""
        pos = _position(ledger_id, entry_id)
        cdef _Held held = self._entries.get(pos)
        if held is None:
            return False
        if batch_index < 0 or held.union is None:
            return True
        return batch_index in held.union

    def holders(self, ledger_id, entry_id) -> dict:
        """txn -> AckSet (a copy) or None (the whole entry)."""
        pos = _position(ledger_id, entry_id)
        cdef _Held held = self._entries.get(pos)
        if held is None:
            return {}
        return {t: (None if a is None else (<AckSet>a).copy()) for t, a in held.owners.items()}

    def entries_of(self, txn) -> list:
        keys = self._by_txn.get(txn, ())
        out = []
        for pos in sorted(keys):
            acks = (<_Held>self._entries[pos]).owners[txn]
            out.append((pos[0], pos[1], None if acks is None else (<AckSet>acks).copy()))
        return out

    def release(self, txn) -> list:
        """Remove every pending ack of txn; returns them as (ledger_id, entry_id, AckSet|None)."""
        keys = self._by_txn.pop(txn, None)
        if not keys:
            return []
        out = []
        cdef _Held held
        for pos in sorted(keys):
            held = self._entries[pos]
            acks = held.owners.pop(txn)
            out.append((pos[0], pos[1], acks))
            if not held.owners:
                del self._entries[pos]
            elif acks is not None:
                # Holders' sets are disjoint (add refuses an overlap with another's), so
                # the union without this one is the union minus its bits: O(words), not a
                # union over every other holder.
                (<AckSet>held.union).difference_update(acks)
        return out

    def transactions(self) -> list:
        return list(self._by_txn)

    def __contains__(self, position) -> bool:
        try:
            ledger_id, entry_id = position
        except (TypeError, ValueError):
            return False
        return (ledger_id, entry_id) in self._entries

    def __len__(self):
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._by_txn.clear()

    def __repr__(self):
        return f"PendingAckIndex(<{len(self._entries)} entries, {len(self._by_txn)} transactions>)"
