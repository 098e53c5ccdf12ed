"""Pure-Python twin of pulsartxn._native.entrydecode: the entry decoder, same checks and columns."""

from __future__ import annotations

import struct

import numpy as np

from ...errors import CorruptEntry
from ..checks import as_entry_ids
from ..entryformat import (
    FLAG_METADATA,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    NO_KEY,
    REASONS,
    VERSION,
    DecodedEntries,
    EntryHeader,
)
from .entrycodec import crc32c

__all__ = ["EntryHeader", "DecodedEntries", "decode_header", "header_columns", "decode_entries"]

_U32 = struct.Struct("<I")
_TIMES = struct.Struct("<qq")


def _parse(raw: bytes, verify: bool):
    """(header fields, [(key, [(k, v)], value)]) or a REASONS code."""
    size = len(raw)
    if size < HEADER_SIZE:
        return 1
    magic, version, marker, flags, msb, lsb, producer, seq, publish, count, crc = (
        HEADER.unpack_from(raw)
    )
    if magic != MAGIC:
        return 2
    if version != VERSION:
        return 3
    if flags & ~FLAG_METADATA:
        return 4
    if verify and crc32c(raw[HEADER_SIZE:], crc32c(raw[:52])) != crc:
        return 5
    if count * 12 > size - HEADER_SIZE:
        return 8
    pos = HEADER_SIZE

    def take(n):
        nonlocal pos
        if n > size - pos:
            raise IndexError
        out = raw[pos : pos + n]
        pos += n
        return out

    messages = []
    try:
        for _ in range(count):
            (klen,) = _U32.unpack(take(4))
            key = None if klen == NO_KEY else take(klen)
            (pairs,) = _U32.unpack(take(4))
            props = []
            for _ in range(pairs):
                (n,) = _U32.unpack(take(4))
                k = take(n)
                (n,) = _U32.unpack(take(4))
                props.append((k, take(n)))
            (vlen,) = _U32.unpack(take(4))
            value = take(vlen)
            meta = None
            if flags:
                event_time, deliver_at = _TIMES.unpack(take(16))
                (olen,) = _U32.unpack(take(4))
                meta = (event_time, deliver_at, None if olen == NO_KEY else take(olen))
            messages.append((key, props, value, meta))
    except IndexError:
        return 6
    if pos != size:
        return 7
    return (marker, msb, lsb, producer, seq, publish, count, flags), messages


def decode_header(buf, verify=True) -> EntryHeader:
    raw = bytes(memoryview(buf).cast("B"))
    if verify:
        parsed = _parse(raw, True)
        if isinstance(parsed, int):
            raise CorruptEntry(f"entry: {REASONS[parsed]}")
        return EntryHeader(*parsed[0][:7])
    if len(raw) < HEADER_SIZE:
        raise CorruptEntry(f"entry: {REASONS[1]}")
    magic, _, marker, _, msb, lsb, producer, seq, publish, count, _ = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise CorruptEntry(f"entry: {REASONS[2]}")
    return EntryHeader(marker, msb, lsb, producer, seq, publish, count)


def header_columns(buffers):
    """Twin of the native header_columns: header fields of each entry, messages untouched."""
    buffers = list(buffers)
    n = len(buffers)
    counts = np.empty(n, np.int64)
    markers = np.empty(n, np.uint8)
    msb = np.empty(n, np.uint64)
    lsb = np.empty(n, np.uint64)
    for i, buf in enumerate(buffers):
        raw = bytes(memoryview(buf).cast("B")[:HEADER_SIZE])
        if len(raw) < HEADER_SIZE:
            raise CorruptEntry(f"entry {i} of the scan: {REASONS[1]}")
        magic, _, marker, _, hi, lo, _, _, _, count, _ = HEADER.unpack_from(raw)
        if magic != MAGIC:
            raise CorruptEntry(f"entry {i} of the scan: {REASONS[2]}")
        counts[i], markers[i], msb[i], lsb[i] = count, marker, hi, lo
    return counts, markers, msb, lsb


def decode_entries(entry_ids, buffers, verify=True) -> DecodedEntries:
    ids = as_entry_ids(entry_ids)
    buffers = list(buffers)
    if len(ids) != len(buffers):
        raise ValueError(f"{len(ids)} entry ids for {len(buffers)} buffers")
    heads, entries = [], []
    for e, buf in enumerate(buffers):
        parsed = _parse(bytes(memoryview(buf).cast("B")), bool(verify))
        if isinstance(parsed, int):
            raise CorruptEntry(f"entry {int(ids[e])}: {REASONS[parsed]}")
        heads.append(parsed[0])
        entries.append(parsed[1])
    cols = {k: [] for k in ("msg_entry", "batch_index", "key_valid")}
    key_parts, value_parts, pk_parts, pv_parts = [], [], [], []
    key_off, val_off, prop_off, pk_off, pv_off = [0], [0], [0], [0], [0]
    first = []
    with_meta = any(h[7] for h in heads)
    events, dues, okey_parts, okey_valid, okey_off = [], [], [], [], [0]
    for e, messages in enumerate(entries):
        first.append(len(cols["msg_entry"]))
        for j, (key, props, value, meta) in enumerate(messages):
            if with_meta:
                ev, at, okey = meta if meta is not None else (0, 0, None)
                events.append(ev)
                dues.append(at)
                okey_valid.append(okey is not None)
                okey_parts.append(okey or b"")
                okey_off.append(okey_off[-1] + len(okey or b""))
            cols["msg_entry"].append(e)
            cols["batch_index"].append(j)
            cols["key_valid"].append(key is not None)
            key_parts.append(key or b"")
            key_off.append(key_off[-1] + len(key or b""))
            for k, v in props:
                pk_parts.append(k)
                pk_off.append(pk_off[-1] + len(k))
                pv_parts.append(v)
                pv_off.append(pv_off[-1] + len(v))
            prop_off.append(prop_off[-1] + len(props))
            value_parts.append(value)
            val_off.append(val_off[-1] + len(value))

    def column(index, dtype):
        return np.array([h[index] for h in heads], dtype=dtype)

    def data(parts):
        return np.frombuffer(b"".join(parts), dtype=np.uint8).copy()

    meta = {}
    if with_meta:
        meta = dict(
            event_time=np.array(events, dtype=np.int64),
            deliver_at=np.array(dues, dtype=np.int64),
            okey_offsets=np.array(okey_off, dtype=np.int64),
            okey_data=data(okey_parts),
            okey_valid=np.array(okey_valid, dtype=np.bool_),
        )
    return DecodedEntries(
        **meta,
        entry_id=ids,
        marker_type=column(0, np.uint8),
        txn_msb=column(1, np.uint64),
        txn_lsb=column(2, np.uint64),
        producer_id=column(3, np.uint64),
        sequence_id=column(4, np.uint64),
        publish_time=column(5, np.int64),
        message_count=column(6, np.uint32),
        first_message=np.array(first, dtype=np.int64),
        msg_entry=np.array(cols["msg_entry"], dtype=np.int64),
        batch_index=np.array(cols["batch_index"], dtype=np.int32),
        key_valid=np.array(cols["key_valid"], dtype=np.bool_),
        key_offsets=np.array(key_off, dtype=np.int64),
        key_data=data(key_parts),
        value_offsets=np.array(val_off, dtype=np.int64),
        value_data=data(value_parts),
        prop_offsets=np.array(prop_off, dtype=np.int64),
        prop_key_offsets=np.array(pk_off, dtype=np.int64),
        prop_key_data=data(pk_parts),
        prop_value_offsets=np.array(pv_off, dtype=np.int64),
        prop_value_data=data(pv_parts),
    )
