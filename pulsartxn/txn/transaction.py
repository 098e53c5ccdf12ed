"""The client's handle on a transaction (API.md, "Transactions")."""

from __future__ import annotations

import weakref

from .._native import TxnID
from ..errors import (
    InvalidTxnStatus,
    PulsarTxnError,
    Timeout,
    TransactionConflict,
    TransactionTimeout,
)
from .state import FINAL, TxnState


class TransactionContext:
    """``with txn:`` commits on normal exit and aborts on an exception (the embedded and the
    remote transaction share this)."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if self.state is TxnState.OPEN:
                self.commit()
            return
        try:
            if self.state is TxnState.OPEN:
                self.abort()
        except PulsarTxnError:
            pass  # the original exception is what the caller needs to see


class Transaction(TransactionContext):
    """``client.new_transaction()``: commit or abort it, or use it as a context manager
    (commits on normal exit, aborts on an exception)."""

    __slots__ = (
        "_client",
        "_service",
        "id",
        "_final",
        "partitions",
        "subscriptions",
        "_producers",
        "_error",
        "ack_counts",
        "_riding",
        "__weakref__",
    )

    def __init__(self, client, service, txn_id: TxnID) -> None:
        self._client = client
        self._service = service
        self.id = txn_id
        self._final: TxnState | None = None
        # Participants this client has already registered with the coordinator (once each).
        self.partitions: set = set()
        self.subscriptions: set = set()
        # Producers with batches of this transaction, id -> weak reference (made at the
        # first: most have none; a WeakSet costs more to walk at every end).
        self._producers: dict | None = None
        self._error: BaseException | None = None  # a failed send or a conflict: abort only
        # Acks made through this handle per (partition, subscription): the commit checks the
        # broker still holds them all.
        self.ack_counts: dict = {}
        # (op, carries a staged registration, partition) of batches submitted lazily: the
        # decision takes those still waiting into its own write.
        self._riding: list = []

    @property
    def state(self) -> TxnState:
        if self._final is not None:
            return self._final
        try:
            state = self._service.state_of(self.id)
        except PulsarTxnError:
            return TxnState.ERROR
        if state in FINAL:
            self._final = state
        return state

    def commit(self, timeout_ms: float | None = None, expected_acks: dict | None = None) -> None:
        """Commit; returns once the transaction is COMMITTED (every participant finalized).

        Raises TransactionTimeout if it was aborted by its deadline, InvalidTxnStatus if it is
        not OPEN. With timeout_ms, raises Timeout if finalizing takes longer; the commit is
        decided by then and completes in the background.
        """
        self._end(True, timeout_ms, expected_acks)

    def abort(self, timeout_ms: float | None = None) -> None:
        self._end(False, timeout_ms)

    def add_producer(self, producer) -> None:
        """`producer` holds a batch of this transaction: the end flushes or drops it."""
        if self._producers is None:
            self._producers = {}
        self._producers[id(producer)] = weakref.ref(producer)

    def _live_producers(self) -> list:
        if not self._producers:
            return []
        return [p for ref in list(self._producers.values()) if (p := ref()) is not None]

    def _failed(self, exc: BaseException) -> None:
        """A send or an acknowledgement of this transaction failed: it can only abort now."""
        if self._error is None:
            self._error = exc

    def check_open(self, op: str) -> None:
        """Raise InvalidTxnStatus (or TransactionTimeout) unless the transaction may still
        produce or acknowledge."""
        if self._final is not None:
            raise InvalidTxnStatus(
                f"cannot {op} in transaction {self.id}: it is {self._final.value}"
            )

    def _end(self, commit: bool, timeout_ms, expected_acks=None) -> None:
        self._client._check_open()
        if commit:
            for producer in self._live_producers():
                producer._txn_flush(self, wait=False)
            self._check_sendable()
        else:
            for producer in self._live_producers():
                producer._txn_drop(self)
        timeout_s = None if timeout_ms is None else max(float(timeout_ms), 0.0) / 1000.0
        expected = None
        if commit:
            expected = dict(self.ack_counts)
            for key, n in (expected_acks or {}).items():
                expected[tuple(key)] = max(n, expected.get(tuple(key), 0))
        riding, self._riding = self._riding, []
        state = self._service.end(self.id, commit, timeout_s, expected, riding)
        if state in FINAL:
            self._final = state
            return
        raise Timeout(
            f"transaction {self.id} is {state.value}: its participants are still being finalized"
        )

    def stage_partition(self, topic):
        """None once the coordinator has `topic` on record for this transaction; else
        ``(apply, landed)``: ``apply`` goes into the write of the data (one LMDB transaction,
        one fsync), ``landed(ok)`` is called when that write has landed or failed."""
        if topic in self.partitions:
            return None
        apply, done = self._service.stage_partitions(self.id, [topic])
        partitions = self.partitions

        def landed(ok: bool) -> None:
            done(ok)
            if ok:
                partitions.add(topic)

        return apply, landed

    def stage_subscription(self, name):
        """None once `name` is on record; else the registration's ``apply``, for the
        pending-ack log write that holds this transaction's acks there."""
        if name in self.subscriptions:
            return None
        apply, _ = self._service.stage_subscriptions(self.id, [name])
        return apply

    def flush_for_commit(self) -> None:
        """Write what producers still hold of this transaction and wait until it is in the
        ledger; raise if a send or an ack of it failed (it can only abort then)."""
        for producer in self._live_producers():
            producer._txn_flush(self)
        self._check_sendable()

    def _check_sendable(self) -> None:
        if self._error is not None:
            # A send refused because the transaction had timed out says so, as the commit of
            # a timed-out transaction does (TransactionTimeout), not just InvalidTxnStatus.
            if isinstance(self._error, (TransactionConflict, TransactionTimeout)):
                cls = type(self._error)
            else:
                cls = InvalidTxnStatus
            raise cls(
                f"transaction {self.id} cannot commit, only abort: {self._error}"
            ) from self._error

    def register_partitions(self, partitions) -> None:
        """Log the partitions this transaction produces to (cached: once per partition)."""
        new = [p for p in partitions if p not in self.partitions]
        if new:
            self._service.add_partitions(self.id, new)
            self.partitions.update(new)

    def register_subscriptions(self, subscriptions) -> None:
        new = [s for s in subscriptions if s not in self.subscriptions]
        if new:
            self._service.add_subscriptions(self.id, new)
            self.subscriptions.update(new)

    def __repr__(self) -> str:
        return f"Transaction({self.id}, {self.state.value})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Transaction) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)
