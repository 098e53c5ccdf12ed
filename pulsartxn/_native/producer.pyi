from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

class Lock:
    """A plain (non-reentrant) lock taken from C on the send path; ``with lock:`` works."""
    def acquire(self) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> bool: ...
    def __exit__(self, *exc: object) -> bool: ...

class Outcome:
    """What happened to one batch, shared by the futures of its messages."""

    condition: Any
    done: bool
    error: BaseException | None
    def wait(self, timeout: float | None = None) -> None: ...

class MessageFuture:
    """One message's future. Not a Future subclass, but ``isinstance(f, Future)`` is True
    (its ``__class__`` is ``concurrent.futures.Future``) and it works with
    concurrent.futures.wait, as_completed and asyncio.wrap_future."""
    def __init__(self, outcome: Outcome, index: int) -> None: ...
    def result(self, timeout: float | None = None) -> Any: ...
    def exception(self, timeout: float | None = None) -> BaseException | None: ...
    def done(self) -> bool: ...
    def running(self) -> bool: ...
    def cancel(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def add_done_callback(self, fn: Callable[[Future], object]) -> None: ...

class Batch:
    values: list[bytes]
    keys: list[Any] | None
    props: list[Any] | None
    first_sequence: int
    nbytes: int
    started: float
    outcome: Outcome
    def __init__(self, first_sequence: int) -> None: ...
    def contains(self, sequence_id: int) -> bool: ...

class PartitionProducer:
    producer: Any
    partition: Any
    lock: Lock
    last_sequence: int
    batch: Batch | None
    inflight: list[Batch]
    closed: bool
    def __init__(self, producer: Any, partition: Any) -> None: ...
    def send_async(
        self,
        content: Any,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        sequence_id: int | None = None,
        txn: Any = None,
        callback: Any = None,
    ) -> Future: ...
    def add(
        self,
        content: bytes,
        properties: dict[str, str] | None,
        key: str | None,
        sequence_id: int | None,
    ) -> Future: ...
    def flush(self) -> list[Outcome]: ...
    def flush_if_older(self, seconds: float) -> bool: ...
