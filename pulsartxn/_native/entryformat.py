"""The entry format shared by the native codec and its twin, and the decoded columnar view.

An entry is one LMDB value of a partition's ledger and holds a batch of messages. Layout
(little-endian), a fixed 56-byte header and then the messages::

    0  4s  magic b"PTXE"            24 u64 producer_id          48 u32 message_count
    4  u8  version (1)              32 u64 sequence_id (first)  52 u32 crc32c of [0:52] + [56:]
    5  u8  marker_type (0 = data)   40 i64 publish_time (ms)
    6  u16 flags (0, or FLAG_METADATA)
    8  u64 txn_msb, 16 u64 txn_lsb (0, 0 = not transactional)

    per message: u32 key_len (0xFFFFFFFF = no key), key;
                 u32 n_properties, n x (u32 len, utf-8 key, u32 len, utf-8 value);
                 u32 payload_len, payload;
                 with FLAG_METADATA, then: i64 event_time (ms, 0 = none), i64 deliver_at
                 (ms, 0 = none), u32 ordering_key_len (0xFFFFFFFF = none), ordering_key

An entry without metadata has flags 0 and is byte for byte what it was before the flag.
"""

from __future__ import annotations

import struct
from collections import namedtuple

import numpy as np
import pyarrow as pa

from ..errors import excerpt

HEADER_SIZE = 56
FLAG_METADATA = 1  # each message carries the metadata block after its payload
MAGIC = b"PTXE"
VERSION = 1
NO_KEY = 0xFFFFFFFF
MAX_FIELD = 0xFFFFFFFE
U64_MAX = (1 << 64) - 1
DEFAULT_MAX_ENTRY_BYTES = 4 * 1024 * 1024

HEADER = struct.Struct("<4sBBHQQQQqII")

EntryHeader = namedtuple(
    "EntryHeader",
    "marker_type txn_msb txn_lsb producer_id sequence_id publish_time message_count",
)

# Reasons a decoder gives, by code (the native decoder reports codes, this names them).
REASONS = {
    1: "shorter than the 56-byte header",
    2: "bad magic (not an entry)",
    3: "unsupported version",
    4: "unknown flags",
    5: "checksum mismatch",
    6: "truncated message data",
    7: "bytes after the last message",
    8: "message count larger than the entry can hold",
}


def encode_properties(props, index: int) -> bytes:
    """The encoded properties block of one message (None or {} -> a zero count)."""
    if not props:
        if props is not None and not isinstance(props, dict):
            raise TypeError(
                f"properties[{index}] must be a dict or None, not {type(props).__name__}"
            )
        return b"\0\0\0\0"
    if not isinstance(props, dict):
        raise TypeError(f"properties[{index}] must be a dict or None, not {type(props).__name__}")
    parts = [struct.pack("<I", len(props))]
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(
                f"properties[{index}] must map str to str, got {excerpt(k)}: {excerpt(v)}"
            )
        kb, vb = k.encode(), v.encode()
        parts += [struct.pack("<I", len(kb)), kb, struct.pack("<I", len(vb)), vb]
    return b"".join(parts)


_META = struct.Struct("<qqI")
NO_METADATA = _META.pack(0, 0, NO_KEY)


def encode_metadata(meta, index: int) -> bytes:
    """The metadata block of one message: meta is None or (event_time, deliver_at,
    ordering_key bytes or None), the times ints in the int64 range (0 = none)."""
    if meta is None:
        return NO_METADATA
    if not isinstance(meta, tuple) or len(meta) != 3:
        raise TypeError(f"metadata[{index}] must be None or a 3-tuple, not {excerpt(meta)}")
    event_time, deliver_at, key = meta
    for what, value in (("event_time", event_time), ("deliver_at", deliver_at)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"metadata[{index}] {what} must be an int, not {excerpt(value)}")
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"metadata[{index}] {what} {value} out of the int64 range")
    if key is None:
        return _META.pack(event_time, deliver_at, NO_KEY)
    if not isinstance(key, bytes):
        raise TypeError(f"metadata[{index}] ordering key must be bytes, not {excerpt(key)}")
    if len(key) > MAX_FIELD:
        raise ValueError(f"metadata[{index}] ordering key of {len(key)} bytes is too long")
    return _META.pack(event_time, deliver_at, len(key)) + key


def normalize_metadata(metadata, n: int) -> list | None:
    """Each message's encoded metadata block, or None when no message has metadata."""
    if metadata is None:
        return None
    if not isinstance(metadata, (list, tuple)):
        raise TypeError(f"metadata must be a list, not {type(metadata).__name__}")
    if len(metadata) != n:
        raise ValueError(f"metadata has {len(metadata)} items for {n} values")
    return [encode_metadata(m, i) for i, m in enumerate(metadata)]


