from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

class Pending:
    """A delivered message not yet acknowledged: its consumer and redelivery count."""

    consumer: Any
    count: int
    def __init__(self, consumer: Any, count: int) -> None: ...

def take_buffered(
    buffer: deque,
    n: int,
    max_bytes: int,
    out: list,
    consumer: Any,
    pending: dict,
    counts: dict,
    mark: int,
    acked: set[int],
    partly: dict[int, Any],
    holds: Callable[[int, int], bool] | None,
    is_aborted: Callable[[Any], bool],
    ledger_id: int,
    index: int,
    topic: str,
    pending_type: Callable[..., Any],
    message_type: Callable[..., Any],
    message_id_type: Callable[..., Any] | None,
) -> tuple[int, int, int]:
    """Read-ahead items into Messages for one consumer, at most `n` in `out` and `max_bytes` of
    data: (delivered, bytes, aborted entry, -2 when the bytes stopped it, or -1)."""

def buffer_messages(
    append: Callable[[tuple], Any],
    entry_id: int,
    n: int,
    first: int,
    when: int,
    txn: Any,
    some_acked: Any,
    value_data: np.ndarray,
    value_offsets: np.ndarray,
    key_valid: np.ndarray,
    key_offsets: np.ndarray,
    key_data: np.ndarray,
    props_of: Callable[[int], dict[str, str] | None] | None,
) -> int:
    """One decoded entry's messages into a subscription's read-ahead; how many were added."""
