"""Replaying a journal record: the writes a group's LMDB write transaction made, recorded as
it made them by ``Recorder``, ``RecordingTxn`` and ``RecordingCursor`` (native core,
``_native/recording.pyx``; its docstring gives the contract and the record layout).

A record is blind writes of whole keys in order, so applying it on any state at or before the
one it was taken on gives the state after it.
"""

from __future__ import annotations

import struct

from .._native import Recorder, RecordingCursor, RecordingTxn

__all__ = ["Recorder", "RecordingCursor", "RecordingTxn", "apply_record"]

PUT, DELETE, NAME = 1, 2, 3
MAIN_DB = 0xFFFF
_OP = struct.Struct("<BHII")


def apply_record(env, lmdb_txn, payload, handles: dict) -> int:
    """Make the writes of one record again in the write transaction `txn`; `handles` caches
    database handles by name across records. Returns the number of writes."""
    view = memoryview(payload)
    unpack = _OP.unpack_from
    size = _OP.size
    names: dict[int, object] = {MAIN_DB: None}
    pos = 0
    end = len(view)
    writes = 0
    while pos < end:
        kind, index, klen, vlen = unpack(view, pos)
        pos += size
        key = view[pos : pos + klen]
        pos += klen
        if kind == NAME:
            name = bytes(key)
            handle = handles.get(name)
            if handle is None:
                handle = handles[name] = env.open_db(name, txn=lmdb_txn, create=True)
            names[index] = handle
            continue
        db = names[index]
        if kind == PUT:
            lmdb_txn.put(key, view[pos : pos + vlen], db=db)
            pos += vlen
        elif kind == DELETE:
            lmdb_txn.delete(key, db=db)
        else:
            raise ValueError(f"journal record op {kind} at byte {pos - size - klen}")
        writes += 1
    if pos != end:
        raise ValueError(f"journal record overruns its length ({pos} > {end})")
    return writes
