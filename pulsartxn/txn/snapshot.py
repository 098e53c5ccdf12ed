"""Snapshots of a partition's transaction buffer (database ``tbsnapshot``): up to a ledger
position, the ongoing transactions and the aborted ones, the aborts stored in segments as
Pulsar 3.0 does, so a snapshot costs what changed since the last. Each record carries a
CRC-32C; a damaged snapshot is ignored and the state rebuilt from the ledger."""

from __future__ import annotations

import logging
import struct
import time

from .._native import TxnID, crc32c
from ..errors import AlreadyClosed, CorruptEntry
from ..storage import WriteOp

_LOG = logging.getLogger("pulsartxn.buffer")

DB = b"tbsnapshot"
SEGMENT_MAX = 16384  # aborted TxnIDs per segment
_HEAD = struct.Struct("<BqqII")  # version, position, next segment id, ongoing, segments
_PAIR = struct.Struct("<16sq")  # TxnID, entry id
_SEG = struct.Struct("<qq")  # segment id, the highest marker entry in it
_U32 = struct.Struct("<I")
VERSION = 1


def _seal(body: bytes) -> bytes:
    return _U32.pack(crc32c(body)) + body


def _open(raw) -> bytes:
    raw = bytes(raw)
    if len(raw) < 4 or _U32.unpack_from(raw)[0] != crc32c(raw[4:]):
        raise CorruptEntry("transaction buffer snapshot fails its checksum")
    return raw[4:]


