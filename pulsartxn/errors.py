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
    "StorageError",
    "StorageFull",
    "DataDirectoryLocked",
    "MessageTooBig",
    "InvalidMessageId",
    "InvalidConfiguration",
    "TopicAlreadyExists",
    "TooManyTransactions",
    "CoordinatorUnavailable",
    "NotAuthorized",
    "QuotaExceeded",
    "BrokerUnavailable",
    "NotOwner",
    "SubscriptionNotFound",
    "SubscriptionAlreadyExists",
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


class SubscriptionNotFound(PulsarTxnError):
    """An admin call names a subscription the topic does not have."""


class SubscriptionAlreadyExists(PulsarTxnError):
    """admin.create_subscription of a name the topic has already."""


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


class StorageError(PulsarTxnError):
    """The disk failed a write (an I/O error); the write changed nothing."""


class StorageFull(StorageError):
    """The LMDB map or the disk is full; the write that hit it changed nothing."""


class DataDirectoryLocked(PulsarTxnError):
    """Another broker (in this or another process) has the data directory open."""


class MessageTooBig(PulsarTxnError, ValueError):
    """A message is larger than the broker's max_message_size; nothing was stored."""


class InvalidMessageId(PulsarTxnError, ValueError):
    """A MessageId that this topic or subscription never produced (unknown or foreign)."""


class InvalidConfiguration(PulsarTxnError):
    """The call is not allowed in this configuration (e.g. cumulative ack on Shared)."""


class TopicAlreadyExists(PulsarTxnError):
    """create_topic of a topic that exists."""


class TooManyTransactions(PulsarTxnError):
    """A coordinator is at its limit of open transactions (max_active_txns_per_coordinator)."""


class CoordinatorUnavailable(PulsarTxnError):
    """A coordinator exists but could not recover its log (see coordinator_stats)."""


class NotAuthorized(PulsarTxnError):
    """The caller's credentials do not allow the call (an admin call without the admin
    token, another session's transaction without its capability); nothing changed."""


class QuotaExceeded(PulsarTxnError):
    """A limit that keeps one client from using up what others need: the broker's (topics,
    partitions, max_dbs, the coordinators' memory budget) or a network session's (consumers,
    producers, open transactions, waiting receives); nothing was created or saved."""


def excerpt(value: object, limit: int = 100) -> str:
    """repr(value) cut to `limit` characters (with "..."): how an error shows what the caller
    sent, which may be a megabyte long and is sent back over the wire."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > limit:
        value = value[:limit]
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4300 digits
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Unrecordable(PulsarTxnError):
    """Internal: a write of a synced store's group that its journal could not replay exactly
    (a put that must not overwrite, a partial putmulti, a dropped database): the group fails
    instead of being journaled without it."""


class BrokerUnavailable(PulsarTxnError):
    """The broker that owns a bundle or a coordinator is not live (its data lives with it):
    retry; it takes them back when it returns."""


class NotOwner(BrokerUnavailable):
    """The broker asked does not own the bundle or coordinator: look it up again and ask its
    owner (Pulsar's lookup redirect)."""
