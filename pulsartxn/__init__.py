"""pulsartxn: Apache Pulsar's transaction model with a native core, durable on LMDB.

The public surface is docs/API.md's; everything below is importable from here.
"""

from __future__ import annotations

import logging as _logging

from . import errors as _errors
from ._native import IMPLEMENTATION, TxnID
from .broker import Broker
from .client import Client, Consumer, Producer, Reader  # every client's handles (registered)
from .errors import *  # noqa: F403 - the hierarchy, listed once (errors.__all__)
from .messaging.consumer import ConsumerType, InitialPosition, Isolation
from .messaging.dead_letter import ConsumerDeadLetterPolicy, DeadLetterPolicy
from .messaging.message import Message, MessageId
from .messaging.send_options import BatchingType, CompressionType, Result
from .txn.state import TxnState
from .txn.transaction import Transaction

# Library etiquette: records go where the application's logging config sends them, if any.
_logging.getLogger("pulsartxn").addHandler(_logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "IMPLEMENTATION",
    "TxnID",
    "Broker",
    "Client",
    "Consumer",
    "Producer",
    "Reader",
    "BatchingType",
    "CompressionType",
    "ConsumerDeadLetterPolicy",
    "ConsumerType",
    "DeadLetterPolicy",
    "InitialPosition",
    "Isolation",
    "Message",
    "MessageId",
    "Result",
    "Transaction",
    "TxnState",
    *_errors.__all__,
    "__version__",
]
