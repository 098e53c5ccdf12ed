"""pulsartxn: Apache Pulsar's transaction model with a native core, durable on LMDB.

The public surface is API.md's; everything below is importable from here.
"""

from __future__ import annotations

from ._native import IMPLEMENTATION, TxnID
from .broker import Broker
from .client import Client
from .errors import (
    AlreadyClosed,
    ConsumerBusy,
    CoordinatorNotFound,
    CoordinatorUnavailable,
    CorruptEntry,
    DataDirectoryLocked,
    InvalidConfiguration,
    InvalidMessageId,
    InvalidTopicName,
    InvalidTxnStatus,
    MessageTooBig,
    ProducerBusy,
    PulsarTxnError,
    QuotaExceeded,
    StorageError,
    StorageFull,
    Timeout,
    TooManyTransactions,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionConflict,
    TransactionNotFound,
    TransactionTimeout,
)
from .messaging.consumer import ConsumerType, InitialPosition, Isolation
from .messaging.message import Message, MessageId
from .txn.state import TxnState
from .txn.transaction import Transaction

__version__ = "0.1.0"

__all__ = [
    "IMPLEMENTATION",
    "TxnID",
    "Broker",
    "Client",
    "ConsumerType",
    "InitialPosition",
    "Isolation",
    "Message",
    "MessageId",
    "Transaction",
    "TxnState",
    "TooManyTransactions",
    "CoordinatorUnavailable",
    "DataDirectoryLocked",
    "InvalidConfiguration",
    "InvalidMessageId",
    "MessageTooBig",
    "StorageError",
    "StorageFull",
    "TopicAlreadyExists",
    "PulsarTxnError",
    "QuotaExceeded",
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
    "__version__",
]