class BufferSnapshots:
    def __init__(self, partition, every_txns: int = 1000, every_ms: float = 5000.0) -> None:
        self.partition = partition
        self.buffer = partition.buffer
        self.every_txns = every_txns
        self.every_s = every_ms / 1000.0
        self.db = partition.storage.open_db(DB)
        self.prefix = partition.topic.encode() + b"\0"
        self.segments: list[tuple[int, int]] = []  # (segment id, highest marker entry)
        self.next_segment = 0
        self.new_aborts: list[tuple[TxnID, int]] = []  # since the last snapshot
        self.ended_since = 0
        self.last_time = time.monotonic()
        self.last_wall_ms: int | None = None
        self.last_bytes = 0
        self.taken = 0
        self.load_error: str | None = None

    def _seg_key(self, segment_id: int) -> bytes:
        return self.prefix + b"s" + segment_id.to_bytes(8, "big")

    # -- recovery --------------------------------------------------------------------------

    def load(self) -> int:
        """Load the latest snapshot into the buffer; the ledger position replay starts from
        (0 without a usable snapshot)."""
        storage = self.partition.storage
        try:
            with storage.read() as lmdb_txn:
                raw = lmdb_txn.get(self.prefix + b"h", db=self.db)
                if raw is None:
                    return 0
                body = _open(raw)
                version, position, next_segment, n_ongoing, n_segments = _HEAD.unpack_from(body)
                if version != VERSION:
                    raise CorruptEntry(f"transaction buffer snapshot version {version}")
                off = _HEAD.size
                ongoing = []
                for _ in range(n_ongoing):
                    tid, first = _PAIR.unpack_from(body, off)
                    ongoing.append((TxnID.unpack(tid), first))
                    off += _PAIR.size
                segments = []
                for _ in range(n_segments):
                    segments.append(_SEG.unpack_from(body, off))
                    off += _SEG.size
                if off != len(body):
                    raise CorruptEntry("transaction buffer snapshot head has trailing bytes")
                aborts = []
                for seg_id, _ in segments:
                    seg_raw = lmdb_txn.get(self._seg_key(seg_id), db=self.db)
                    if seg_raw is None:
                        raise CorruptEntry(f"transaction buffer snapshot segment {seg_id} missing")
                    seg = _open(seg_raw)
                    (n,) = _U32.unpack_from(seg)
                    if len(seg) != 4 + n * _PAIR.size:
                        raise CorruptEntry(f"transaction buffer snapshot segment {seg_id} size")
                    for i in range(n):
                        tid, pos = _PAIR.unpack_from(seg, 4 + i * _PAIR.size)
                        aborts.append((TxnID.unpack(tid), pos))
        except (CorruptEntry, struct.error, ValueError) as exc:
            self.load_error = str(exc)
            _LOG.warning(
                "transaction buffer snapshot of %s cannot be read (%s): rebuilt from the whole "
                "ledger instead",
                self.partition.topic,
                exc,
            )
            return 0  # rebuilt from the ledger; the next snapshot replaces it
        buf = self.buffer
        for t, first in ongoing:
            buf.ongoing[t] = first
        for t, pos in aborts:
            buf.aborts.add(t)
            buf.abort_positions[t] = pos
        self.segments = [tuple(s) for s in segments]
        self.next_segment = next_segment
        return position

    def recovered(self, from_snapshot: bool) -> None:
        """After replay: without a snapshot every abort is new to the next one."""
        if not from_snapshot:
            self.new_aborts = list(self.buffer.abort_positions.items())
            self.segments = []

    # -- taking ----------------------------------------------------------------------------

    def aborted(self, txn_id: TxnID, entry_id: int) -> None:
        """An abort marker was published or replayed past the snapshot (lock held)."""
        self.new_aborts.append((txn_id, entry_id))

    def txn_ended(self) -> None:
        self.ended_since += 1
        if self.ended_since >= self.every_txns or time.monotonic() - self.last_time >= self.every_s:
            self.take(wait=False)

    def take(self, wait: bool = False) -> None:
        part = self.partition
        with part.lock:
            first_entry = part.first_entry_id
            dropped = self.buffer.drop_trimmed(first_entry)
            position = part.next_entry_id
            ongoing = list(self.buffer.ongoing.items())
            claims = self.buffer.claims
            if claims:
                # Claimed entries are not written yet: the replay starts at the first, and
                # finds their transactions there if they are.
                position = min(position, min(claims))
                ongoing = [(t, first) for t, first in ongoing if first not in claims]
            new = [(t, p) for t, p in self.new_aborts if p >= first_entry]
            self.new_aborts = []
            gone = [s for s in self.segments if s[1] < first_entry]
            keep = [s for s in self.segments if s[1] >= first_entry]
            puts = []
            for i in range(0, len(new), SEGMENT_MAX):
                chunk = new[i : i + SEGMENT_MAX]
                seg_id = self.next_segment
                self.next_segment += 1
                body = _U32.pack(len(chunk)) + b"".join(_PAIR.pack(t.pack(), p) for t, p in chunk)
                puts.append((self._seg_key(seg_id), _seal(body)))
                keep.append((seg_id, max(p for _, p in chunk)))
            head = [_HEAD.pack(VERSION, position, self.next_segment, len(ongoing), len(keep))]
            head += [_PAIR.pack(t.pack(), first) for t, first in ongoing]
            head += [_SEG.pack(*s) for s in keep]
            puts.append((self.prefix + b"h", _seal(b"".join(head))))
            self.segments = keep
            self.ended_since = 0
            self.last_time = time.monotonic()
        dels = [self._seg_key(s[0]) for s in gone]
        db = self.db

        def apply(lmdb_txn):
            for k, v in puts:
                lmdb_txn.put(k, v, db=db)
            for k in dels:
                lmdb_txn.delete(k, db=db)

        nbytes = sum(len(v) for _, v in puts)
        storage = part.storage
        try:
            op = WriteOp(apply, nbytes=nbytes, records=len(puts), durable=wait)
            fut = storage.submit(op, lazy=not wait)
        except AlreadyClosed:
            return
        self.taken += 1
        self.last_wall_ms = int(time.time() * 1000)
        self.last_bytes = nbytes
        del dropped
        if wait:
            storage.wait(fut)

    def stats(self) -> dict:
        return {
            "snapshots_taken": self.taken,
            "last_snapshot_time_ms": self.last_wall_ms,
            "last_snapshot_bytes": self.last_bytes,
            "snapshot_segments": len(self.segments),
            "snapshot_load_error": self.load_error,
        }
