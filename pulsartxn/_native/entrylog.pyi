from collections.abc import Sequence
from typing import Any

from .entryformat import DecodedEntries

ARENA_ROUND_BYTES: int

class EntryLog:
    env: Any
    db: Any
    name: bytes
    def __init__(self, env: Any, name: bytes, db: Any = None) -> None: ...
    def last_entry_id(self, txn: Any) -> int: ...
    def first_entry_id(self, txn: Any) -> int: ...
    def count(self, txn: Any) -> int: ...
    def append(self, txn: Any, entries: Sequence[bytes], first: int | None = None) -> int: ...
    def append_messages(
        self,
        txn: Any,
        values: Any,
        keys: Sequence[Any] | None = None,
        properties: Sequence[dict[str, str] | None] | None = None,
        *,
        batch_size: int = 1000,
        max_entry_bytes: int = ...,
        txn_msb: int = 0,
        txn_lsb: int = 0,
        producer_id: int = 0,
        first_sequence_id: int = 0,
        publish_time: int = 0,
        metadata: Sequence[tuple[int, int, bytes | None] | None] | None = None,
        first_entry_id: int | None = None,
    ) -> tuple[int, list[int]]: ...
    def scan(
        self, txn: Any, start: int = 0, end: int | None = None, limit: int | None = None
    ) -> tuple[list[int], list[Any]]: ...
    def read(
        self,
        txn: Any,
        start: int = 0,
        end: int | None = None,
        limit: int | None = None,
        verify: bool = True,
    ) -> DecodedEntries: ...
    def trim_below(self, txn: Any, entry_id: int) -> int: ...
