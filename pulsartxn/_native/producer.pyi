from concurrent.futures import Future
from typing import Any

class MessageFuture(Future): ...

class Batch:
    values: list[bytes]
    keys: list[Any] | None
    props: list[Any] | None
    futures: list[MessageFuture]
    first_sequence: int
    nbytes: int
    started: float
    entry_id: int
    def __init__(self, first_sequence: int) -> None: ...
    def message_id(self, index: int) -> Any: ...
    def contains(self, sequence_id: int) -> bool: ...

class PartitionProducer:
    producer: Any
    partition: Any
    last_sequence: int
    batch: Batch | None
    inflight: list[Batch]
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
    def flush(self) -> None: ...
    def flush_if_older(self, seconds: float) -> bool: ...
