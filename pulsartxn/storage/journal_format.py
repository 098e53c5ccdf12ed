"""The journal's file: its layout, headers and records (see journal.py for their use)."""

from __future__ import annotations

import os
import struct

from .._native import crc32c
from ..errors import CorruptEntry

# File: two header slots written alternately (the valid one with the highest sequence wins,
# so a torn header write loses nothing), then a circular region of records addressed by a
# byte sequence number (lsn): the record at lsn lives at HEAD + lsn % region and carries its
# lsn and a CRC-32C, so a record of an earlier lap, or one a crash tore, ends the replay.
FILE = "journal"
HEAD = 8192  # two header slots of 4 KiB
SLOT = 4096
MAGIC = b"PTXJRNL1"
HEADER = struct.Struct("<8sQQQQII")  # magic, seq, region, txnid, replay lsn, psize, meta len
RECORD = struct.Struct("<IIQQI")  # magic, payload length, lsn, LMDB txnid, crc32c
RECORD_MAGIC = 0x4A525031  # "1PRJ"
PAD_MAGIC = 0x4A525050  # "PPRJ": the rest of the lap is empty
# LMDB's meta page: the page header (16 bytes) and MDB_meta (magic at 16, last_pg at 136,
# txnid at 144). A checkpoint keeps its first META_BYTES.
META_BYTES = 256
META_MAGIC = 0xBEEFC0DE
META_MAGIC_AT, META_TXNID_AT = 16, 144
ZERO_CHUNK = 1 << 20
BLOCK = 4096  # records start on block boundaries and take whole blocks (direct I/O)


def blocks(n: int) -> int:
    return (n + BLOCK - 1) & ~(BLOCK - 1)


def open_direct(path: str) -> int | None:
    """A descriptor of the journal for direct writes, or None where the file system has none
    (tmpfs before Linux 6.6)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:
        return None


def record_crc(lsn: int, txnid: int, payload) -> int:
    return crc32c(payload, crc32c(struct.pack("<QQ", lsn, txnid)))


def pack_header(header: dict) -> bytes:
    meta = header["meta"]
    body = HEADER.pack(
        MAGIC,
        header["seq"],
        header["region"],
        header["txnid"],
        header["replay_lsn"],
        header["psize"],
        len(meta),
    ) + bytes(meta)
    return body + struct.pack("<I", crc32c(body))


def read_header(fd: int) -> dict | None:
    """The valid header with the highest sequence; None if neither slot was ever written.
    A slot that holds something but fails its checks does not count; if both do, the journal
    is damaged and the store cannot be recovered from it."""
    best = None
    written = False
    for slot in (0, 1):
        raw = os.pread(fd, SLOT, slot * SLOT)
        if len(raw) < HEADER.size or not raw.strip(b"\0"):
            continue
        written = True
        magic, seq, region, txnid, lsn, psize, meta_len = HEADER.unpack_from(raw)
        end = HEADER.size + meta_len
        if magic != MAGIC or meta_len != META_BYTES or end + 4 > len(raw):
            continue
        if struct.unpack_from("<I", raw, end)[0] != crc32c(raw[:end]):
            continue
        if best is None or seq > best["seq"]:
            best = {
                "seq": seq,
                "region": region,
                "txnid": txnid,
                "replay_lsn": lsn,
                "psize": psize,
                "meta": raw[HEADER.size : end],
            }
    if best is None and written:
        raise CorruptEntry("both journal header slots are damaged: cannot recover the store")
    return best


def write_zeros(fd: int, offset: int, length: int) -> None:
    zeros = bytes(min(length, ZERO_CHUNK))
    end = offset + length
    while offset < end:
        n = os.pwrite(fd, zeros[: end - offset], offset)
        offset += n


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
