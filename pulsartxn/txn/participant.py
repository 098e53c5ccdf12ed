"""What a transaction's coordinator asks of its participants (seeds: TC deep dive, "end
transaction"), and where it finds them. The broker wires it: see docs/architecture.md."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from .._native import TxnID
from ..errors import excerpt
from ..storage import WriteOp

PARTITION = "partition"
SUBSCRIPTION = "subscription"


class Participant(Protocol):
    """A partition or subscription a transaction touched, here or in another broker. One on
    another broker holds its part durably once it has answered the op (the decision needs
    nothing more of it); one here may hold it until the decision's write."""

    def end_txn(self, txn_id: TxnID, commit: bool, low_watermark: int) -> None:
        """Apply the outcome, and abort what is still ongoing below the low watermark. The
        coordinator retries a failure until it succeeds: a repeated call succeeds."""


class TransactionBuffer(Participant, Protocol):
    """A partition of this broker's store (its transaction buffer)."""

    def end_op(
        self, txn_id: TxnID, commit: bool, low_watermark: int, riding: int = 0
    ) -> WriteOp | None:
        """``end_txn`` as an operation the coordinator writes with its decision (the markers),
        None when there is nothing to write. `riding`: appends of txn_id written before the
        markers in the same LMDB transaction."""

    def messages_of(self, txn_id: TxnID) -> int:
        """Messages of txn_id stored here (to check an unverified commit)."""


class PendingAckHandle(Participant, Protocol):
    """A subscription of this broker's store (its pending acks). Its end writes the cursor,
    which may ride with a later group commit."""

    def prepare(self, txn_id: TxnID, expected: int | None) -> None:
        """Before a commit is decided: txn_id's acks are durable here, and number at least
        `expected` (else an ``abort_only`` error)."""

    def prepare_op(self, txn_id: TxnID, expected: int | None) -> WriteOp | None:
        """``prepare`` as an operation written with the decision; None if nothing to write."""

    def end_op(
        self, txn_id: TxnID, commit: bool, low_watermark: int, expected: int | None
    ) -> WriteOp | None:
        """Its part of a one-write end (every participant local: the cursor with txn_id's
        acks); None when it cannot take part (it is ended the logged way)."""

    def end_later(self, txn_id: TxnID, commit: bool, low_watermark: int) -> Future | None:
        """``end_txn`` whose write rides with the next group commit: its future (None when
        nothing is written). For a coordinator whose decision is durable already."""


class _Stateless:
    """A subscription that no longer exists: nothing of a transaction is left to end."""

    def end_txn(self, txn_id: TxnID, commit: bool, low_watermark: int) -> None:
        return None


STATELESS: Participant = _Stateless()

Name = str | tuple[str, str]  # a partition, or (partition, subscription)


class Participants:
    """Where coordinators find a transaction's participants. `buffer` and `pending_ack` look
    up this broker's own (a subscription that is gone: None); `elsewhere`, when given, is
    asked first and answers for participants it owns (another broker's, in tests a stand-in)."""

    def __init__(
        self,
        buffer: Callable[[str], TransactionBuffer],
        pending_ack: Callable[[str, str], PendingAckHandle | None],
        elsewhere: Callable[[str, Name], Participant | None] | None = None,
    ) -> None:
        self._buffer = buffer
        self._pending_ack = pending_ack
        self._elsewhere = elsewhere

    def find(self, kind: str, name: Name) -> tuple[Participant, bool]:
        """The participant to tell the outcome, wherever it lives, and whether this broker's
        store holds it (then its part may ride in the decision's write)."""
        if self._elsewhere is not None:
            found = self._elsewhere(kind, name)
            if found is not None:
                return found, False
        if kind == PARTITION:
            return self._buffer(name), True
        if kind == SUBSCRIPTION:
            found = self._pending_ack(*name)
            return (STATELESS, False) if found is None else (found, True)
        raise ValueError(f"unknown participant kind {excerpt(kind)}")

    def local(self, kind: str, name: Name) -> TransactionBuffer | PendingAckHandle | None:
        """The participant if this broker's store holds it, else None."""
        found, local = self.find(kind, name)
        return found if local else None

    def resolve(self, kind: str, name: Name) -> Participant:
        """The participant to tell the outcome, wherever it lives."""
        return self.find(kind, name)[0]
