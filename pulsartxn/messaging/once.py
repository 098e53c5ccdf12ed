"""Calls that take effect once though they are made again: an admin skip, a delete or a
create of a subscription, a delete of a topic, re-sent by a network client whose answer was
lost, possibly across a broker restart (the server's in-memory replay is gone then).

What such a call did on each scope it touches (a partition, a topic) is written into the
store in the same LMDB write as its effect there: a call made again finds it and does not
run there twice (a skip would skip again), and a call cut short by a crash goes on with the
scopes it had not reached. The rows are the caller's (a network session): dropped once it
says it has every answer below a number, and when it ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import lmdb

_PREFIX = b"once\0"
_NUMBER = 8  # bytes of a call number (big-endian: a session's rows sort by it)


def _owner_prefix(owner: str) -> bytes:
    raw = owner.encode("utf-8", "surrogatepass")
    return _PREFIX + len(raw).to_bytes(2, "big") + raw  # no owner's a prefix of another's


class OnceCall:
    """Call `number` of `owner`; `below`: its owner has the answers of every call under it."""

    def __init__(self, storage, owner: str, number: int, below: int | None = None) -> None:
        self._storage = storage
        self._prefix = _owner_prefix(owner)
        self._key = self._prefix + number.to_bytes(_NUMBER, "big")
        self._below = below

    def done(self, scope: str) -> tuple[bool, Any]:
        """(True, what it did there) if this call has taken effect on `scope`."""
        with self._storage.read() as lmdb_txn:
            raw = lmdb_txn.get(self._key + scope.encode(), db=self._storage.meta)
        return (False, None) if raw is None else (True, json.loads(bytes(raw)))

    def rider(self, scope: str, did: Any) -> Callable[[lmdb.Transaction], None]:
        """A write of "this call did `did` on `scope`", for the LMDB write of its effect
        there; it drops the owner's rows of calls under `below` too."""
        key, value = self._key + scope.encode(), json.dumps(did).encode()
        prefix, below, db = self._prefix, self._below, self._storage.meta

        def write(lmdb_txn) -> None:
            if below:
                _delete_range(lmdb_txn, db, prefix, prefix + below.to_bytes(_NUMBER, "big"))
            lmdb_txn.put(key, value, db=db)

        return write


def forget(storage, owners: list[str]) -> None:
    """Drop every row of `owners` (their sessions ended), in one write."""
    if not owners:
        return
    db = storage.meta

    def apply(lmdb_txn) -> None:
        for owner in owners:
            prefix = _owner_prefix(owner)
            _delete_range(lmdb_txn, db, prefix, prefix + b"\xff")

    storage.write(apply)


def owners(storage) -> set[str]:
    """The owners that have rows."""
    found: set[str] = set()
    with storage.read() as lmdb_txn:
        cur = lmdb_txn.cursor(db=storage.meta)
        ok = cur.set_range(_PREFIX)
        while ok:
            key = bytes(cur.key())
            if not key.startswith(_PREFIX):
                break
            at = len(_PREFIX) + 2
            owner = key[at : at + int.from_bytes(key[at - 2 : at], "big")]
            found.add(owner.decode("utf-8", "surrogatepass"))
            ok = cur.set_range(key[: at + len(owner)] + b"\xff")
    return found


def _delete_range(lmdb_txn, db, start: bytes, end: bytes) -> None:
    cur = lmdb_txn.cursor(db=db)
    if not cur.set_range(start):
        return
    while bytes(cur.key()) < end:
        if not cur.delete():  # moved to the next row; False past the last
            return
