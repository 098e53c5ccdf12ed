"""A transaction as its coordinator knows it, and the coordinator's state names and limits."""

from __future__ import annotations

import time

from ..errors import InvalidTxnStatus, TransactionTimeout
from .state import EndReason, TxnState

# Pulsar's pulsar_txn_execution_latency buckets (ms); the last bucket is "overflow".
HISTOGRAM_MS = (10, 20, 50, 100, 500, 1000, 5000, 15000, 30000, 60000, 300000, 1500000, 3000000)
RECENT_FINISHED = 100_000  # outcomes kept in memory after a transaction's records are gone
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
    )

    def __init__(self, txn_id, seq, timeout_ms, open_ms, deadline, group) -> None:
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
    return InvalidTxnStatus(f"cannot {op} transaction {txn_id}: it is {state.value}")
