"""Pure-Python twin of pulsartxn._native.txnid: TxnID and TxnIdAllocator on Python ints."""

from __future__ import annotations

from functools import total_ordering

import numpy as np

from ...errors import excerpt
from ..checks import as_int

MAX_COORDINATOR = 0xFFFF
MAX_SEQUENCE = (1 << 112) - 1
_MASK64 = (1 << 64) - 1


@total_ordering
class TxnID:
    """A transaction id: TxnID(coordinator_id, sequence). Immutable, ordered, hashable."""

    __slots__ = ("_value",)

    def __init__(self, coordinator_id, sequence):
        c = as_int(coordinator_id, "coordinator_id")
        s = as_int(sequence, "sequence")
        if not 0 <= c <= MAX_COORDINATOR:
            raise ValueError(f"coordinator_id {c} out of range 0..65535")
        if not 0 <= s <= MAX_SEQUENCE:
            raise ValueError(f"sequence {s} out of range 0..2^112-1")
        object.__setattr__(self, "_value", (c << 112) | s)

    def __setattr__(self, name, value):
        raise AttributeError("TxnID is immutable")

    @classmethod
    def _of(cls, value: int) -> TxnID:
        t = object.__new__(cls)
        object.__setattr__(t, "_value", value)
        return t

    @property
    def coordinator_id(self) -> int:
        return self._value >> 112

    @property
    def sequence(self) -> int:
        return self._value & MAX_SEQUENCE

    @property
    def most_sig_bits(self) -> int:
        return self._value >> 64

    @property
    def least_sig_bits(self) -> int:
        return self._value & _MASK64

    @classmethod
    def from_int(cls, value) -> TxnID:
        v = as_int(value, "value")
        if not 0 <= v < (1 << 128):
            raise ValueError(f"TxnID integer {v} out of range 0..2^128-1")
        return cls._of(v)

    @classmethod
    def from_halves(cls, most_sig_bits, least_sig_bits) -> TxnID:
        hi = as_int(most_sig_bits, "most_sig_bits")
        lo = as_int(least_sig_bits, "least_sig_bits")
        if not 0 <= hi <= _MASK64:
            raise ValueError(f"most_sig_bits {hi} out of range 0..2^64-1")
        if not 0 <= lo <= _MASK64:
            raise ValueError(f"least_sig_bits {lo} out of range 0..2^64-1")
        return cls._of((hi << 64) | lo)

    @classmethod
    def parse(cls, text) -> TxnID:
        if not isinstance(text, str):
            raise TypeError(f"TxnID.parse takes a str, not {type(text).__name__} ({excerpt(text)})")
        parts = text.split(":")
        if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError(
                f"not a TxnID: {excerpt(text)} (expected '<coordinator_id>:<sequence>')"
            )
        return cls(int(parts[0]), int(parts[1]))

    def pack(self) -> bytes:
        return self._value.to_bytes(16, "big")

    @classmethod
    def unpack(cls, data) -> TxnID:
        try:
            raw = memoryview(data).cast("B")
        except TypeError:
            raise TypeError(f"TxnID.unpack takes 16 bytes, not {type(data).__name__}") from None
        if raw.nbytes != 16:
            raise ValueError(f"TxnID.unpack takes exactly 16 bytes, got {raw.nbytes}")
        return cls._of(int.from_bytes(raw, "big"))

    def __int__(self) -> int:
        return self._value

    def __str__(self) -> str:
        return f"{self.coordinator_id}:{self.sequence}"

    def __repr__(self) -> str:
        return f"TxnID({self.coordinator_id}, {self.sequence})"

    def __hash__(self) -> int:
        return hash(self._value)

    def __eq__(self, other):
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._value == other._value

    def __lt__(self, other):
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._value < other._value

    def __reduce__(self):
        return (TxnID, (self.coordinator_id, self.sequence))


class TxnIdAllocator:
    """Hands out one coordinator's TxnIDs; see the native module for the reservation contract."""

    def __init__(self, coordinator_id, next_sequence=0, *, block_size=None, reserve=None):
        c = as_int(coordinator_id, "coordinator_id")
        if not 0 <= c <= MAX_COORDINATOR:
            raise ValueError(f"coordinator_id {c} out of range 0..65535")
        s = as_int(next_sequence, "next_sequence")
        if not 0 <= s <= MAX_SEQUENCE + 1:
            raise ValueError(f"next_sequence {s} out of range 0..2^112")
        if reserve is not None and not callable(reserve):
            raise TypeError(f"reserve must be callable, not {type(reserve).__name__}")
        if block_size is None:
            block_size = 1024 if reserve is not None else 0
        b = as_int(block_size, "block_size")
        if reserve is not None and b < 1:
            raise ValueError(f"block_size {b} must be at least 1 when reserve is given")
        if b < 0:
            raise ValueError(f"block_size {b} must not be negative")
        self.coordinator_id = c
        self._next = s
        self.block_size = b
        self._reserve = reserve
        self.reserved_until = s if reserve is not None else None

    @property
    def next_sequence(self) -> int:
        return self._next

    def _ensure_reserved(self, end: int) -> None:
        if self._reserve is None or end <= self.reserved_until:
            return
        mark = min(max(end, self._next + self.block_size), MAX_SEQUENCE + 1)
        self._reserve(mark)
        self.reserved_until = mark

    def _exhausted_error(self, n: int) -> OverflowError:
        return OverflowError(
            f"coordinator {self.coordinator_id}: cannot allocate {n} more TxnIDs, "
            f"sequence space (2^112) exhausted at {self._next}"
        )

    def next(self) -> TxnID:
        if self._next > MAX_SEQUENCE:
            raise self._exhausted_error(1)
        self._ensure_reserved(self._next + 1)
        t = TxnID(self.coordinator_id, self._next)
        self._next += 1
        return t

    def allocate(self, n):
        count = as_int(n, "n")
        if count < 0:
            raise ValueError(f"n {count} must not be negative")
        if self._next + count > MAX_SEQUENCE + 1:
            raise self._exhausted_error(count)
        self._ensure_reserved(self._next + count)
        msb = np.empty(count, dtype=np.uint64)
        lsb = np.empty(count, dtype=np.uint64)
        top = self.coordinator_id << 112
        for i in range(count):
            value = top | (self._next + i)
            msb[i] = value >> 64
            lsb[i] = value & _MASK64
        self._next += count
        return msb, lsb

    def __repr__(self) -> str:
        return (
            f"TxnIdAllocator(coordinator_id={self.coordinator_id}, "
            f"next_sequence={self.next_sequence}, reserved_until={self.reserved_until})"
        )
