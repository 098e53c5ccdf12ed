from collections.abc import Sequence
from typing import Any

import numpy as np

from .entryformat import DecodedEntries, EntryHeader

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
) -> list[bytes]: ...
def decode_header(buf: Any, verify: bool = True) -> EntryHeader: ...
def decode_entries(
    entry_ids: Any, buffers: Sequence[Any], verify: bool = True
) -> DecodedEntries: ...
def header_columns(
    buffers: Sequence[Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
