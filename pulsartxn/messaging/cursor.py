"""A subscription's durable cursor: what it has acknowledged, persisted in LMDB.

As Pulsar's ManagedCursor: a mark-delete position (every entry at or below it is acknowledged),
the entries acknowledged individually above it, and batch-index acknowledgements of entries
acknowledged only in part (AckSet: set bit = batch index acknowledged). The mark-delete
position moves up whenever the entries after it have been acknowledged.
"""

from __future__ import annotations

import bisect
import struct

from .._native import AckSet

_HEAD = struct.Struct("<4sBqII")  # magic, version, mark_delete, n acked ranges, n batch
_MAGIC = b"PTCU"
_VERSION = 1
_MAX = (1 << 63) - 1


class Cursor:
    __slots__ = ("mark_delete", "acked", "batch_acks", "_starts", "_ends")

    def __init__(self, mark_delete: int = -1) -> None:
        self.mark_delete = mark_delete
        self.acked: set[int] = set()  # entry ids > mark_delete acknowledged whole
        self.batch_acks: dict[int, AckSet] = {}  # entry id -> batch indexes acknowledged
        # The same entries as maximal half-open ranges, kept as they change (start -> end and
        # end -> start): a write serializes the ranges, not a sort of every entry, so a
        # message left unacknowledged in front does not make each write slower than the last.
        self._starts: dict[int, int] = {}
        self._ends: dict[int, int] = {}

    # -- queries ---------------------------------------------------------------------------

    def is_acked(self, entry_id: int, batch_index: int = -1) -> bool:
        if entry_id <= self.mark_delete or entry_id in self.acked:
            return True
        if batch_index >= 0:
            acks = self.batch_acks.get(entry_id)
            return acks is not None and acks.test(batch_index)
        return False

    def ranges(self):
        """The entries acknowledged above mark-delete as half-open (start, end) ranges."""
        return self._starts.items()

    def acked_in_entry(self, entry_id: int) -> AckSet | None:
        """Batch indexes acknowledged in a partly acknowledged entry."""
        return self.batch_acks.get(entry_id)

    # -- updates (return whether anything changed) -----------------------------------------

    def ack(self, entry_id: int, batch_index: int = -1, batch_size: int = 0) -> bool:
        if entry_id <= self.mark_delete or entry_id in self.acked:
            return False
        if batch_index >= 0 and batch_size > 1:
            acks = self.batch_acks.get(entry_id)
            if acks is None:
                acks = self.batch_acks[entry_id] = AckSet(batch_size)
            if acks.test(batch_index):
                return False
            acks.set(batch_index)
            if not acks.is_full():
                return True
        self.batch_acks.pop(entry_id, None)
        self._add(entry_id)
        self._advance()
        return True

    def ack_set(self, entry_id: int, acks: AckSet) -> bool:
        """Acknowledge the batch indexes of `acks` in one entry (a commit of pending acks)."""
        if entry_id <= self.mark_delete or entry_id in self.acked:
            return False
        held = self.batch_acks.get(entry_id)
        merged = acks.copy() if held is None else held | acks
        if held is not None and merged == held:
            return False
        if merged.is_full():
            self.batch_acks.pop(entry_id, None)
            self._add(entry_id)
            self._advance()
        else:
            self.batch_acks[entry_id] = merged
        return True

    def ack_cumulative(self, entry_id: int, batch_index: int = -1, batch_size: int = 0) -> bool:
        """Acknowledge everything up to entry_id; with a batch index, up to it in that entry."""
        changed = False
        upto = entry_id - 1 if batch_index >= 0 and batch_size > 1 else entry_id
        if upto > self.mark_delete:
            self.mark_delete = upto
            if self.acked:
                self.acked = {e for e in self.acked if e > upto}
                starts = {max(a, upto + 1): b for a, b in self._starts.items() if b > upto + 1}
                self._starts, self._ends = starts, {b: a for a, b in starts.items()}
            self.batch_acks = {e: a for e, a in self.batch_acks.items() if e > upto}
            changed = True
        if batch_index >= 0 and batch_size > 1 and entry_id > self.mark_delete:
            part = AckSet(batch_size)
            part.set_range(0, batch_index + 1)
            changed = self.ack_set(entry_id, part) or changed
        self._advance()
        return changed

    def _add(self, entry_id: int) -> None:
        """entry_id (above mark_delete, not acknowledged yet) joins the acknowledged ranges."""
        self.acked.add(entry_id)
        starts, ends = self._starts, self._ends
        start = ends.pop(entry_id, entry_id)  # a range ending where this one starts
        end = starts.pop(entry_id + 1, None)  # a range starting right after it
        if end is None:
            end = entry_id + 1
        else:
            del ends[end]
        starts[start] = end
        ends[end] = start

    def _advance(self) -> None:
        """Move mark_delete over the acknowledged range right after it."""
        starts, acked = self._starts, self.acked
        while (end := starts.pop(self.mark_delete + 1, None)) is not None:
            del self._ends[end]
            for entry_id in range(self.mark_delete + 1, end):
                acked.discard(entry_id)
            self.mark_delete = end - 1

    def skip_to(self, entry_id: int) -> None:
        """Treat every entry below entry_id as acknowledged (trimmed or filtered)."""
        if entry_id - 1 > self.mark_delete:
            self.ack_cumulative(entry_id - 1)

    def reset(self, mark_delete: int) -> None:
        """Forget every acknowledgement: everything up to mark_delete is acknowledged, nothing
        after it (a seek)."""
        self.mark_delete = mark_delete
        self.acked = set()
        self.batch_acks = {}
        self._starts, self._ends = {}, {}

    # -- persistence -----------------------------------------------------------------------

    def serialize(self, pending=()) -> bytes:
        """The cursor record: mark-delete, individually acknowledged ranges, batch acks.

        `pending`: ``(entries, cumulative)`` of transactions whose commits are being written
        (held entries as ``(ledger, entry id, AckSet or None)``, and a cumulative ack as
        ``(entry id, batch index, batch size)`` or None): the record as it will be once their
        acks are applied, in order, as a commit applies them (``ack``/``ack_set`` per entry,
        then ``ack_cumulative``). This cursor does not change."""
        mark, ranges, batch = self.mark_delete, sorted(self.ranges()), self.batch_acks
        for entries, cumulative in pending:
            mark, ranges, batch = _with_acks(mark, ranges, batch, entries, cumulative)
        return _encode(mark, ranges, batch)

    @classmethod
    def deserialize(cls, data) -> Cursor:
        raw = bytes(data)
        magic, version, mark_delete, n_ranges, n_batch = _HEAD.unpack_from(raw, 0)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not a cursor record (magic {magic!r}, version {version})")
        cursor = cls(mark_delete)
        offset = _HEAD.size
        bounds = struct.unpack_from(f"<{2 * n_ranges}Q", raw, offset)
        offset += 16 * n_ranges
        for i in range(n_ranges):
            cursor.acked.update(range(bounds[2 * i], bounds[2 * i + 1]))
        for start, end in _ranges(sorted(cursor.acked)):  # maximal, whatever was written
            cursor._starts[start] = end
            cursor._ends[end] = start
        for _ in range(n_batch):
            entry_id, size, n_words = struct.unpack_from("<QII", raw, offset)
            offset += 16
            words = struct.unpack_from(f"<{n_words}Q", raw, offset)
            offset += 8 * n_words
            cursor.batch_acks[entry_id] = AckSet.from_words(list(words), size)
        return cursor

    def __repr__(self) -> str:
        return (
            f"Cursor(mark_delete={self.mark_delete}, acked={len(self.acked)}, "
            f"partial={len(self.batch_acks)})"
        )


