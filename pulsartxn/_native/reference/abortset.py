"""Pure-Python twin of pulsartxn._native.abortset: a set of 128-bit TxnID integers."""

from __future__ import annotations

import operator
import struct

import numpy as np

from ..checks import as_uint64_array
from .txnid import TxnID

MAGIC = b"PTAS"
VERSION = 1
_HEADER = 16
_MAX_SEQUENCE = (1 << 112) - 1
_MASK64 = (1 << 64) - 1


def _txnid(value, what: str) -> TxnID:
    if not isinstance(value, TxnID):
        raise TypeError(f"{what} takes a TxnID, not {type(value).__name__} ({value!r})")
    return value


class AbortSet:
    """A set of TxnIDs: add, discard, in, len, iteration, bulk probes, pruning, snapshots."""

    def __init__(self, members=()):
        self._ids: set[int] = set()
        for txn in members:
            self.add(txn)

    def add(self, txn) -> None:
        t = _txnid(txn, "AbortSet.add")
        self._ids.add(int(t))

    def discard(self, txn) -> None:
        t = _txnid(txn, "AbortSet.discard")
        self._ids.discard(int(t))

    def remove(self, txn) -> None:
        t = _txnid(txn, "AbortSet.remove")
        if int(t) not in self._ids:
            raise KeyError(txn)
        self._ids.remove(int(t))

    def update(self, members) -> None:
        for txn in members:
            self.add(txn)

    def add_many(self, msb, lsb) -> None:
        hi = as_uint64_array(msb, "msb")
        lo = as_uint64_array(lsb, "lsb")
        if hi.shape[0] != lo.shape[0]:
            raise ValueError(f"msb and lsb differ in length: {hi.shape[0]} != {lo.shape[0]}")
        self._ids.update((h << 64) | l for h, l in zip(hi.tolist(), lo.tolist()))

    def __contains__(self, txn) -> bool:
        if not isinstance(txn, TxnID):
            return False
        return int(txn) in self._ids

    def contains_many(self, msb, lsb) -> np.ndarray:
        hi = as_uint64_array(msb, "msb")
        lo = as_uint64_array(lsb, "lsb")
        if hi.shape[0] != lo.shape[0]:
            raise ValueError(f"msb and lsb differ in length: {hi.shape[0]} != {lo.shape[0]}")
        ids = self._ids
        return np.array(
            [((h << 64) | l) in ids for h, l in zip(hi.tolist(), lo.tolist())], dtype=np.bool_
        ).reshape(hi.shape[0])

    def prune_below(self, coordinator_id, low_watermark) -> int:
        c = operator.index(coordinator_id)
        w = operator.index(low_watermark)
        if not 0 <= c <= 0xFFFF:
            raise ValueError(f"coordinator_id {c} out of range 0..65535")
        if not 0 <= w <= _MAX_SEQUENCE + 1:
            raise ValueError(f"low_watermark {w} out of range 0..2^112")
        doomed = {v for v in self._ids if (v >> 112) == c and (v & _MAX_SEQUENCE) < w}
        self._ids -= doomed
        return len(doomed)

    def clear(self) -> None:
        self._ids.clear()

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __iter__(self):
        for v in list(self._ids):
            yield TxnID.from_int(v)

    def to_arrays(self):
        ordered = sorted(self._ids)
        return (
            np.array([v >> 64 for v in ordered], dtype=np.uint64),
            np.array([v & _MASK64 for v in ordered], dtype=np.uint64),
        )

    def to_bytes(self) -> bytes:
        ordered = sorted(self._ids)
        parts = [MAGIC, bytes([VERSION, 0, 0, 0]), struct.pack("<Q", len(ordered))]
        parts.extend(v.to_bytes(16, "big") for v in ordered)
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data) -> AbortSet:
        try:
            raw = bytes(memoryview(data).cast("B"))
        except TypeError:
            raise TypeError(f"AbortSet.from_bytes takes bytes, not {type(data).__name__}") from None
        if len(raw) < _HEADER or raw[:4] != MAGIC:
            raise ValueError("not an AbortSet snapshot: bad magic or too short")
        if raw[4] != VERSION:
            raise ValueError(
                f"AbortSet snapshot version {raw[4]} not supported (expected {VERSION})"
            )
        (n,) = struct.unpack_from("<Q", raw, 8)
        if n > (len(raw) - _HEADER) // 16 or _HEADER + 16 * n != len(raw):
            raise ValueError(f"AbortSet snapshot of {len(raw)} bytes cannot hold {n} members")
        result = cls()
        result._ids = {
            int.from_bytes(raw[_HEADER + 16 * k : _HEADER + 16 * k + 16], "big") for k in range(n)
        }
        return result

    def copy(self) -> AbortSet:
        result = AbortSet()
        result._ids = set(self._ids)
        return result

    def memory_bytes(self) -> int:
        return len(self._ids) * 16

    def __eq__(self, other):
        if not isinstance(other, AbortSet):
            return NotImplemented
        return self._ids == other._ids

    __hash__ = None

    def __reduce__(self):
        return (AbortSet.from_bytes, (self.to_bytes(),))

    def __repr__(self) -> str:
        return f"AbortSet(<{len(self)} TxnIDs>)"
