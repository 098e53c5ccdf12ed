"""The transaction buffer of a partition (Pulsar's TopicTransactionBuffer): which transactions
are ongoing here and which aborted, and the max read position that read-committed readers stop
at (the first entry of the oldest ongoing transaction). An end is a marker entry; repeated or
for a transaction that never wrote here, a no-op. State under the partition's lock. See
docs/internals.md, "Markers: what readers see"."""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from .._native import AbortSet, TxnID, encode_entry, header_columns
from .._native.types import MarkerType
from ..errors import InvalidTxnStatus
from .quiet import QuietCondition
from .watermark import BySequence

# Ended transactions remembered per partition above their coordinator's low watermark (below
# it, the watermark refuses their appends): a bound on memory while one long transaction holds
# the watermark back.
MAX_ENDED = 10_000


class TransactionBuffer:
    def __init__(self, partition) -> None:
        self.partition = partition
        self.lock = partition.lock
        self.cond = QuietCondition(partition.lock)
        self.ongoing: OrderedDict[TxnID, int] = OrderedDict()  # txn -> its first entry id
        self.inflight: dict[TxnID, int] = {}  # appends submitted, not yet published or failed
        self.claims: dict[int, TxnID] = {}  # claimed entry ids not yet published (claimed)
        self.ended: dict[TxnID, bool] = {}  # ended here (late appends refused), until below lwm
        self.low_watermarks: dict[int, int] = {}  # coordinator id -> last low watermark seen
        self.max_ended = MAX_ENDED
        # ongoing and ended by sequence, so that an end finds those below a low watermark
        # without a scan of all (rebuilt after recovery filled them directly)
        self._ongoing_seq = BySequence()
        self._ended_seq = BySequence()
        self._seq_stale = True
        self.aborts = AbortSet()
        self.abort_positions: dict[TxnID, int] = {}  # aborted txn -> its abort marker's entry
        self.committed = 0
        self.aborted = 0
        self.lwm_aborted = 0
        self.snapshot = None  # set by the snapshotter (txn/snapshot.py)
        # txn_check(txn_id, op): raises unless the transaction is OPEN at its coordinator
        # (wired by the broker; None: no coordinator to ask).
        self.txn_check = None

    # -- reading ---------------------------------------------------------------------------

    def max_read_position(self) -> int:
        """Entry id (exclusive) below which everything is decided: readable when committed."""
        with self.lock:
            if self.ongoing:
                # A claim can be ongoing above entries still being written.
                return min(next(iter(self.ongoing.values())), self.partition.next_entry_id)
            return self.partition.next_entry_id

    def aborted_mask(self, msb, lsb):
        """contains_many under the lock (the set may be growing on the writer thread)."""
        with self.lock:
            return self.aborts.contains_many(msb, lsb)

    def is_aborted(self, txn_id: TxnID) -> bool:
        with self.lock:
            return txn_id in self.aborts

    # -- recovery --------------------------------------------------------------------------

    def replay(self, entry_id: int, marker_type: int, msb: int, lsb: int) -> None:
        """Apply one ledger entry's header (recovery scans the ledger through this)."""
        if msb == 0 and lsb == 0:
            return
        self._seq_stale = True
        txn_id = TxnID.from_halves(msb, lsb)
        if marker_type == MarkerType.NONE:
            self.ongoing.setdefault(txn_id, entry_id)
            return
        self.ongoing.pop(txn_id, None)
        if marker_type == MarkerType.TXN_ABORT:
            self.aborts.add(txn_id)
            self.abort_positions[txn_id] = entry_id
            if self.snapshot is not None:
                self.snapshot.aborted(txn_id, entry_id)

    def replay_columns(self, ids, markers, msb, lsb) -> None:
        """``replay`` of many transactional entries at once (ascending entry ids, columns as
        numpy arrays): the same state, with Python work per transaction rather than per
        entry. A transaction's entries all come before its marker (late appends are
        refused), so its first data entry and whether a marker follows say it all."""
        n = len(ids)
        if not n:
            return
        self._seq_stale = True
        # A code per transaction: sort by (msb, lsb), number the runs.
        order = np.lexsort((lsb, msb))
        sorted_hi, sorted_lo = msb[order], lsb[order]
        starts = np.empty(n, bool)
        starts[0] = True
        np.not_equal(sorted_hi[1:], sorted_hi[:-1], out=starts[1:])
        starts[1:] |= sorted_lo[1:] != sorted_lo[:-1]
        code = np.empty(n, np.int64)
        code[order] = np.cumsum(starts) - 1
        his, los = sorted_hi[starts].tolist(), sorted_lo[starts].tolist()
        data = markers == MarkerType.NONE
        first = np.full(len(his), -1, np.int64)
        d = np.flatnonzero(data)[::-1]
        first[code[d]] = ids[d]  # written last to first: the earliest entry of each stays
        ended = np.zeros(len(his), bool)
        m = np.flatnonzero(~data)
        ended[code[m]] = True
        live = np.flatnonzero((first >= 0) & ~ended)
        live = live[np.argsort(first[live], kind="stable")]
        ongoing = self.ongoing
        for c in live.tolist():
            ongoing.setdefault(TxnID.from_halves(his[c], los[c]), int(first[c]))
        abort = MarkerType.TXN_ABORT
        for c, marker, entry_id in zip(code[m].tolist(), markers[m].tolist(), ids[m].tolist()):
            txn_id = TxnID.from_halves(his[c], los[c])
            ongoing.pop(txn_id, None)  # one the snapshot had open, ended here
            if marker == abort:
                self.aborts.add(txn_id)
                self.abort_positions[txn_id] = entry_id
                if self.snapshot is not None:
                    self.snapshot.aborted(txn_id, entry_id)

    # -- appends ---------------------------------------------------------------------------

    def begin_append(self, txn_id: TxnID) -> None:
        """Before an append of txn_id is submitted: refuse it if the transaction has ended
        here, lies below its coordinator's low watermark or is not OPEN at its coordinator;
        else count it in flight (an end waits for it, under this lock)."""
        with self.lock:
            if txn_id in self.ended or txn_id.sequence < self.low_watermarks.get(
                txn_id.coordinator_id, 0
            ):
                raise InvalidTxnStatus(
                    f"transaction {txn_id} has ended on {self.partition.topic}: "
                    "nothing more can be produced in it"
                )
            if self.txn_check is not None:
                self.txn_check(txn_id, "produce in")
            self.inflight[txn_id] = self.inflight.get(txn_id, 0) + 1

    def claimed(self, txn_id: TxnID, entry_id: int) -> None:
        """Lock held: `entry_id` is claimed for an entry of txn_id (Partition.claim), written
        later: the transaction is ongoing here from it on, so readers stop below it."""
        self.claims[entry_id] = txn_id
        self._ongoing_from(txn_id, entry_id)

    def claim_failed(self, entry_id: int) -> None:
        """The claimed entry was never written (its transaction can only abort)."""
        with self.lock:
            self.claims.pop(entry_id, None)

    def appended(self, txn_id: TxnID, first_entry_id: int) -> None:
        """An append is durable (writer thread, partition lock held, before publishing)."""
        if self.claims:
            self.claims.pop(first_entry_id, None)
        self._ongoing_from(txn_id, first_entry_id)
        self._settled(txn_id)

    def _ongoing_from(self, txn_id: TxnID, first_entry_id: int) -> None:
        """Lock held: txn_id is ongoing from `first_entry_id` on, unless from before. ongoing
        stays in entry order (max_read_position takes its first): a claim can come before an
        entry written below it is published, of another transaction or of its own."""
        ongoing = self.ongoing
        current = ongoing.get(txn_id)
        if current is not None and current <= first_entry_id:
            return
        if current is None:
            self._ongoing_seq.add(txn_id)
            behind = bool(ongoing) and first_entry_id < next(reversed(ongoing.values()))
        else:
            behind = True  # moved down in place
        ongoing[txn_id] = first_entry_id
        if behind:
            in_order = sorted(ongoing.items(), key=lambda item: item[1])
            ongoing.clear()
            ongoing.update(in_order)

    def append_failed(self, txn_id: TxnID) -> None:
        with self.lock:
            self._settled(txn_id)

    def _settled(self, txn_id: TxnID) -> None:
        n = self.inflight.get(txn_id, 0) - 1
        if n > 0:
            self.inflight[txn_id] = n
        else:
            self.inflight.pop(txn_id, None)
        # Every time: an end waits until no more than the appends riding with it are left.
        self.cond.notify_all()

    # -- the participant interface ---------------------------------------------------------

    def end_txn(self, txn_id: TxnID, commit: bool, low_watermark: int) -> None:
        """Commit or abort txn_id here (idempotent), and abort what the low watermark says is
        finished but still ongoing here."""
        op = self.end_op(txn_id, commit, low_watermark)
        if op is not None:
            storage = self.partition.storage
            storage.wait(storage.submit(op))

    def end_op(self, txn_id: TxnID, commit: bool, low_watermark: int, riding: int = 0):
        """``end_txn`` as a group-commit operation for the caller to write (its markers), or
        None when there is nothing to write here. Appends of these transactions are refused
        from now on; the rest of the state changes when the markers are published, so an op
        that never lands changes nothing else, and ending again writes the markers again.

        `riding`: appends of txn_id written in the same LMDB transaction, before these markers
        (counted in flight, not waited for; they make the transaction ongoing here)."""
        with self.lock:
            self._mark_ended(txn_id, commit)
            while self.inflight.get(txn_id, 0) > riding:
                self.cond.wait()
            todo = [(txn_id, commit)] if txn_id in self.ongoing or riding else []
            todo += self._below(txn_id.coordinator_id, low_watermark, txn_id)
        if not todo:
            return None
        return self._markers_op(todo)

    def advance(self, coordinator_id: int, low_watermark: int):
        """The low watermark of a coordinator, pushed by its timer: what is ongoing here
        below it has ended at the coordinator (its end never came here) and is aborted.
        A group-commit operation writing those markers, or None."""
        with self.lock:
            if low_watermark <= self.low_watermarks.get(coordinator_id, 0):
                return None
            todo = self._below(coordinator_id, low_watermark, None)
        return self._markers_op(todo) if todo else None

    def _below(self, cid: int, low_watermark: int, skip) -> list:
        """Lock held: take `low_watermark` of coordinator `cid`; the (txn, False) ends of the
        transactions below it still ongoing here (but `skip`), now ended here; and forget
        the ended ones below it (the watermark refuses their appends)."""
        if low_watermark > self.low_watermarks.get(cid, 0):
            self.low_watermarks[cid] = low_watermark
        if self._seq_stale:
            self._ongoing_seq.rebuild(self.ongoing)
            self._ended_seq.rebuild(self.ended)
            self._seq_stale = False
        todo = []
        for t in self._ongoing_seq.below(cid, low_watermark):
            if t not in self.ongoing:
                continue  # ended here already
            self._ongoing_seq.add(t)  # until its marker is published
            if t != skip:
                self._mark_ended(t, False)
                todo.append((t, False))
                self.lwm_aborted += 1
        self._ongoing_seq.compact(self.ongoing)
        for t in self._ended_seq.below(cid, self.low_watermarks.get(cid, 0)):
            if t in self.ongoing:
                self._ended_seq.add(t)  # its marker is not published yet
            else:
                self.ended.pop(t, None)
        self._ended_seq.compact(self.ended)
        return todo

    def messages_of(self, txn_id: TxnID) -> int:
        """Messages of txn_id stored here (read from the ledger's entry headers from its
        first entry on: for the rare commit that has to check them)."""
        part = self.partition
        with self.lock:
            start = self.ongoing.get(txn_id)
            end = part.next_entry_id
        if start is None:
            return 0
        total = 0
        with part.storage.read() as lmdb_txn:
            while start < end:
                ids, bufs = part.log.scan(lmdb_txn, start, end, 4096)
                if not len(ids):
                    break
                counts, markers, msb, lsb = header_columns([bytes(b) for b in bufs])
                mine = (
                    (msb == txn_id.most_sig_bits) & (lsb == txn_id.least_sig_bits) & (markers == 0)
                )
                total += int(counts[mine].sum())
                start = int(ids[-1]) + 1
        return total

    def _mark_ended(self, txn_id: TxnID, commit: bool) -> None:
        ended = self.ended
        if txn_id not in ended:
            self._ended_seq.add(txn_id)
            if len(ended) >= self.max_ended:
                # A long transaction holds a low watermark back, and the ended ones pile up
                # above it: forget the oldest (done long ago; the race this guards against,
                # a send crossing its own transaction's end, is over within moments).
                oldest = next(iter(ended))
                if oldest not in self.ongoing:
                    del ended[oldest]
        ended[txn_id] = commit

    def _markers_op(self, todo: list) -> object:
        """One append of a commit or abort marker per (txn, commit) of `todo`."""
        part = self.partition
        now = int(time.time() * 1000)
        entries = [
            encode_entry(
                [],
                marker_type=MarkerType.TXN_COMMIT if commit else MarkerType.TXN_ABORT,
                txn_msb=t.most_sig_bits,
                txn_lsb=t.least_sig_bits,
                publish_time=now,
            )
            for t, commit in todo
        ]

        def before_publish(first: int) -> None:
            for i, (t, commit) in enumerate(todo):
                if t.sequence < self.low_watermarks.get(t.coordinator_id, 0):
                    self.ended.pop(t, None)  # the watermark refuses its appends from now on
                if self.ongoing.pop(t, None) is None:
                    continue  # a repeated end raced with this one: already marked
                if commit:
                    self.committed += 1
                else:
                    self.aborted += 1
                    self.aborts.add(t)
                    self.abort_positions[t] = first + i
                    if self.snapshot is not None:
                        self.snapshot.aborted(t, first + i)

        def on_published(first: int) -> None:
            if self.snapshot is not None:
                for _ in todo:
                    self.snapshot.txn_ended()

        return part.append_op(
            entries,
            [0] * len(entries),
            0,
            on_published=on_published,
            before_publish=before_publish,
        )

    # -- trimming and views ----------------------------------------------------------------

    def drop_trimmed(self, first_entry_id: int) -> int:
        """Forget aborted TxnIDs whose entries (all before their marker) are trimmed."""
        with self.lock:
            gone = [t for t, pos in self.abort_positions.items() if pos < first_entry_id]
            for t in gone:
                del self.abort_positions[t]
                self.aborts.discard(t)
            return len(gone)

    def stats(self) -> dict:
        with self.lock:
            out = {
                "max_read_position": self.max_read_position(),
                "last_entry_id": self.partition.last_entry_id,
                "ongoing_txn_size": len(self.ongoing),
                "ongoing_txns": [str(t) for t in list(self.ongoing)[:100]],
                "aborted_txn_count": len(self.aborts),
                "committed": self.committed,
                "aborted": self.aborted,
                "aborted_by_low_watermark": self.lwm_aborted,
                "ended_remembered": len(self.ended),
                "low_watermarks": {str(c): w for c, w in sorted(self.low_watermarks.items())},
            }
        if self.snapshot is not None:
            out.update(self.snapshot.stats())
        return out
