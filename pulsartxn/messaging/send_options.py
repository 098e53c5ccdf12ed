"""pulsar-client's producer options and send_async callback, as every client checks them
(docs/API.md, "Differences from pulsar-client")."""

from __future__ import annotations

import enum
from collections.abc import Callable
from concurrent.futures import Future

from ..errors import excerpt
from ..txn.coordinators import check_ms


class Result(enum.Enum):
    """What a send_async callback gets first on success, as pulsar-client's ``Result.Ok``
    (on failure it gets the exception)."""

    Ok = "Ok"


class CompressionType(enum.Enum):
    """pulsar-client's compression kinds; messages are stored uncompressed (NONE only)."""

    NONE = "NONE"
    LZ4 = "LZ4"
    ZLib = "ZLib"
    ZSTD = "ZSTD"
    SNAPPY = "SNAPPY"


class BatchingType(enum.Enum):
    """pulsar-client's batch builders: Default only (KeyBased is not implemented)."""

    Default = "Default"
    KeyBased = "KeyBased"


def check_batching(enabled: object, max_messages: object, max_bytes: object, delay_ms: object):
    """create_producer's batching options, alike in every client (None: the broker's)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"batching_enabled must be a bool, not {excerpt(enabled)}")
    for name, value in (
        ("batching_max_messages", max_messages),
        ("batching_max_allowed_size_in_bytes", max_bytes),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int or None, not {excerpt(value)}")
    check_ms("batching_max_publish_delay_ms", delay_ms, optional=True)


def check_producer_options(
    send_timeout_millis: object,
    block_if_queue_full: object,
    max_pending_messages: object,
    compression_type: object,
    batching_type: object,
    chunking_enabled: object,
) -> None:
    """pulsar-client's producer options, checked alike by every client (docs/API.md,
    "Differences from pulsar-client" says what each means here); bad values raise."""
    for name, value in (
        ("send_timeout_millis", send_timeout_millis),
        ("max_pending_messages", max_pending_messages),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, not {excerpt(value)}")
    for name, value in (
        ("block_if_queue_full", block_if_queue_full),
        ("chunking_enabled", chunking_enabled),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, not {excerpt(value)}")
    if not isinstance(compression_type, CompressionType):
        raise TypeError(
            f"compression_type must be a CompressionType, not {excerpt(compression_type)}"
        )
    if compression_type is not CompressionType.NONE:
        raise ValueError(
            f"compression_type {compression_type.name} is not implemented: pulsartxn stores "
            "messages uncompressed (CompressionType.NONE)"
        )
    if not isinstance(batching_type, BatchingType):
        raise TypeError(f"batching_type must be a BatchingType, not {excerpt(batching_type)}")
    if batching_type is not BatchingType.Default:
        raise ValueError("batching_type KeyBased is not implemented: use BatchingType.Default")
    if chunking_enabled:
        raise ValueError(
            "chunking_enabled=True is not implemented: a message is at most the broker's "
            "max_message_size (MessageTooBig beyond)"
        )


def check_callback(callback: object) -> None:
    """TypeError unless send_async's callback (its second argument, as pulsar-client's) is
    None or callable."""
    if callback is not None and not callable(callback):
        raise TypeError(
            "send_async's second argument is the callback(result, message_id), as "
            f"pulsar-client's; not {excerpt(callback)} (properties= is a keyword)"
        )


def with_callback(fut: Future, callback: Callable[[object, object], None]) -> Future:
    """Call ``callback(Result.Ok, message_id)`` once `fut` succeeds, ``(exception, None)``
    if it fails."""

    def done(f) -> None:
        exc = f.exception()
        if exc is None:
            callback(Result.Ok, f.result())
        else:
            callback(exc, None)

    fut.add_done_callback(done)
    return fut
