"""Pure-Python twin of pulsartxn._native.entrycodec: the entry encoder, byte for byte."""

from __future__ import annotations

import struct

import numpy as np

from ..checks import check_bulk
from ..entryformat import (
    DEFAULT_MAX_ENTRY_BYTES,
    FLAG_METADATA,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    NO_KEY,
    VERSION,
    arrow_binary,
    check_header_ints,
    normalize_keys,
    normalize_metadata,
    normalize_properties,
)

__all__ = [
    "HEADER_SIZE",
    "crc32c",
    "value_sizes",
    "encode_entry",
    "encode_entries",
]

_U32 = struct.Struct("<I")


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data, value: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"crc32c value must be an int in 0..2^32-1, not {value!r}")
    table = _TABLE
    crc = value ^ 0xFFFFFFFF
    for byte in memoryview(data).cast("B"):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _values(values) -> list[bytes]:
    arrow = arrow_binary(values)
    if arrow is not None:
        offsets, data = arrow
        raw = data.tobytes()
        return [raw[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    if not isinstance(values, (list, tuple)):
        raise TypeError(
            f"values must be a list of bytes or a pyarrow array, not {type(values).__name__}"
        )
    out = []
    for i, v in enumerate(values):
        if isinstance(v, (bytearray, memoryview)):
            v = bytes(v)
        if not isinstance(v, bytes):
            raise TypeError(f"values[{i}] must be bytes, not {type(v).__name__}")
        if len(v) > 0xFFFFFFFE:
            raise ValueError(f"values[{i}] of {len(v)} bytes is too long")
        out.append(v)
    return out


def value_sizes(values) -> np.ndarray:
    arrow = arrow_binary(values)
    if arrow is not None:
        return np.diff(arrow[0]).astype(np.int64)
    return np.array([len(v) for v in _values(values)], dtype=np.int64)


def _message(value: bytes, key, props, meta=b"") -> bytes:
    key_part = _U32.pack(NO_KEY) if key is None else _U32.pack(len(key)) + key
    prop_part = b"\0\0\0\0" if props is None else props
    return key_part + prop_part + _U32.pack(len(value)) + value + meta


def _entry(
    messages: list[bytes],
    marker,
    txn_msb,
    txn_lsb,
    producer_id,
    sequence_id,
    publish_time,
    flags=0,
) -> bytes:
    body = b"".join(messages)
    head = HEADER.pack(
        MAGIC,
        VERSION,
        marker,
        flags,
        txn_msb,
        txn_lsb,
        producer_id,
        sequence_id,
        publish_time,
        len(messages),
        0,
    )
    crc = crc32c(body, crc32c(head[:52]))
    return head[:52] + _U32.pack(crc) + body


def _prepare(values, keys, properties, metadata=None):
    vals = _values(values)
    n = len(vals)
    key_list = normalize_keys(keys, n)
    prop_list = normalize_properties(properties, n)
    meta_list = normalize_metadata(metadata, n)
    return [
        _message(
            vals[i],
            None if key_list is None else key_list[i],
            None if prop_list is None else prop_list[i],
            b"" if meta_list is None else meta_list[i],
        )
        for i in range(n)
    ], (0 if meta_list is None else FLAG_METADATA)


def encode_entry(
    values,
    keys=None,
    properties=None,
    *,
    txn_msb=0,
    txn_lsb=0,
    producer_id=0,
    sequence_id=0,
    publish_time=0,
    marker_type=0,
    metadata=None,
) -> bytes:
    check_header_ints(txn_msb, txn_lsb, producer_id, sequence_id, publish_time, marker_type)
    messages, flags = _prepare(values, keys, properties, metadata)
    return _entry(
        messages, marker_type, txn_msb, txn_lsb, producer_id, sequence_id, publish_time, flags
    )


def encode_entries(
    values,
    keys=None,
    properties=None,
    *,
    batch_size=1000,
    max_entry_bytes=DEFAULT_MAX_ENTRY_BYTES,
    txn_msb=0,
    txn_lsb=0,
    producer_id=0,
    first_sequence_id=0,
    publish_time=0,
    metadata=None,
) -> list[bytes]:
    check_header_ints(txn_msb, txn_lsb, producer_id, first_sequence_id, publish_time, 0)
    check_bulk(batch_size, max_entry_bytes, first_sequence_id, 1)
    messages, flags = _prepare(values, keys, properties, metadata)
    check_bulk(batch_size, max_entry_bytes, first_sequence_id, len(messages))
    out = []
    i0 = 0
    seq = first_sequence_id
    while i0 < len(messages):
        size = HEADER_SIZE
        i = i0
        while i < len(messages) and i - i0 < batch_size:
            if i > i0 and size + len(messages[i]) > max_entry_bytes:
                break
            size += len(messages[i])
            i += 1
        out.append(
            _entry(messages[i0:i], 0, txn_msb, txn_lsb, producer_id, seq, publish_time, flags)
        )
        seq += i - i0
        i0 = i
    return out
