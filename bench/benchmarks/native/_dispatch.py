"""Inputs of the dispatch loops' benchmarks (ratios, asv, pytest-benchmark): one decoded entry
of 1000 messages of 100 B as columns, and a read-ahead of such items."""

from __future__ import annotations

import collections
import os

import numpy as np

from pulsartxn.messaging.message import Message, MessageId

MESSAGES = 1000


def columns(n: int = MESSAGES):
    """(value_data, value_offsets, key_valid as uint8, key_offsets, key_data), no keys."""
    values = os.urandom(100 * n)
    return (
        np.frombuffer(values, np.uint8).copy(),
        np.arange(0, 100 * (n + 1), 100, dtype=np.int64),
        np.zeros(n, np.uint8),
        np.zeros(n + 1, np.int64),
        np.zeros(0, np.uint8),
    )


def buffer_entry(impl, cols, n: int = MESSAGES) -> collections.deque:
    """One entry's messages into a fresh read-ahead with `impl`'s buffer_messages."""
    buffer: collections.deque = collections.deque()
    impl.buffer_messages(buffer.append, 7, n, 0, 1234, None, None, *cols, None)
    return buffer


def take_all(impl, items) -> list:
    """Every item of a read-ahead as Messages with `impl`'s take_buffered (nothing skipped)."""
    out: list = []
    impl.take_buffered(
        collections.deque(items),
        len(items),
        1 << 40,
        out,
        None,
        {},
        {},
        -1,
        set(),
        {},
        None,
        lambda txn: False,
        1,
        0,
        "persistent://public/default/t",
        impl.Pending,
        Message,
        MessageId,
    )
    return out
