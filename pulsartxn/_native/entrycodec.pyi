from collections.abc import Sequence
from typing import Any

import numpy as np

HEADER_SIZE: int
CRC32C_HARDWARE: bool

def crc32c(data: Any, value: int = 0) -> int: ...
def value_sizes(values: Any) -> np.ndarray: ...
def encode_entry(
    values: Any,
    keys: Sequence[Any] | None = None,
    properties: Sequence[dict[str, str] | None] | None = None,
    *,
    txn_msb: int = 0,
    txn_lsb: int = 0,
    producer_id: int = 0,
    sequence_id: int = 0,
    publish_time: int = 0,
    marker_type: int = 0,
    metadata: Sequence[tuple[int, int, bytes | None] | None] | None = None,
) -> bytes: ...
def encode_entries(
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
) -> list[bytes]: ...
