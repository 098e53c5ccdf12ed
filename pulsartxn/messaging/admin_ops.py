"""What the admin does to a subscription without a consumer (docs/API.md, "Admin and stats"):
peek at its next messages, skip them, clear its backlog; and message ids as text, the form
they take in admin results and that reset_cursor takes back."""

from __future__ import annotations

import base64

from ..errors import InvalidMessageId, excerpt
from . import positions
from .message import MessageId
from .readahead import buffer_entries
from .subscription import Subscription

_CHUNK = 64  # entries read at a time


def format_id(mid: MessageId) -> str:
    """``ledger:entry:partition:batch_index``, as pulsar-admin prints a message id."""
    return f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}:{mid.batch_index()}"


def parse_id(value: object) -> MessageId:
    """A MessageId from itself, ``earliest``, ``latest`` or ``ledger:entry[:partition[:batch
    index]]``; InvalidMessageId for any other text, TypeError for anything else."""
    if isinstance(value, MessageId):
        return value
    if not isinstance(value, str):
        raise TypeError(f"expected a MessageId or its text, not {excerpt(value)}")
    text = value.strip().lower()
    if text in ("earliest", "latest"):
        return MessageId.earliest if text == "earliest" else MessageId.latest
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if not 2 <= len(parts) <= 4 or len(numbers) != len(parts):
        raise InvalidMessageId(
            f"a message id is ledger:entry[:partition[:batch_index]], not {excerpt(value)}"
        )
    ledger, entry, partition, batch_index = [*numbers, -1, -1][:4]
    return MessageId(ledger, entry, partition, batch_index)


def check_count(n: object, least: int = 1) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"a count must be an int, not {excerpt(n)}")
    if n < least:
        raise ValueError(f"a count must be at least {least}, not {n}")


def _next(sub: Subscription, n: int) -> list:
    """The next n messages a consumer of `sub` would be given, as read-ahead items
    ((entry, batch_index), payload), committed ones only: not acknowledged, not held by a
    transaction's acknowledgement, not a marker nor an aborted transaction's (lock held)."""
    part = sub.partition
    out: list = []
    start, end = sub.cursor.mark_delete + 1, part.dispatch_end(True)
    while start < end and len(out) < n:
        decoded = part.read(start, end, _CHUNK)
        if decoded.num_entries == 0:
            break
        items: list = []
        buffer_entries(decoded, sub.cursor, part.buffer.aborted_mask, items.append, _ignore)
        for key, payload in items:
            if not sub.pending_ack.holds(*key):
                out.append((key, payload))
        start = int(decoded.entry_id[-1]) + 1
    return out[:n]


def _ignore(entry_id: int, count: int) -> None:
    """A marker or an aborted entry: a peek moves nothing (a consumer acknowledges it)."""


def peek(sub: Subscription, n: int) -> list[dict]:
    """The next n messages at the subscription's position, which does not move."""
    part = sub.partition
    with sub.lock:
        items = _next(sub, n)
    out = []
    for (entry_id, batch_index), payload in items:
        data, properties, key, publish_time, batch_size = payload[:5]
        mid = MessageId(part.ledger_id, entry_id, part.index, batch_index, batch_size)
        out.append(
            {
                "message_id": format_id(mid),
                "topic": part.topic,
                "publish_time": publish_time,
                "key": key,
                "properties": dict(properties or {}),
                "payload": base64.b64encode(bytes(data)).decode(),
            }
        )
    return out


def skip(sub: Subscription, n: int, memo=None) -> int:
    """Acknowledge the next n messages (fewer at the end); how many were skipped. Durable
    when it returns. ``memo(count)``: a write (a once-call's row) made with the first cursor
    record that holds the skip, or before it, never after."""
    with sub.lock:
        items = _next(sub, n)
        for (entry_id, batch_index), payload in items:
            sub.cursor.ack(entry_id, batch_index, payload[4] if batch_index >= 0 else 0)
            sub._pending.pop((entry_id, batch_index), None)
        if memo is not None:
            sub.ride(memo(len(items)))
        if items or memo is not None:
            sub._persist()
    sub.wait_persisted()
    return len(items)


def clear_backlog(sub: Subscription) -> None:
    """Acknowledge every message readable now (up to the max read position: those of open
    transactions stay), as a seek to the end; refused while transactions hold acks here."""
    part = sub.partition
    positions.reset([sub], [(part.dispatch_end(True) - 1, None)])
