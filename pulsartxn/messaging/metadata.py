"""A message's metadata on send (pulsar-client's ``ordering_key``, ``event_timestamp``,
``deliver_at``, ``deliver_after``), checked once and stored with the message
(entryformat.py, FLAG_METADATA)."""

from __future__ import annotations

import datetime
import time
from concurrent.futures import Future

import numpy as np

from ..errors import excerpt
from .message import MessageId

_I64_MAX = (1 << 63) - 1


def _ms(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (milliseconds), not {excerpt(value)}")
    if not 0 <= value <= _I64_MAX:
        raise ValueError(f"{name} must be in 0..2^63-1 milliseconds, not {value}")
    return value


def message_metadata(
    ordering_key=None,
    event_timestamp=None,
    deliver_after_ms=None,
    deliver_at=None,
    deliver_after=None,
) -> tuple[int, int, bytes | None] | None:
    """(event_timestamp, deliver_at, ordering key bytes) as stored (0 = none), or None when
    no argument is given. deliver_at is absolute (ms since the epoch); deliver_after_ms (int
    ms) and deliver_after (a timedelta, pulsar-client's) count from now; one of the three."""
    if (
        ordering_key is None
        and event_timestamp is None
        and deliver_after_ms is None
        and deliver_at is None
        and deliver_after is None
    ):
        return None
    if ordering_key is not None:
        if isinstance(ordering_key, str):
            ordering_key = ordering_key.encode("utf-8", "surrogateescape")
        elif not isinstance(ordering_key, bytes):
            raise TypeError(f"ordering_key must be str or bytes, not {excerpt(ordering_key)}")
    given = [
        n
        for n, v in (
            ("deliver_at", deliver_at),
            ("deliver_after_ms", deliver_after_ms),
            ("deliver_after", deliver_after),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise ValueError(f"give one of deliver_at, deliver_after_ms, deliver_after, not {given}")
    due = 0
    if deliver_at is not None:
        due = _ms("deliver_at", deliver_at)
    elif deliver_after_ms is not None:
        due = int(time.time() * 1000) + _ms("deliver_after_ms", deliver_after_ms)
    elif deliver_after is not None:
        if not isinstance(deliver_after, datetime.timedelta):
            raise TypeError(f"deliver_after must be a timedelta, not {excerpt(deliver_after)}")
        after = int(deliver_after.total_seconds() * 1000)
        if after < 0:
            raise ValueError(f"deliver_after must not be negative, not {deliver_after}")
        due = int(time.time() * 1000) + after
    event_time = 0 if event_timestamp is None else _ms("event_timestamp", event_timestamp)
    return event_time, min(due, _I64_MAX), ordering_key


def send_with_metadata(
    producer, content, properties, partition_key, sequence_id, txn, meta
) -> Future:
    """One message with metadata: an entry of its own (as Pulsar's clients send a delayed
    message outside a batch), after what waits in containers; its future a MessageId."""
    content, properties = producer._validate(content, properties, partition_key, sequence_id)
    txn = producer.client._txn_for(txn)
    if txn is not None:
        producer._txn_flush(txn)
    part = producer._part_for(partition_key)
    out: Future = Future()
    if sequence_id is not None and sequence_id <= part.last_sequence:
        # A resend: answered as the container answers one (PartitionProducer._duplicate).
        waiting = part.waiting(sequence_id)
        if waiting is not None:
            return waiting
        dup = part.partition.duplicate_of(producer.name, sequence_id)
        if dup is not None and not (dup.entry_id() < 0 and part.was_dropped(sequence_id)):
            out.set_result(dup)
            return out
    fut = producer._send_rows(
        part,
        [content],
        None if partition_key is None else [partition_key.encode()],
        np.arange(1),
        1,
        np.array([len(content)]),
        txn,
        quiet=False,
        properties=None if properties is None else [properties],
        metadata=[meta],
        sequence_id=sequence_id,
    )
    p = part.partition

    def done(f) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(MessageId(p.ledger_id, f.result()[0], p.index, -1, 0))

    fut.add_done_callback(done)
    return out
