"""The native core of pulsartxn and the choice of implementation.

Two implementations of one API: the compiled Cython modules in this package and the pure-Python
twins in :mod:`pulsartxn._native.reference`. The rest of pulsartxn imports the names below and
never a submodule, so ``PULSARTXN_IMPL=reference`` runs the whole system on the twins.
If the compiled modules cannot be imported (a source checkout that was never built), the
twins are used and a warning says so.
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import SimpleNamespace

MODULES = (
    "txnid",
    "abortset",
    "ackset",
    "entrycodec",
    "entrydecode",
    "entrylog",
    "outcome",
    "producer",
    "dispatch",
    "recording",
    "flushtimer",
    "message",
    "asyncwrite",
)

NAMES = (
    "TxnID",
    "TxnIdAllocator",
    "MAX_SEQUENCE",
    "AbortSet",
    "AckSet",
    "PendingAckIndex",
    "EntryHeader",
    "DecodedEntries",
    "EntryLog",
    "encode_entry",
    "encode_entries",
    "decode_header",
    "decode_entries",
    "header_columns",
    "crc32c",
    "value_sizes",
    "PartitionProducer",
    "TxnBatch",
    "Outcome",
    "MessageFuture",
    "HEADER_SIZE",
    "take_buffered",
    "buffer_messages",
    "Pending",
    "Recorder",
    "RecordingTxn",
    "RecordingCursor",
    "FlushTimer",
    "Message",
    "MessageId",
    "message_fields",
    "messages_from_fields",
    "AsyncWriter",
)


def load(kind: str) -> SimpleNamespace:
    """Return a namespace with every name of NAMES from the ``native`` or ``reference`` modules."""
    if kind == "native":
        package = __name__
    elif kind == "reference":
        package = __name__ + ".reference"
    else:
        raise ValueError(f"unknown implementation {kind!r}: expected 'native' or 'reference'")
    ns = SimpleNamespace(kind=kind)
    for module_name in MODULES:
        module = importlib.import_module(f"{package}.{module_name}")
        for name in NAMES:
            if hasattr(module, name) and not hasattr(ns, name):
                setattr(ns, name, getattr(module, name))
    return ns


def _choose() -> SimpleNamespace:
    wanted = os.environ.get("PULSARTXN_IMPL", "native")
    if wanted == "native":
        try:
            return load("native")
        except ImportError as exc:
            warnings.warn(
                f"pulsartxn native core not importable ({exc}); using the pure-Python twins",
                RuntimeWarning,
                stacklevel=2,
            )
            return load("reference")
    return load(wanted)


_impl = _choose()
IMPLEMENTATION: str = _impl.kind
globals().update({name: getattr(_impl, name) for name in NAMES if hasattr(_impl, name)})

__all__ = ["IMPLEMENTATION", "load", *NAMES]
