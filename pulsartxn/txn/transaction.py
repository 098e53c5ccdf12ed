"""The client's handle on a transaction (API.md, "Transactions")."""

from __future__ import annotations

import abc
import weakref

from .._native import TxnID
from .._native.keywords import strict_class
from ..errors import InvalidTxnStatus, PulsarTxnError, TransactionTimeout, excerpt
from .coordinators import check_ms
from .state import FINAL, TxnState


def end_wait_s(timeout_ms) -> float | None:
    """A commit's or abort's `timeout_ms` as seconds (None: the broker's operation timeout);
    ValueError, before anything is done, unless it is a number of 0..MAX_TIMEOUT_MS (check_ms)."""
    check_ms("timeout_ms", timeout_ms, optional=True)
    return None if timeout_ms is None else float(timeout_ms) / 1000.0


class TransactionContext:
    """``with txn:`` commits on normal exit and aborts on an exception (the embedded and the
    remote transaction share this)."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if self.state is TxnState.OPEN:
                self.commit()  # a commit that cannot happen aborts, then raises
            return
        try:
            if self.state is TxnState.OPEN:
                self.abort()
        except PulsarTxnError:
            pass  # the original exception is what the caller needs to see


@strict_class
class Transaction(TransactionContext, metaclass=abc.ABCMeta):  # noqa: B024 - for register()
    """``client.new_transaction()``: commit or abort it, or use it as a context manager
    (commits on normal exit, aborts on an exception)."""

    # What a network session needs to use another's transaction; in process, none.
    capability: str | None = None

    __slots__ = (
        "_client",
        "_service",
        "id",
        "_final",
        "_partitions",
        "_staged",
        "_subscriptions",
        "_producers",
        "_error",
        "_ack_counts",
        "_send_counts",
        "_counted",
        "_riding",
        "__weakref__",
    )

    def __init__(self, client, service, txn_id: TxnID, counted: bool = True) -> None:
        self._client = client
        self._service = service
        self.id = txn_id
        self._final: TxnState | None = None
        # Participants this client has already registered with the coordinator (once each).
        self._partitions: set = set()
        self._staged: set = set()  # partitions whose registration rides in a write in flight
        self._subscriptions: set = set()
        # Producers with batches of this transaction, id -> weak reference (made at the
        # first: most have none; a WeakSet costs more to walk at every end).
        self._producers: dict | None = None
        self._error: BaseException | None = None  # a failed send or a conflict: abort only
        # Acks per (partition, subscription) and messages per partition made through this
        # handle: a commit states them, and the broker checks it still holds them all.
        # `counted`: this handle opened the transaction, so they are all of them.
        self._ack_counts: dict = {}
        self._send_counts: dict = {}
        self._counted = counted
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

    def commit(
        self, timeout_ms: float | None = None, *, counts: tuple[dict, dict] | None = None
    ) -> None:
        """Commit; returns once the decision is durable and every participant has its part
        (COMMITTED), or one failed its part and is retried in the background (COMMITTING).

        Raises TransactionTimeout if it was aborted by its deadline, InvalidTxnStatus if it is
        not OPEN, Timeout after timeout_ms (default: the broker's operation timeout) saying
        its state. If it cannot commit (a send or an ack of it failed, or what it made was
        lost), it is aborted and the error says why. `counts`: (acks, sends) its committer
        made, for a handle that relays another's (the network service); None: this handle's.
        """
        self._end(True, timeout_ms, counts)

    def abort(self, timeout_ms: float | None = None) -> None:
        self._end(False, timeout_ms)

    def _counts(self) -> tuple[dict, dict] | None:
        """(acks per (partition, subscription), messages per partition) made through this
        handle, if it opened the transaction (else None: it does not know them all)."""
        if not self._counted:
            return None
        return dict(self._ack_counts), dict(self._send_counts)

    def _add_producer(self, producer) -> None:
        """`producer` holds a batch of this transaction: the end flushes or drops it."""
        if self._producers is None:
            self._producers = {}
        self._producers[id(producer)] = weakref.ref(producer)

    def _live_producers(self) -> list:
        if not self._producers:
            return []
        return [p for ref in list(self._producers.values()) if (p := ref()) is not None]

    def _failed(self, exc: BaseException) -> None:
        """A send or an acknowledgement of this transaction failed: it can only abort now
        (its coordinator knows, so any handle's commit aborts it)."""
        if self._error is None:
            self._error = exc
        self._service.fail(self.id, exc)

    def _check_open(self, op: str) -> None:
        """Raise InvalidTxnStatus (or TransactionTimeout) unless the transaction may still
        produce or acknowledge."""
        if self._final is not None:
            cls = TransactionTimeout if self._final is TxnState.TIMEOUT else InvalidTxnStatus
            raise cls(f"cannot {op} transaction {self.id}: it is {self._final.value}")

    def _end(self, commit: bool, timeout_ms, counts=None) -> None:
        timeout_s = end_wait_s(timeout_ms)
        self._client._check_open()
        # What producers still hold of it goes into its end's write, an abort's too (aborted
        # there, as Pulsar's abort waits for the sends before it): their sequence ids then do
        # not count, after a restart or in a new producer as well.
        for producer in self._live_producers():
            producer._txn_flush(self, wait=False)
        acks = sends = None
        if commit:
            acks, sends = counts if counts is not None else (self._counts() or (None, None))
        riding, self._riding = self._riding, []
        state = self._service.end(self.id, commit, timeout_s, acks, riding, sends)
        if state in FINAL:
            self._final = state
            # A send that raced this end, into a batch after the flush above, is refused now
            # (never written, its ids on record) rather than left until its producer flushes;
            # one that comes after this sees _final (Producer._txn_add).
            for producer in self._live_producers():
                producer._txn_flush(self, wait=False)

    def _stage_partition(self, topic):
        """None once the coordinator has `topic` on record for this transaction; else
        ``(apply, landed)``: ``apply`` goes into the write of the data (one LMDB transaction,
        one fsync), ``landed(ok)`` is called when that write has landed or failed."""
        if topic in self._partitions or topic in self._staged:
            return None
        apply, done = self._service.stage_partitions(self.id, [topic])
        partitions, staged = self._partitions, self._staged
        staged.add(topic)  # the next send there, before this one has landed, adds no record

        def landed(ok: bool) -> None:
            done(ok)
            staged.discard(topic)
            if ok:
                partitions.add(topic)

        return apply, landed

    def _stage_subscription(self, name):
        """None once `name` is on record; else the registration's ``apply``, for the
        pending-ack log write that holds this transaction's acks there."""
        if name in self._subscriptions:
            return None
        apply, _ = self._service.stage_subscriptions(self.id, [name])
        return apply

    def _flush_for_commit(self) -> None:
        """Write what producers still hold of this transaction and wait until it is stored
        (a decision over many transactions then checks each can commit)."""
        for producer in self._live_producers():
            producer._txn_flush(self)

    def _register_partitions(self, partitions) -> None:
        """Log the partitions this transaction produces to (cached: once per partition)."""
        new = [p for p in partitions if p not in self._partitions]
        if new:
            self._service.add_partitions(self.id, new)
            self._partitions.update(new)

    def _register_subscriptions(self, subscriptions) -> None:
        new = [s for s in subscriptions if s not in self._subscriptions]
        if new:
            self._service.add_subscriptions(self.id, new)
            self._subscriptions.update(new)

    def __repr__(self) -> str:
        return f"Transaction({self.id}, {self.state.value})"

    def __eq__(self, other) -> bool:
        return type(other) is Transaction and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


def txn_list(name: str, value) -> list:
    """`value`, an iterable of transactions or TxnIDs, as a list; a str or bytes (whose
    characters it would walk), or one transaction or id alone, is a TypeError."""
    if isinstance(value, (str, bytes, TxnID, TransactionContext)) or not hasattr(value, "__iter__"):
        raise TypeError(
            f"{name} must be an iterable of transactions or TxnIDs, not {excerpt(value)}"
        )
    return list(value)


def as_txn_id(value) -> TxnID:
    """A TxnID from a TxnID, a Transaction, its str ("<coordinator>:<sequence>") or its int."""
    if isinstance(value, TxnID):
        return value
    if isinstance(value, Transaction):
        return value.id
    if isinstance(value, str):
        return TxnID.parse(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return TxnID.from_int(value)
    raise TypeError(f"expected a TxnID, Transaction, str or int, not {type(value).__name__}")
