from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .outcome import Lock, Outcome

class Batch:
    values: list[bytes]
    keys: list[Any] | None
    props: list[Any] | None
    first_sequence: int
    nbytes: int
    started: float
    outcome: Outcome
    resent: bool
    def __init__(self, first_sequence: int) -> None: ...
    def contains(self, sequence_id: int) -> bool: ...
    def waiting(self, sequence_id: int) -> Future | None: ...

class TxnBatch(Batch):
    """Messages of one transaction waiting to become one entry on one partition."""

    part: Any
    txn: Any
    inflight: Future | None
    sealed: bool
    def __init__(self, part: Any, txn: Any, first_sequence: int) -> None: ...  # type: ignore[override]
    def add(self, content: bytes, properties: dict[str, str] | None, key: Any) -> Future: ...
    def landed(self, entry_id: int) -> None: ...
    def fail(self, exc: BaseException) -> None: ...

class PartitionProducer:
    producer: Any
    partition: Any
    lock: Lock
    last_sequence: int
    batch: Batch | None
    inflight: list[Batch]
    closed: bool
    dropped: deque[tuple[int, int]]
    def __init__(
        self, producer: Any, partition: Any, flusher: Any, is_local_txn: Callable[[Any], bool]
    ) -> None: ...
    def send_async(
        self,
        content: Any,
        callback: Callable[[Any, Any], None] | None = None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        sequence_id: int | None = None,
        txn: Any = None,
        **more: Any,
    ) -> Future: ...
    def add(
        self,
        content: bytes,
        properties: dict[str, str] | None,
        key: str | None,
        sequence_id: int | None,
        now: bool = False,
    ) -> Future: ...
    def waiting(self, sequence_id: int) -> Future | None: ...
    def was_dropped(self, sequence_id: int) -> bool: ...
    def txn_opened(self, txn: Any, batch: TxnBatch) -> None: ...
    def txn_sealed(self, batch: TxnBatch) -> None: ...
    def flush(self) -> list[Outcome]: ...
    def flush_if_older(self, seconds: float) -> bool: ...