def _encode(mark_delete: int, ranges: list, batch_acks: dict) -> bytes:
    parts = [_HEAD.pack(_MAGIC, _VERSION, mark_delete, len(ranges), len(batch_acks))]
    if ranges:
        parts.append(struct.pack(f"<{2 * len(ranges)}Q", *(x for r in ranges for x in r)))
    for entry_id, acks in sorted(batch_acks.items()):
        words = acks.to_words()
        parts.append(struct.pack(f"<QII{len(words)}Q", entry_id, acks.size, len(words), *words))
    return b"".join(parts)


def _with_acks(mark: int, ranges: list, batch: dict, entries, cumulative):
    """(mark-delete, sorted half-open ranges, batch acks) with one transaction's acks applied,
    as ``Cursor`` applies them; the inputs are not changed (AckSets are never changed in
    place here: a merge makes a new one). A transaction's entries are distinct, so they are
    merged into the ranges in one pass."""
    batch = dict(batch)
    whole = []  # entries the transaction acknowledges whole
    for _, entry_id, ack_set in entries:
        if entry_id <= mark:
            continue
        if ack_set is None:
            whole.append(entry_id)
        elif not _covers(ranges, entry_id) and _merged_full(batch, entry_id, ack_set):
            whole.append(entry_id)
    if whole:
        for entry_id in whole:
            batch.pop(entry_id, None)
        ranges = _union(ranges, sorted(whole))
    if cumulative is not None:
        entry_id, batch_index, batch_size = cumulative
        partial = batch_index >= 0 and batch_size > 1
        upto = entry_id - 1 if partial else entry_id
        if upto > mark:
            mark = upto
            ranges = [(max(a, upto + 1), b) for a, b in ranges if b > upto + 1]
            batch = {e: a for e, a in batch.items() if e > upto}
        if partial and entry_id > mark and not _covers(ranges, entry_id):
            part = AckSet(batch_size)
            part.set_range(0, batch_index + 1)
            if _merged_full(batch, entry_id, part):
                batch.pop(entry_id, None)
                ranges = _union(ranges, [entry_id])
    start = 0
    while start < len(ranges) and ranges[start][0] == mark + 1:  # mark-delete moves on
        mark = ranges[start][1] - 1
        start += 1
    return mark, ranges[start:], batch


def _merged_full(batch: dict, entry_id: int, acks) -> bool:
    """Merge `acks` into entry_id's batch acks (kept as they are: nothing here changes an
    AckSet in place); True, and nothing kept, when that makes the entry whole (as
    ``Cursor.ack_set``)."""
    held = batch.get(entry_id)
    merged = acks if held is None else held | acks
    if merged.is_full():
        return True
    batch[entry_id] = merged
    return False


def _covers(ranges: list, entry_id: int) -> bool:
    """Whether sorted half-open `ranges` hold entry_id."""
    i = bisect.bisect_right(ranges, (entry_id, _MAX)) - 1
    return i >= 0 and ranges[i][0] <= entry_id < ranges[i][1]


def _union(ranges: list, ids: list) -> list:
    """Sorted half-open `ranges` with the sorted entry ids `ids` added, as maximal ranges."""
    out: list = []
    i = j = 0
    while i < len(ranges) or j < len(ids):
        if j == len(ids) or (i < len(ranges) and ranges[i][0] <= ids[j]):
            a, b = ranges[i]
            i += 1
        else:
            a, b = ids[j], ids[j] + 1
            j += 1
        if out and out[-1][1] >= a:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _ranges(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted entry ids as half-open [start, end) ranges."""
    out: list[tuple[int, int]] = []
    for e in ids:
        if out and out[-1][1] == e:
            out[-1] = (out[-1][0], e + 1)
        else:
            out.append((e, e + 1))
    return out
