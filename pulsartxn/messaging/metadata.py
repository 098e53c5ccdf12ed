"""A message's metadata on send (pulsar-client's ``ordering_key``, ``event_timestamp``,
``deliver_at``, ``deliver_after``), checked once and stored with the message
(entryformat.py, FLAG_METADATA)."""

from __future__ import annotations

import datetime
import time

from ..errors import excerpt

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
