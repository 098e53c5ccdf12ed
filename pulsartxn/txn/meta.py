"""A transaction as its coordinator knows it, and the coordinator's state names and limits."""

from __future__ import annotations

import time

from ..errors import InvalidTxnStatus, TransactionTimeout
from .state import EndReason, TxnState

# Pulsar's pulsar_txn_execution_latency buckets (ms); the last bucket is "overflow".
HISTOGRAM_MS = (10, 20, 50, 100, 500, 1000, 5000, 15000, 30000, 60000, 300000, 1500000, 3000000)
RECENT_FINISHED = 1 << 18  # outcomes kept per coordinator after a transaction's records go
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
        # (key, value) of the NEW record while it is not known to be in the log: every write
        # of the transaction carries it until one has landed (Coordinator.stage).
        self.new_record: tuple | None = None
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
    one byte each in a ring (256 KiB remembers 262,144), where an entry per transaction in a
    dict cost about 170 bytes (270 MB for 16 coordinators at the old bound of 100,000 each).
    The timeout of one aborted by its deadline is kept beside it (the error names it).

    Sequences only grow while the broker runs: ``begun`` marks each as not finished (its slot
    may hold what the sequence `size` below it became) and moves the window's top.
    """

    __slots__ = ("_codes", "_size", "_high", "_timeouts")

    def __init__(self, size: int = RECENT_FINISHED) -> None:
        self._codes = bytearray(size)
        self._size = size
        self._high = -1  # every slot of (_high - size, _high] is this window's
        self._timeouts: dict[int, int] = {}  # seq -> timeout_ms, aborted by their deadline

    def begun(self, seq: int) -> None:
        if seq > self._high:
            self._clear(seq)
        else:
            self._codes[seq % self._size] = 0

    def _clear(self, top: int) -> None:
        """Move the window up to `top`: the slots of the sequences it gains start empty."""
        size, codes = self._size, self._codes
        lo = max(self._high + 1, top - size + 1)  # the first sequence to clear
        n, a = top - lo + 1, lo % size
        if a + n <= size:
            codes[a : a + n] = bytes(n)
        else:  # wraps around the end of the ring
            codes[a:] = bytes(size - a)
            codes[: a + n - size] = bytes(a + n - size)
        self._high = top
        if len(self._timeouts) > size // 8:
            floor = top - size
            self._timeouts = {s: t for s, t in self._timeouts.items() if s > floor}

    def finished(self, seq: int, state: TxnState, reason: int, timeout_ms: int) -> None:
        if seq > self._high:
            self._clear(seq)
        elif seq <= self._high - self._size:
            return  # older than the window
        self._codes[seq % self._size] = 1 + (state is ABORTED) + 2 * int(reason)
        if state is ABORTED and reason == EndReason.TIMEOUT:
            self._timeouts[seq] = timeout_ms

    def get(self, seq: int) -> tuple[TxnState, int, int] | None:
        """(state, reason, timeout_ms) of a finished transaction, or None (live, never
        seen, or older than the window)."""
        if seq > self._high or seq <= self._high - self._size:
            return None
        code = self._codes[seq % self._size]
        if not code:
            return None
        code -= 1
        state = ABORTED if code & 1 else COMMITTED
        return state, code >> 1, self._timeouts.get(seq, 0)
