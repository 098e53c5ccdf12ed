"""One topic partition: its ledger (the entry log), de-duplication state and subscriptions.

Appends run on the group-commit writer thread; what they change in memory is published only
after their group is durable (``_published``), so readers never see an entry that could still
be lost.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
import time
from array import array
from typing import TYPE_CHECKING

import numpy as np

from .._native import EntryLog, TxnID, decode_entries, decode_header, header_columns
from ..errors import CorruptEntry, InvalidMessageId
from ..storage import Storage, WriteOp
from ..txn.buffer import TransactionBuffer
from ..txn.snapshot import BufferSnapshots
from .message import MessageId
from .topic_name import TopicName

_LOG = logging.getLogger("pulsartxn.buffer")

if TYPE_CHECKING:
    from .subscription import Subscription

_U64 = struct.Struct(">Q")
_DEDUP = struct.Struct("<q")
_DEDUP_INDEX = struct.Struct("<QIq")  # entry id, messages in it, first sequence id
# The entry id of an index row for sequences a producer took and never wrote (dropped with a
# transaction that ended first): a resend of one is stored anew, across restarts too.
_NEVER_WRITTEN = (1 << 64) - 1


class Partition:
    def __init__(
        self, storage: Storage, name: TopicName, ledger_id: int, snapshot_options=None
    ) -> None:
        self.storage = storage
        self.name = name
        self.topic = name.full
        self.index = name.partition_index
        self.ledger_id = ledger_id
        self.lock = threading.RLock()
        name = b"ledger/" + self.topic.encode()
        self.log = EntryLog(storage.env, name, storage.open_db(name))
        self._dedup_db = storage.open_db(b"dedup")
        self._dedup_index_db = storage.open_db(b"dedup_index")
        self._dedup_prefix = self.topic.encode() + b"\0"
        # Message counts per entry id from first_entry_id on, for backlog arithmetic.
        self.first_entry_id = 0
        self._counts = array("q")
        self._cumulative = array("q", [0])  # cumulative[i] = messages in entries < first + i
        self.buffer = TransactionBuffer(self)
        snapshots = self.buffer.snapshot = BufferSnapshots(self, **(snapshot_options or {}))
        began = time.monotonic()
        replay_from = snapshots.load()
        with storage.read() as lmdb_txn:
            first = self.log.first_entry_id(lmdb_txn)
            last = self.log.last_entry_id(lmdb_txn)
            if last >= 0:
                self.first_entry_id = first
                replayed = self._recover_counts(first, last, replay_from)
                _LOG.info(
                    "%s recovered in %.1f ms: entries %d..%d, %d transactional ones replayed "
                    "from %s; %d transactions ongoing, %d aborted",
                    self.topic,
                    (time.monotonic() - began) * 1000.0,
                    first,
                    last,
                    replayed,
                    f"entry {replay_from} (snapshot)" if replay_from else "the start",
                    len(self.buffer.ongoing),
                    len(self.buffer.aborts),
                )
        self.next_entry_id = last + 1 if last >= 0 else 0
        # Entry ids are taken when an append is applied (under _ids_lock), or claimed before
        # (``claim``): every id below _applied_to is written, being written or skipped, every
        # one below _claimed_to is written or claimed; a new one starts above both.
        self._ids_lock = threading.Lock()
        self._applied_to = self.next_entry_id
        self._claimed_to = 0
        snapshots.recovered(replay_from > 0)
        self.subscriptions: dict[str, Subscription] = {}
        self.readers: dict[str, Subscription] = {}  # non-durable: no cursor stored, no stats
        self.awaited: set[Subscription] = set()  # those with a consumer parked (Parked)
        self.producers: dict[str, object] = {}
        self.msg_in = 0
        self.bytes_in = 0
        self.msg_out = 0
        self.bytes_out = 0

    def _recover_counts(self, first: int, last: int, replay_from: int = 0) -> int:
        """Message counts of every entry and the transaction buffer's state, from the entry
        headers alone: one pass over the ledger in chunks, headers parsed in bulk natively.
        (Values are copied out as bytes: a memoryview per value costs several times more.)
        Returns how many transactional entries were replayed."""
        dense = np.zeros(last - first + 1, np.int64)
        chunk = 65536
        replay: list = []  # (ids, markers, msb, lsb) of the transactional entries, per chunk
        with self.storage.env.begin(buffers=False) as lmdb_txn:
            cursor = lmdb_txn.cursor(db=self.log.db)
            more = cursor.first()
            while more:
                keys, values = [], []
                for key, value in cursor.iternext():
                    keys.append(key)
                    values.append(value)
                    if len(keys) == chunk:
                        break
                more = len(keys) == chunk and cursor.next()
                ids = np.frombuffer(b"".join(keys), dtype=">u8").astype(np.int64)
                try:
                    counts, markers, msb, lsb = header_columns(values)
                except CorruptEntry:
                    raise self._corrupt_header(ids, values) from None
                dense[ids - first] = counts
                in_txn = ((msb != 0) | (lsb != 0)) & (ids >= replay_from)
                if in_txn.any():
                    replay.append((ids[in_txn], markers[in_txn], msb[in_txn], lsb[in_txn]))
        if replay:
            self.buffer.replay_columns(*(np.concatenate(c) for c in zip(*replay)))
        self._counts = array("q", dense.tobytes())
        cumulative = np.zeros(len(dense) + 1, np.int64)
        np.cumsum(dense, out=cumulative[1:])
        self._cumulative = array("q", cumulative.tobytes())
        return sum(len(c[0]) for c in replay)

    # -- counts ----------------------------------------------------------------------------

    def _push_count(self, n: int) -> None:
        self._counts.append(n)
        self._cumulative.append(self._cumulative[-1] + n)

    def _count_span(self, start: int, end: int) -> tuple[int, int]:
        """Entries start..end-1 clamped to what exists, as indexes into the counts."""
        first = self.first_entry_id
        return max(start, first) - first, min(end, self.next_entry_id) - first

    def entries_holding(self, start: int, end: int, messages: int) -> int:
        """How many entries from start (clamped; end exclusive) hold at least `messages`
        messages, or all of them if they hold fewer; at least one when there is one."""
        lo, hi = self._count_span(start, end)
        if hi <= lo:
            return 0
        cumulative = self._cumulative
        # cumulative[j] - cumulative[lo]: the messages of entries lo..j-1
        j = bisect.bisect_left(cumulative, cumulative[lo] + messages, lo + 1, hi + 1)
        return min(j, hi) - lo

    def messages_between(self, start: int, end: int) -> int:
        """Messages in entries start..end-1 (clamped to what exists)."""
        lo, hi = self._count_span(start, end)
        if hi <= lo:
            return 0
        return self._cumulative[hi] - self._cumulative[lo]

    def message_count(self, entry_id: int) -> int:
        i = entry_id - self.first_entry_id
        if 0 <= i < len(self._counts):
            return self._counts[i]
        return 0

    @property
    def last_entry_id(self) -> int:
        return self.next_entry_id - 1

    @property
    def latest_entry_id(self) -> int:
        """Where a subscription at Latest starts after: the last entry published or claimed
        (a send of an open in-process transaction, written with its end)."""
        return max(self.next_entry_id, self._claimed_to) - 1

    @property
    def total_messages(self) -> int:
        return self._cumulative[-1]

    def storage_size(self) -> int:
        with self.storage.read() as lmdb_txn:
            stat = lmdb_txn.stat(self.log.db) if hasattr(self.log, "db") else None
        if stat is None:
            return 0
        return (stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]) * stat["psize"]

    # -- appends (writer thread) -----------------------------------------------------------

    def claim(self, n: int) -> int:
        """The ids of `n` entries an in-process transaction writes later, with its end: its
        MessageIds are known at the send. Until then they hold no entry, and the transaction
        buffer keeps readers below them (``TransactionBuffer.claimed``)."""
        with self._ids_lock:
            first = max(self._applied_to, self._claimed_to)
            self._claimed_to = first + n
        return first

    def _write_entries(self, lmdb_txn, entries: list[bytes], at: int | None) -> int:
        """Put `entries` in the ledger from `at` (claimed) or at the next free id."""
        with self._ids_lock:
            first = self.log.append(lmdb_txn, entries, self._next_id() if at is None else at)
            if first + len(entries) > self._applied_to:
                self._applied_to = first + len(entries)
        return first

    def _next_id(self) -> int | None:
        """_ids_lock held: where an unclaimed append starts (None, with no claim ever made:
        after the last entry, where one whose write failed started too)."""
        if not self._claimed_to:
            return None
        return max(self._applied_to, self._claimed_to)

    def append_op(
        self,
        entries: list[bytes],
        counts: list[int],
        nbytes: int,
        producer: str | None = None,
        first_sequence: int = -1,
        on_published=None,
        before_publish=None,
        resend: bool = False,
        at: int | None = None,
    ) -> WriteOp:
        """A group-commit operation appending encoded `entries`; its result is the first id.

        before_publish(first) runs under the partition lock just before the entries become
        visible (the transaction buffer records them there); on_published(first) after.
        `resend`: the entries hold sequence ids stored before in aborted entries. `at`: the
        first of the ids claimed for them (``claim``)."""

        def apply(lmdb_txn):
            first = self._write_entries(lmdb_txn, entries, at)
            self._index_sequences(lmdb_txn, first, counts, producer, first_sequence, resend)
            return first

        def on_commit(first):
            with self.lock:
                if before_publish is not None:
                    before_publish(first)
                self._published(first, counts, nbytes)
            if on_published is not None:
                on_published(first)

        return WriteOp(apply, nbytes=nbytes, records=len(entries), on_commit=on_commit)

    def append_messages_op(
        self,
        values,
        keys,
        nbytes: int,
        n: int,
        *,
        batch_size: int,
        producer: str,
        producer_id: int,
        first_sequence: int,
        publish_time: int,
        txn_id=None,
        properties=None,
        metadata=None,
    ) -> WriteOp:
        """A group-commit operation that encodes a bulk of messages straight into the ledger
        (no intermediate bytes objects); its result is (first entry id, messages per entry).
        With txn_id, the entries carry it and the transaction buffer records them."""
        msb = txn_id.most_sig_bits if txn_id is not None else 0
        lsb = txn_id.least_sig_bits if txn_id is not None else 0

        def apply(lmdb_txn):
            with self._ids_lock:
                first, counts = self.log.append_messages(
                    lmdb_txn,
                    values,
                    keys,
                    properties,
                    batch_size=batch_size,
                    producer_id=producer_id,
                    first_sequence_id=first_sequence,
                    publish_time=publish_time,
                    txn_msb=msb,
                    txn_lsb=lsb,
                    metadata=metadata,
                    first_entry_id=self._next_id(),
                )
                self._applied_to = max(self._applied_to, first + len(counts))
            self._index_sequences(lmdb_txn, first, counts, producer, first_sequence)
            return first, counts

        def on_commit(result):
            first, counts = result
            with self.lock:
                if txn_id is not None:
                    self.buffer.appended(txn_id, first)
                self._published(first, counts, nbytes)

        return WriteOp(apply, nbytes=nbytes, records=max(1, n // batch_size), on_commit=on_commit)

    def _index_sequences(
        self, lmdb_txn, first: int, counts: list[int], producer, first_sequence, resend=False
    ) -> None:
        """Persist the producer's highest sequence id and where each entry's sequences start.
        `resend`: sequences stored before in aborted entries, below the highest persisted."""
        if producer is None or first_sequence < 0 or not counts:
            return
        key = self._dedup_prefix + producer.encode()
        if len(counts) == 1 and not resend:  # one entry: two puts
            n = counts[0]
            lmdb_txn.put(key, _DEDUP.pack(first_sequence + n - 1), db=self._dedup_db)
            lmdb_txn.put(
                key + b"\0" + _U64.pack(first_sequence),
                _DEDUP_INDEX.pack(first, n, first_sequence),
                db=self._dedup_index_db,
            )
            return
        end = first_sequence + sum(counts)
        highest = end - 1
        if resend:
            raw = lmdb_txn.get(key, db=self._dedup_db)
            if raw is not None:
                highest = max(highest, _DEDUP.unpack(raw)[0])
            self._reindex_range(lmdb_txn, key + b"\0", first_sequence, end)
        lmdb_txn.put(key, _DEDUP.pack(highest), db=self._dedup_db)
        seq = first_sequence
        rows = []
        for i, n in enumerate(counts):
            rows.append((key + b"\0" + _U64.pack(seq), _DEDUP_INDEX.pack(first + i, n, seq)))
            seq += n
        lmdb_txn.cursor(db=self._dedup_index_db).putmulti(rows)

    def _reindex_range(self, lmdb_txn, prefix: bytes, start: int, end: int) -> None:
        """Before rows for sequences start..end-1 stored anew: a lookup of any other sequence
        finds the row it found before (the entry holding `end` gets a row starting there), and
        none of start..end-1 finds an older row (those starting inside the range go)."""
        cursor = lmdb_txn.cursor(db=self._dedup_index_db)
        end_key = prefix + _U64.pack(end)
        found = cursor.set_range(end_key)
        if not (found and bytes(cursor.key()) == end_key):
            if (cursor.prev() if found else cursor.last()) and bytes(cursor.key()).startswith(
                prefix
            ):
                value = bytes(cursor.value())
                _, n, first_seq = _DEDUP_INDEX.unpack(value)
                if first_seq <= end < first_seq + n:
                    lmdb_txn.put(end_key, value, db=self._dedup_index_db)
        cursor.set_range(prefix + _U64.pack(start + 1))
        key = bytes(cursor.key())
        while key.startswith(prefix) and key < end_key:
            cursor.delete()
            key = bytes(cursor.key())

    def never_written_op(self, producer: str, ranges: list[tuple[int, int]]) -> WriteOp:
        """Record that `producer` took sequences first..end-1 of each range and never wrote
        them: they count as sent (its highest sequence moves past them, so the sequences it
        takes next follow them) but a resend of one is stored anew, after a restart too."""
        key = self._dedup_prefix + producer.encode()

        def apply(lmdb_txn) -> None:
            raw = lmdb_txn.get(key, db=self._dedup_db)
            highest = _DEDUP.unpack(raw)[0] if raw is not None else -1
            for first, end in ranges:
                self._reindex_range(lmdb_txn, key + b"\0", first, end)
                lmdb_txn.put(
                    key + b"\0" + _U64.pack(first),
                    _DEDUP_INDEX.pack(_NEVER_WRITTEN, end - first, first),
                    db=self._dedup_index_db,
                )
                highest = max(highest, end - 1)
            lmdb_txn.put(key, _DEDUP.pack(highest), db=self._dedup_db)

        return WriteOp(apply, nbytes=32 * len(ranges))

    def _published(self, first: int, counts: list[int], nbytes: int) -> None:
        with self.lock:
            if first < self.next_entry_id:
                self._published_claimed(first, counts, nbytes)
                return
            while self.next_entry_id < first:
                self._push_count(0)
                self.next_entry_id += 1
            cumulative = self._cumulative
            total = before = cumulative[-1]
            for n in counts:
                self._counts.append(n)
                total += n
                cumulative.append(total)
            self.next_entry_id = first + len(counts)
            self.msg_in += total - before
            self.bytes_in += nbytes
            # A consumer parking after this polls once more.
            awaited = list(self.awaited) if self.awaited else ()
        for sub in awaited:
            sub.notify()

    def _published_claimed(self, first: int, counts: list[int], nbytes: int) -> None:
        """Lock held: claimed entries published after later ones (counted 0 until now)."""
        i = first - self.first_entry_id
        cumulative = np.frombuffer(self._cumulative, dtype=np.int64)
        for n in counts:
            self._counts[i] = n
            cumulative[i + 1 :] += n
            i += 1
        self.msg_in += sum(counts)
        self.bytes_in += nbytes

    def dispatch_end(self, read_committed: bool = True) -> int:
        """Entry id (exclusive) up to which readers may read: the transaction buffer's max read
        position for read-committed readers, the end of the ledger for read-uncommitted."""
        if read_committed:
            return self.buffer.max_read_position()
        return self.next_entry_id

    def last_readable_entry(self, read_committed: bool = True) -> int:
        """The last entry below the dispatch end that holds deliverable messages (not a
        marker, not aborted); -1 when there is none."""
        entry_id = self.dispatch_end(read_committed) - 1
        while entry_id >= self.first_entry_id:
            if self.message_count(entry_id) > 0:
                with self.storage.read() as lmdb_txn:
                    _, bufs = self.log.scan(lmdb_txn, entry_id, entry_id + 1)
                    head = decode_header(bufs[0], verify=False) if bufs else None
                if head is None or not (head.txn_msb or head.txn_lsb):
                    return entry_id
                txn_id = TxnID.from_halves(head.txn_msb, head.txn_lsb)
                if not self.buffer.is_aborted(txn_id):
                    return entry_id
            entry_id -= 1
        return -1

    # -- reads -----------------------------------------------------------------------------

    def read(self, start: int, end: int, limit: int | None = None, max_bytes: int | None = None):
        """Decoded entries start..end-1 (end exclusive), as the native codec gives them; with
        max_bytes, only the first entries that hold at most that many bytes (one at least)."""
        with self.storage.read() as lmdb_txn:
            try:
                if max_bytes is None:
                    return self.log.read(lmdb_txn, start, end, limit)
                ids, bufs = self.log.scan(lmdb_txn, start, end, limit)
                limit = _within(bufs, max_bytes)
                return decode_entries(ids[:limit], bufs[:limit])
            except CorruptEntry as exc:
                error = exc
            # The entries before the damaged one are good: return them; the error comes when
            # the damaged entry is the first one asked for (it is never skipped).
            ids, bufs = self.log.scan(lmdb_txn, start, end, limit)
            for i, (entry_id, buf) in enumerate(zip(ids, bufs)):
                try:
                    decode_entries([entry_id], [buf])
                except CorruptEntry as exc:
                    if i > 0:
                        return self.log.read(lmdb_txn, start, entry_id, limit)
                    error = exc
                    break
        raise CorruptEntry(f"{self.topic} (ledger {self.ledger_id}): {error}")

    def _corrupt_header(self, ids, values) -> CorruptEntry:
        """The error naming the first entry of a recovery chunk whose header is damaged."""
        for entry_id, value in zip(ids.tolist(), values):
            try:
                decode_header(value, verify=False)
            except CorruptEntry as exc:
                reason = str(exc).removeprefix("entry: ")
                return CorruptEntry(
                    f"{self.topic} (ledger {self.ledger_id}): entry {entry_id}: {reason}"
                )
        return CorruptEntry(f"{self.topic} (ledger {self.ledger_id}): a damaged entry header")

    def highest_sequence(self, producer: str) -> int:
        """The highest sequence id persisted for `producer` here, or -1: read when a producer
        of that name attaches, not held in memory for every producer that ever wrote (a
        producer per task or request would make that grow for good)."""
        with self.storage.read() as lmdb_txn:
            raw = lmdb_txn.get(self._dedup_prefix + producer.encode(), db=self._dedup_db)
        return _DEDUP.unpack(raw)[0] if raw is not None else -1

    def _lookup_sequence(self, lmdb_txn, producer: str, sequence_id: int):
        prefix = self._dedup_prefix + producer.encode() + b"\0"
        target = prefix + _U64.pack(sequence_id)
        cursor = lmdb_txn.cursor(db=self._dedup_index_db)
        found = cursor.set_range(target)
        if not (found and bytes(cursor.key()) == target):
            # The entry holding it, if any, starts at the previous key.
            if not (cursor.prev() if found else cursor.last()):
                return None
        if not bytes(cursor.key()).startswith(prefix):
            return None
        entry_id, n, first_seq = _DEDUP_INDEX.unpack(cursor.value())
        if not first_seq <= sequence_id < first_seq + n:
            return None
        return entry_id, n, sequence_id - first_seq

    def duplicate_of(self, producer: str, sequence_id: int) -> MessageId | None:
        """The answer to a resend of (producer, sequence_id) at or below its highest sequence:
        the MessageId it is stored under (-1:-1 if it never was: a gap), or None when its entry
        belongs to a transaction aborted here, whose sequences do not count: store it anew."""
        with self.storage.read() as lmdb_txn:
            found = self._lookup_sequence(lmdb_txn, producer, sequence_id)
            if found is None:
                return MessageId(-1, -1, self.index)
            entry_id, n, batch_index = found
            if entry_id == _NEVER_WRITTEN:
                return None
            _, bufs = self.log.scan(lmdb_txn, entry_id, entry_id + 1)
            head = decode_header(bufs[0], verify=False) if bufs else None
        if (
            head is not None
            and (head.txn_msb or head.txn_lsb)
            and self.buffer.is_aborted(TxnID.from_halves(head.txn_msb, head.txn_lsb))
        ):
            return None
        if n > 1:
            return MessageId(self.ledger_id, entry_id, self.index, batch_index, n)
        return MessageId(self.ledger_id, entry_id, self.index)

    def check_position(self, entry_id: int, ledger_id: int) -> None:
        if ledger_id != self.ledger_id or not 0 <= entry_id < self.next_entry_id:
            raise InvalidMessageId(
                f"no message at ledger {ledger_id} entry {entry_id} on {self.topic} "
                f"(ledger {self.ledger_id}, entries below {self.next_entry_id})"
            )

    def position_of(self, mid: MessageId) -> tuple[int, int, int]:
        """(entry id, batch index, batch size) that every ack and negative ack of `mid` uses:
        a batch index names that one message, with the entry's count as batch size (one built
        by hand carries 0); -1 names the whole entry. Any other is InvalidMessageId."""
        # On every ack: the MessageId's slots are read directly, not through its methods.
        entry_id, batch_index, size = mid._entry_id, mid._batch_index, mid._batch_size
        if mid._ledger_id == self.ledger_id and 0 <= entry_id < self.next_entry_id:
            if batch_index == -1:
                return entry_id, -1, size
            i = entry_id - self.first_entry_id
            if i >= 0:
                n = self._counts[i]
                if 0 <= batch_index < n and (size == n or size == 0):
                    return (entry_id, batch_index, n) if n > 1 else (entry_id, -1, 0)
                raise InvalidMessageId(
                    f"no message at batch index {batch_index} (batch size {size}) of entry "
                    f"{entry_id} on {self.topic}, which holds {n}"
                )
            if batch_index >= 0:
                return entry_id, batch_index, size  # trimmed: its count is gone
        self.check_position(entry_id, mid._ledger_id)
        raise InvalidMessageId(f"no batch index {batch_index} in entry {entry_id} on {self.topic}")


def _within(bufs, max_bytes: int) -> int:
    """How many of the first buffers hold at most max_bytes together, one at least."""
    if sum(map(len, bufs)) <= max_bytes:
        return len(bufs)
    total = 0
    for i, buf in enumerate(bufs):
        total += len(buf)
        if total > max_bytes:
            return max(i, 1)
    return len(bufs)
