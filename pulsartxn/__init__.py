"""pulsartxn: Apache Pulsar's transaction model with a native core, durable on LMDB.

The public surface is API.md's; everything below is importable from here.
"""

from __future__ import annotations

from ._native import IMPLEMENTATION, TxnID
from .errors import (
    AlreadyClosed,
    ConsumerBusy,
    CoordinatorNotFound,
    CorruptEntry,
    InvalidTopicName,
    InvalidTxnStatus,
    ProducerBusy,
    PulsarTxnError,
    Timeout,
    TopicNotFound,
    TransactionConflict,
    TransactionNotFound,
    TransactionTimeout,
)

__version__ = "0.1.0"

__all__ = [
    "IMPLEMENTATION",
    "TxnID",
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
    "__version__",
]