def check_header_ints(
    txn_msb, txn_lsb, producer_id, sequence_id, publish_time, marker_type
) -> None:
    for name, value in (
        ("txn_msb", txn_msb),
        ("txn_lsb", txn_lsb),
        ("producer_id", producer_id),
        ("sequence_id", sequence_id),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if not 0 <= value <= U64_MAX:
            raise ValueError(f"{name} {value} out of range 0..2^64-1")
    if isinstance(publish_time, bool) or not isinstance(publish_time, (int, np.integer)):
        raise TypeError(f"publish_time must be an int, not {type(publish_time).__name__}")
    if not -(1 << 63) <= publish_time < (1 << 63):
        raise ValueError(f"publish_time {publish_time} out of the int64 range")
    if isinstance(marker_type, bool) or not isinstance(marker_type, (int, np.integer)):
        raise TypeError(f"marker_type must be an int, not {type(marker_type).__name__}")
    if not 0 <= marker_type <= 255:
        raise ValueError(f"marker_type {marker_type} out of range 0..255")


def normalize_keys(keys, n: int) -> list | None:
    """Keys as a list of bytes-or-None of length n (str keys are UTF-8 encoded)."""
    if keys is None:
        return None
    if hasattr(keys, "to_pylist"):
        keys = keys.to_pylist()
    if not isinstance(keys, (list, tuple)):
        raise TypeError(f"keys must be a list or a pyarrow array, not {type(keys).__name__}")
    if len(keys) != n:
        raise ValueError(f"keys has {len(keys)} items for {n} values")
    out = []
    for i, k in enumerate(keys):
        if k is None:
            out.append(None)
        elif isinstance(k, str):
            out.append(k.encode())
        elif isinstance(k, (bytes, bytearray, memoryview)):
            out.append(bytes(k))
        else:
            raise TypeError(f"keys[{i}] must be bytes, str or None, not {type(k).__name__}")
        if out[-1] is not None and len(out[-1]) > MAX_FIELD:
            raise ValueError(f"keys[{i}] of {len(out[-1])} bytes is too long")
    return out


def normalize_properties(properties, n: int) -> list | None:
    if properties is None:
        return None
    if not isinstance(properties, (list, tuple)):
        raise TypeError(f"properties must be a list, not {type(properties).__name__}")
    if len(properties) != n:
        raise ValueError(f"properties has {len(properties)} items for {n} values")
    return [encode_properties(p, i) for i, p in enumerate(properties)]


def arrow_binary(values):
    """(offsets, uint8 data) of a pyarrow binary/string array, or None if not one.

    The offsets are the array's own (int32, or int64 for the large types), not copied."""
    module = type(values).__module__ or ""
    if not module.startswith("pyarrow"):
        return None
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        raise TypeError(f"values must be a pyarrow Array, not {type(values).__name__}")
    t = values.type
    if pa.types.is_binary(t) or pa.types.is_string(t):
        dtype = np.int32
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        dtype = np.int64
    else:
        raise TypeError(f"values must be a binary or string array, not {t}")
    if values.null_count:
        raise ValueError("values must not contain nulls")
    n = len(values)
    bufs = values.buffers()
    itemsize = np.dtype(dtype).itemsize
    if bufs[1] is None:
        offsets = np.zeros(n + 1, dtype=dtype)
    else:
        offsets = np.frombuffer(bufs[1], dtype=dtype, count=n + 1, offset=values.offset * itemsize)
    data = (
        np.frombuffer(bufs[2], dtype=np.uint8)
        if bufs[2] is not None and bufs[2].size
        else np.zeros(1, dtype=np.uint8)
    )
    return offsets, data


class DecodedEntries:
    """Entries decoded into columns: entry-level arrays and message-level arrays.

    Entry level: entry_id, txn_msb, txn_lsb, producer_id, sequence_id (u64), publish_time (i64),
    marker_type (u8), message_count (u32), first_message (i64, index into message arrays).
    Message level: msg_entry (i64 index into entry arrays), batch_index (i32), key_offsets/
    key_data/key_valid, value_offsets/value_data, prop_offsets (into pairs), prop_key_offsets/
    prop_key_data, prop_value_offsets/prop_value_data. Offsets are int64, n + 1 long.
    Metadata (None when no entry decoded carries any): event_time, deliver_at (i64, 0 = none),
    okey_offsets/okey_data/okey_valid (the ordering keys, as the keys).
    """

    ENTRY_FIELDS = (
        "entry_id",
        "txn_msb",
        "txn_lsb",
        "producer_id",
        "sequence_id",
        "publish_time",
        "marker_type",
        "message_count",
        "first_message",
    )
    MESSAGE_FIELDS = (
        "msg_entry",
        "batch_index",
        "key_offsets",
        "key_data",
        "key_valid",
        "value_offsets",
        "value_data",
        "prop_offsets",
        "prop_key_offsets",
        "prop_key_data",
        "prop_value_offsets",
        "prop_value_data",
    )
    META_FIELDS = ("event_time", "deliver_at", "okey_offsets", "okey_data", "okey_valid")

    def __init__(self, **arrays) -> None:
        for name in self.ENTRY_FIELDS + self.MESSAGE_FIELDS:
            setattr(self, name, arrays[name])
        for name in self.META_FIELDS:
            setattr(self, name, arrays.get(name))
        self.num_entries = len(self.entry_id)
        self.num_messages = len(self.msg_entry)

    def message_txn(self) -> tuple[np.ndarray, np.ndarray]:
        """(msb, lsb) of each message's transaction, for the abort-set filter."""
        return self.txn_msb[self.msg_entry], self.txn_lsb[self.msg_entry]

    def values(self) -> list[bytes]:
        o, d = self.value_offsets, self.value_data
        return [d[o[i] : o[i + 1]].tobytes() for i in range(self.num_messages)]

    def keys(self) -> list[bytes | None]:
        o, d, v = self.key_offsets, self.key_data, self.key_valid
        return [d[o[i] : o[i + 1]].tobytes() if v[i] else None for i in range(self.num_messages)]

    def properties(self) -> list[dict[str, str]]:
        po = self.prop_offsets
        ko, kd, vo, vd = (
            self.prop_key_offsets,
            self.prop_key_data,
            self.prop_value_offsets,
            self.prop_value_data,
        )
        return [
            {
                kd[ko[j] : ko[j + 1]].tobytes().decode(): vd[vo[j] : vo[j + 1]].tobytes().decode()
                for j in range(po[i], po[i + 1])
            }
            for i in range(self.num_messages)
        ]

    def metadata(self, m: int) -> tuple[int, int, bytes | None] | None:
        """(event_time, deliver_at, ordering key) of message m, None when it has none."""
        if self.event_time is None:
            return None
        ev, at, valid = int(self.event_time[m]), int(self.deliver_at[m]), self.okey_valid[m]
        if not (ev or at or valid):
            return None
        o = self.okey_offsets
        return ev, at, self.okey_data[o[m] : o[m + 1]].tobytes() if valid else None

    def equals(self, other: DecodedEntries) -> bool:
        if (self.event_time is None) != (other.event_time is None):
            return False
        fields = self.ENTRY_FIELDS + self.MESSAGE_FIELDS
        if self.event_time is not None:
            fields += self.META_FIELDS
        return all(
            np.array_equal(getattr(self, f), getattr(other, f))
            and getattr(self, f).dtype == getattr(other, f).dtype
            for f in fields
        )

    def to_arrow(self, topic: str = "", partition: int = -1, ledger_id: int = 0, mask=None):
        """A pyarrow RecordBatch with API.md's read schema, one row per message.

        batch_index is -1 for a message alone in its entry (as in its MessageId). `mask`
        (bool per message) selects rows.
        """
        n = self.num_messages
        counts = self.message_count[self.msg_entry] if n else np.zeros(0, dtype=np.uint32)
        batch_index = np.where(counts > 1, self.batch_index, -1).astype(np.int32)
        columns = {
            "topic": pa.array([topic], pa.string()).take(pa.array(np.zeros(n, dtype=np.int32))),
            "partition": pa.array(np.full(n, partition, dtype=np.int32)),
            "ledger_id": pa.array(np.full(n, ledger_id, dtype=np.int64)),
            "entry_id": pa.array(self.entry_id[self.msg_entry].astype(np.int64)),
            "batch_index": pa.array(batch_index),
            "key": _binary(self.key_offsets, self.key_data, self.key_valid),
            "value": _binary(self.value_offsets, self.value_data, None),
            "properties": pa.MapArray.from_arrays(
                pa.array(self.prop_offsets.astype(np.int32)),
                _binary(self.prop_key_offsets, self.prop_key_data, None, pa.string()),
                _binary(self.prop_value_offsets, self.prop_value_data, None, pa.string()),
            ),
            "publish_time": pa.array(self.publish_time[self.msg_entry], pa.timestamp("ms")),
        }
        batch = pa.RecordBatch.from_pydict(columns, schema=READ_SCHEMA())
        if mask is not None:
            batch = batch.filter(pa.array(np.asarray(mask, dtype=bool)))
        return batch


def _binary(offsets, data, valid, type_=None):
    n = len(offsets) - 1
    large = offsets[-1] >= (1 << 31)
    if type_ is None:
        type_ = pa.large_binary() if large else pa.binary()
    elif large:
        type_ = pa.large_string()
    offs = offsets if large else offsets.astype(np.int32)
    validity = None
    null_count = 0
    if valid is not None and n and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = int(n - valid.sum())
    arr = pa.Array.from_buffers(
        type_, n, [validity, pa.py_buffer(offs), pa.py_buffer(data)], null_count=null_count
    )
    if large and type_ == pa.large_binary():
        arr = arr.cast(pa.large_binary())
    return arr


def READ_SCHEMA():
    """API.md's schema of a read (scan, Spark reads)."""
    return pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("ledger_id", pa.int64()),
            ("entry_id", pa.int64()),
            ("batch_index", pa.int32()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("properties", pa.map_(pa.string(), pa.string())),
            ("publish_time", pa.timestamp("ms")),
        ]
    )
