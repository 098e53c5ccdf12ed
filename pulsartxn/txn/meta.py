"""A transaction as its coordinator knows it, and the coordinator's state names and limits."""

from __future__ import annotations

import time

from ..errors import InvalidTxnStatus, TransactionTimeout
from .state import EndReason, TxnState

# Pulsar's pulsar_txn_execution_latency buckets (ms); the last bucket is "overflow".
HISTOGRAM_MS = (10, 20, 50, 100, 500, 1000, 5000, 15000, 30000, 60000, 300000, 1500000, 3000000)
RECENT_FINISHED = 1 << 18  # outcomes kept per coordinator after a transaction's records go
OUTCOME_PAGE = 4096  # sequences per page of those outcomes (one byte each)
# What a coordinator may hold for good: its outcomes in full and about 8 KiB of its own
# (measured: 2,000 idle coordinators add 7 MB to a broker's RSS).
COORDINATOR_BYTES = RECENT_FINISHED + (8 << 10)
RESERVE_BLOCK = 4096  # sequences reserved per durable high-water mark write
MAX_BACKOFF_S = 5.0

OPEN, COMMITTING, ABORTING = TxnState.OPEN, TxnState.COMMITTING, TxnState.ABORTING
COMMITTED, ABORTED = TxnState.COMMITTED, TxnState.ABORTED


class TxnMeta:
    """A live transaction as its coordinator knows it."""

    __slots__ = (
        "txn_id",
        "seq",
        "state",
        "reason",
        "timeout_ms",
        "open_ms",
        "deadline",
        "group",
        "partitions",
        "subscriptions",
        "records",
        "durable",
        "inflight",
        "pending",
        "decision",
        "started",
        "retries",
        "last_error",
        "writes",
        "new_record",
        "atomic_end",
        "owner",
        "failed",
        "unverified",
        "deleted",
    )

    def __init__(self, txn_id, seq, timeout_ms, open_ms, deadline, group, owner=None) -> None:
        self.txn_id = txn_id
        self.seq = seq
        self.state = OPEN
        self.reason = 0
        self.timeout_ms = timeout_ms
        self.open_ms = open_ms
        self.deadline = deadline  # time.monotonic() seconds
        self.group = group
        self.partitions: set = set()
        self.subscriptions: set = set()
        self.records = 1  # the NEW record is index 0
        self.durable = False  # begun: its NEW record written, or riding with its first write
        self.inflight = 0  # add-participant writes not yet answered
        self.pending: set | None = None  # participants not yet finalized
        self.decision: int | None = None
        self.started = time.monotonic()
        self.retries = 0
        self.last_error: str | None = None
        self.writes: list | None = None  # participants' deferred writes (futures)
        # The NEW record (a log.StagedNew) while it is not known to be in the log: every
        # write of the transaction carries it until one has landed (Coordinator.stage).
        self.new_record = None
        # Ended in one write with every participant's part: its staged records are not put.
        self.atomic_end = False
        self.owner = owner  # log.IN_PROCESS, a session id, or None (not recorded)
        self.failed: BaseException | None = None  # a failed send or ack: it can only abort
        # Recovered OPEN after a stop without close: what it was answered may be lost, so a
        # commit must state its sends and acks (the handle that made them counts them).
        self.unverified = False
        # Its records' deletion is applied (the group commit's order): a registration applied
        # after it writes nothing, or it would outlive the transaction in the log.
        self.deleted = False

    @property
    def commit(self) -> bool:
        return self.state in (COMMITTING, COMMITTED)

    def participants(self) -> list:
        return [("partition", p) for p in sorted(self.partitions)] + [
            ("subscription", s) for s in sorted(self.subscriptions)
        ]


def status_error(txn_id, state: TxnState, reason: int, timeout_ms: int, op: str):
    if state in (ABORTING, ABORTED) and reason == EndReason.TIMEOUT:
        return TransactionTimeout(
            f"cannot {op} transaction {txn_id}: it timed out after {timeout_ms} ms and was aborted"
        )
    if state in (ABORTING, ABORTED) and reason == EndReason.ORPHANED:
        return InvalidTxnStatus(
            f"cannot {op} transaction {txn_id}: it was aborted when its client went away "
            "(its process ended or its session expired)"
        )
    return InvalidTxnStatus(f"cannot {op} transaction {txn_id}: it is {state.value}")


def abort_only(exc: BaseException) -> BaseException:
    """Mark a commit's error as one that leaves the transaction able only to abort: the
    commit then aborts it before raising (as Pulsar's client does after a failed op)."""
    exc.abort_only = True
    return exc


class Outcomes:
    """What became of a coordinator's finished transactions, for the last `size` sequences:
    one byte each, in pages of `page` sequences made when a transaction of theirs ends and
    dropped once the window passes them. A busy coordinator holds size/page + 1 pages (256 KiB
    remember 262,144), an idle one none: rings made whole up front cost 256 KiB a coordinator
    (4.6 GB for the 20,000 of a mistaken scale). The timeout of one aborted by its deadline is
    kept beside it (the error names it).

    Sequences only grow while the broker runs: ``begun`` marks each as not finished and moves
    the window's top.
    """

    __slots__ = ("_pages", "_page", "_size", "_high", "_low", "_timeouts")

    def __init__(self, size: int = RECENT_FINISHED, page: int = OUTCOME_PAGE) -> None:
        self._size = size
        self._page = min(page, size)
        self._pages: dict[int, bytearray] = {}  # seq // page -> its sequences' codes
        self._high = -1  # the window is (_high - size, _high]
        self._low = 0  # no page below this one
        self._timeouts: dict[int, int] = {}  # seq -> timeout_ms, aborted by their deadline

    def begun(self, seq: int) -> None:
        if seq > self._high:
            self._advance(seq)
        elif seq > self._high - self._size:
            codes = self._pages.get(seq // self._page)
            if codes is not None:
                codes[seq % self._page] = 0

    def _advance(self, top: int) -> None:
        """Move the window up to `top`: the pages it leaves go. Slots above the old top were
        never written, so the sequences the window gains start empty."""
        self._high = top
        cut = (top - self._size + 1) // self._page  # pages below it are out of the window
        if cut > self._low:
            pages = self._pages
            for key in [k for k in pages if k < cut]:
                del pages[key]
            self._low = min(pages, default=cut)
            if self._timeouts:
                floor = top - self._size
                self._timeouts = {s: t for s, t in self._timeouts.items() if s > floor}

    def finished(self, seq: int, state: TxnState, reason: int, timeout_ms: int) -> None:
        if seq > self._high:
            self._advance(seq)
        elif seq <= self._high - self._size:
            return  # older than the window
        key = seq // self._page
        codes = self._pages.get(key)
        if codes is None:
            codes = self._pages[key] = bytearray(self._page)
            self._low = min(self._low, key)
        codes[seq % self._page] = 1 + (state is ABORTED) + 2 * int(reason)
        if state is ABORTED and reason == EndReason.TIMEOUT:
            self._timeouts[seq] = timeout_ms

    def get(self, seq: int) -> tuple[TxnState, int, int] | None:
        """(state, reason, timeout_ms) of a finished transaction, or None (live, never
        seen, or older than the window)."""
        if seq > self._high or seq <= self._high - self._size:
            return None
        codes = self._pages.get(seq // self._page)
        code = codes[seq % self._page] if codes is not None else 0
        if not code:
            return None
        code -= 1
        state = ABORTED if code & 1 else COMMITTED
        return state, code >> 1, self._timeouts.get(seq, 0)

    @property
    def nbytes(self) -> int:
        """Bytes its pages hold."""
        return len(self._pages) * self._page
