"""Argument checks shared by the native modules and their twins (one wording for one error)."""

from __future__ import annotations

import operator

import numpy as np

from ..errors import excerpt

U64_MAX = (1 << 64) - 1


def as_int(value, what: str) -> int:
    """An int-like argument as int (bool refused), or TypeError naming the value."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{what} must be an int, not {type(value).__name__} ({excerpt(value)})"
        ) from None


def as_uint64_array(values, what: str) -> np.ndarray:
    """A 1-d contiguous uint64 array; signed halves (as Java longs carry them) are reinterpreted."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integers, not {arr.dtype}")
    if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
        arr = arr.astype(np.int64, copy=False).view(np.uint64)
    return np.ascontiguousarray(arr, dtype=np.uint64)


def as_entry_ids(entry_ids) -> np.ndarray:
    """Entry ids (a sequence or an integer array) as uint64, refusing negative or huge ones."""
    arr = np.asarray(entry_ids)
    if arr.ndim != 1:
        raise ValueError(f"entry_ids must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        ints = arr.tolist()
        if arr.dtype == object and all(isinstance(x, int) for x in ints):
            if min(ints) < 0 or max(ints) > U64_MAX:
                raise ValueError("entry ids must be in 0..2^64-1")
            return np.array(ints, dtype=np.uint64)
        raise TypeError(f"entry_ids must be integers, not {arr.dtype}")
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise ValueError(f"entry ids must not be negative (got {arr.min()})")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def entry_range(start, end, limit) -> tuple[int, int | None, int | None]:
    """A scan's start, end (exclusive, or None) and limit (or None), each in 0..2^64-1."""
    for name, value in (("start", start), ("end", end), ("limit", limit)):
        if value is None and name != "start":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if value < 0 or value > U64_MAX:
            raise ValueError(f"{name} {value} out of range 0..2^64-1")
    return (
        int(start),
        int(end) if end is not None else None,
        int(limit) if limit is not None else None,
    )


def check_bulk(batch_size, max_entry_bytes, first_sequence_id: int, n: int) -> None:
    """The splitting limits of a bulk encode, and that its sequence ids fit 64 bits."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
    if (
        isinstance(max_entry_bytes, bool)
        or not isinstance(max_entry_bytes, int)
        or max_entry_bytes < 1
    ):
        raise ValueError(f"max_entry_bytes must be a positive int, not {max_entry_bytes!r}")
    if first_sequence_id + n - 1 > U64_MAX:
        raise ValueError(f"sequence ids from {first_sequence_id} for {n} messages pass 2^64-1")
