"""The one exception hierarchy of pulsartxn (API.md, "Errors").

Native modules raise these too: they import this module, so an error means the same thing
whichever implementation (native or the pure-Python twin) raised it.
"""

from __future__ import annotations

__all__ = [
    "PulsarTxnError",
    "TransactionConflict",
    "InvalidTxnStatus",
    "TransactionNotFound",
    "TransactionTimeout",
    "CoordinatorNotFound",
    "TopicNotFound",
    "InvalidTopicName",
    "ProducerBusy",
    "ConsumerBusy",
    "Timeout",
    "AlreadyClosed",
    "CorruptEntry",
]


class PulsarTxnError(Exception):
    """Base class of every error pulsartxn raises on purpose."""


class TransactionConflict(PulsarTxnError):
    """An ack conflicts with another transaction's pending ack, or acks an acknowledged message."""


class InvalidTxnStatus(PulsarTxnError):
    """The operation needs a transaction state the transaction is not in."""


class TransactionNotFound(PulsarTxnError):
    """The TxnID is unknown to its coordinator."""


class TransactionTimeout(InvalidTxnStatus):
    """The transaction was aborted by its timeout."""


class CoordinatorNotFound(PulsarTxnError):
    """The TxnID names a coordinator that does not exist."""


class TopicNotFound(PulsarTxnError):
    pass


class InvalidTopicName(PulsarTxnError):
    pass


class ProducerBusy(PulsarTxnError):
    pass


class ConsumerBusy(PulsarTxnError):
    pass


class Timeout(PulsarTxnError):
    pass


class AlreadyClosed(PulsarTxnError):
    pass


class CorruptEntry(PulsarTxnError):
    """Stored bytes failed to decode or to verify (bad header, length, or checksum)."""
