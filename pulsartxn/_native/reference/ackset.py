"""Pure-Python twin of pulsartxn._native.ackset: AckSet as a list of 64-bit word ints."""

from __future__ import annotations

from ...errors import TransactionConflict
from ..checks import as_int

MAX_SIZE = 1 << 20
_U64 = (1 << 64) - 1


def _word_list(words) -> list[int]:
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


class AckSet:
    """A bitset over the batch indexes 0..size-1 of one entry."""

    __slots__ = ("_size", "_words")

    def __init__(self, size, full=False):
        n = as_int(size, "size")
        if not 1 <= n <= MAX_SIZE:
            raise ValueError(f"AckSet size {n} out of range 1..{MAX_SIZE}")
        self._size = n
        self._words = [0] * ((n + 63) // 64)
        if full:
            self._assign(0, n, True)

    @property
    def size(self) -> int:
        return self._size

    def _check_index(self, i) -> int:
        k = as_int(i, "index")
        if not 0 <= k < self._size:
            raise IndexError(f"batch index {k} out of range 0..{self._size - 1}")
        return k

    def _check_same(self, other) -> None:
        if not isinstance(other, AckSet):
            raise TypeError(f"expected an AckSet, not {type(other).__name__}")
        if other._size != self._size:
            raise ValueError(f"AckSet sizes differ: {self._size} and {other._size}")

    def _assign(self, start: int, end: int, value: bool) -> None:
        for i in range(start, end):
            if value:
                self._words[i // 64] |= 1 << (i % 64)
            else:
                self._words[i // 64] &= ~(1 << (i % 64)) & _U64

    def set(self, i) -> None:
        self._assign(self._check_index(i), self._check_index(i) + 1, True)

    def clear(self, i) -> None:
        self._assign(self._check_index(i), self._check_index(i) + 1, False)

    def _range(self, start, end):
        s, e = as_int(start, "start"), as_int(end, "end")
        if not 0 <= s <= e <= self._size:
            raise ValueError(f"range [{s}, {e}) is not within 0..{self._size}")
        return s, e

    def set_range(self, start, end) -> None:
        self._assign(*self._range(start, end), True)

    def clear_range(self, start, end) -> None:
        self._assign(*self._range(start, end), False)

    def test(self, i) -> bool:
        k = self._check_index(i)
        return bool(self._words[k // 64] >> (k % 64) & 1)

    def __contains__(self, i) -> bool:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self._size:
            return False
        return bool(self._words[i // 64] >> (i % 64) & 1)

    def overlaps(self, other) -> bool:
        self._check_same(other)
        return any(a & b for a, b in zip(self._words, other._words))

    def overlaps_outside(self, other, exclude) -> bool:
        self._check_same(other)
        self._check_same(exclude)
        return any(a & b & ~c for a, b, c in zip(self._words, other._words, exclude._words))

    def _combine(self, other, op) -> AckSet:
        self._check_same(other)
        out = AckSet(self._size)
        out._words = [op(a, b) & _U64 for a, b in zip(self._words, other._words)]
        return out

    def union(self, other) -> AckSet:
        return self._combine(other, lambda a, b: a | b)

    def intersection(self, other) -> AckSet:
        return self._combine(other, lambda a, b: a & b)

    def difference(self, other) -> AckSet:
        return self._combine(other, lambda a, b: a & ~b)

    def update(self, other) -> None:
        self._words = self.union(other)._words

    def difference_update(self, other) -> None:
        self._words = self.difference(other)._words

    def __or__(self, other):
        return self.union(other) if isinstance(other, AckSet) else NotImplemented

    def __and__(self, other):
        return self.intersection(other) if isinstance(other, AckSet) else NotImplemented

    def __sub__(self, other):
        return self.difference(other) if isinstance(other, AckSet) else NotImplemented

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
        return sum(bin(w).count("1") for w in self._words)

    def __len__(self) -> int:
        return self.cardinality()

    def is_empty(self) -> bool:
        return not any(self._words)

    def is_full(self) -> bool:
        return self.cardinality() == self._size

    def __iter__(self):
        for i in range(self._size):
            if self._words[i // 64] >> (i % 64) & 1:
                yield i

    def to_words(self) -> list[int]:
        return list(self._words)

    @classmethod
    def from_words(cls, words, size) -> AckSet:
        out = cls(size)
        values = _word_list(words)
        if len(values) != len(out._words):
            raise ValueError(
                f"{len(values)} words for an AckSet of size {out._size} (needs {len(out._words)})"
            )
        tail = out._size % 64
        if tail and values[-1] >> tail:
            raise ValueError(f"words have bits set past size {out._size}")
        out._words = values
        return out

    def to_pulsar_words(self) -> list[int]:
        out = []
        for i, w in enumerate(self._words):
            inv = ~w & _U64
            if i == len(self._words) - 1 and self._size % 64:
                inv &= (1 << (self._size % 64)) - 1
            out.append(inv - (1 << 64) if inv >= 1 << 63 else inv)
        return out

    @classmethod
    def from_pulsar_words(cls, words, size) -> AckSet:
        remaining = cls.from_words(words, size)
        out = cls(size, full=True)
        out.difference_update(remaining)
        return out

    def copy(self) -> AckSet:
        return AckSet.from_words(self._words, self._size)

    def __eq__(self, other):
        if not isinstance(other, AckSet):
            return NotImplemented
        return self._size == other._size and self._words == other._words

    __hash__ = None

    def __reduce__(self):
        return (AckSet.from_words, (self.to_words(), self._size))

    def __repr__(self) -> str:
        return f"AckSet(size={self._size}, {list(self)})"


def _position(ledger_id, entry_id) -> tuple[int, int]:
    lid = as_int(ledger_id, "ledger_id")
    eid = as_int(entry_id, "entry_id")
    if not 0 <= lid <= _U64:
        raise ValueError(f"ledger_id {lid} out of range 0..2^64-1")
    if not 0 <= eid <= _U64:
        raise ValueError(f"entry_id {eid} out of range 0..2^64-1")
    return (lid, eid)


class PendingAckIndex:
    """The twin keeps, per entry, only the holders; conflicts are found by looking at each."""

    def __init__(self):
        self._entries: dict[tuple[int, int], dict] = {}

    def _conflict(self, holders: dict, txn, acks, pos):
        for other, held in holders.items():
            if other == txn:
                continue
            if acks is None or held is None:
                return other
            if acks.size != held.size:
                raise ValueError(
                    f"AckSet size {acks.size} differs from size {held.size} held on "
                    f"ledger {pos[0]} entry {pos[1]}"
                )
            if acks.overlaps(held):
                return other
        return None

    def check(self, ledger_id, entry_id, txn, ack_set=None):
        pos = _position(ledger_id, entry_id)
        if ack_set is not None and not isinstance(ack_set, AckSet):
            raise TypeError(f"ack_set must be an AckSet or None, not {type(ack_set).__name__}")
        return self._conflict(self._entries.get(pos, {}), txn, ack_set, pos)

    def add(self, ledger_id, entry_id, txn, ack_set=None) -> None:
        pos = _position(ledger_id, entry_id)
        if ack_set is not None and not isinstance(ack_set, AckSet):
            raise TypeError(f"ack_set must be an AckSet or None, not {type(ack_set).__name__}")
        hash(txn)
        holders = self._entries.get(pos, {})
        other = self._conflict(holders, txn, ack_set, pos)
        if other is not None:
            raise TransactionConflict(
                f"ledger {pos[0]} entry {pos[1]}: ack by transaction {txn} conflicts with "
                f"the pending ack of transaction {other}"
            )
        if ack_set is None:
            holders[txn] = None
        elif txn in holders and holders[txn] is None:
            pass
        elif txn in holders:
            holders[txn] = holders[txn].union(ack_set)
        else:
            holders[txn] = ack_set.copy()
        self._entries[pos] = holders

    def is_pending(self, ledger_id, entry_id, batch_index=-1) -> bool:
        holders = self._entries.get(_position(ledger_id, entry_id))
        if not holders:
            return False
        if batch_index < 0:
            return True
        return any(a is None or batch_index in a for a in holders.values())

    def holders(self, ledger_id, entry_id) -> dict:
        holders = self._entries.get(_position(ledger_id, entry_id), {})
        return {t: (None if a is None else a.copy()) for t, a in holders.items()}

    def entries_of(self, txn) -> list:
        return [
            (pos[0], pos[1], None if h[txn] is None else h[txn].copy())
            for pos, h in sorted(self._entries.items())
            if txn in h
        ]

    def release(self, txn) -> list:
        out = []
        for pos in sorted(self._entries):
            holders = self._entries[pos]
            if txn in holders:
                out.append((pos[0], pos[1], holders.pop(txn)))
                if not holders:
                    del self._entries[pos]
        return out

    def transactions(self) -> list:
        return list({t for h in self._entries.values() for t in h})

    def __contains__(self, position) -> bool:
        try:
            ledger_id, entry_id = position
        except (TypeError, ValueError):
            return False
        return (ledger_id, entry_id) in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def __repr__(self) -> str:
        return f"PendingAckIndex(<{len(self._entries)} entries>)"
