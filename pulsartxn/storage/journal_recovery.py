"""A synced store's recovery from its journal at open: the last checkpoint's meta page put
back into data.mdb, then the records after it replayed. Part of ``Journal`` (journal.py)."""

from __future__ import annotations

import logging
import os
import struct
import time

from .journal_format import (
    HEAD,
    META_BYTES,
    META_TXNID_AT,
    PAD_MAGIC,
    RECORD,
    RECORD_MAGIC,
    blocks,
    record_crc,
)
from .recording import apply_record

_LOG = logging.getLogger("pulsartxn.journal")


class JournalRecovery:
    """Reading ``Journal``'s file back (which holds its header and descriptors)."""

    def restore_meta(self, data_path: str) -> bool:
        """Put the checkpoint's meta page back into both of data.mdb's meta slots (the other
        as the snapshot before it, pointing to the same pages): LMDB then opens at the
        checkpoint, whatever later meta pages reached the disk. True when something changed."""
        header = self.header
        if header is None:
            return False
        meta, txnid, psize = header["meta"], header["txnid"], header["psize"]
        fd = os.open(data_path, os.O_RDWR)
        changed = False
        try:
            for slot in (0, 1):
                want = bytearray(meta)
                if slot != txnid & 1:
                    struct.pack_into("<Q", want, 0, slot)
                    struct.pack_into("<Q", want, META_TXNID_AT, max(txnid - 1, 0))
                if os.pread(fd, META_BYTES, slot * psize) != bytes(want):
                    os.pwrite(fd, bytes(want), slot * psize)
                    changed = True
            if changed:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        return changed

    def replay(self, env) -> int:
        """Apply the records after the checkpoint, in one write transaction; the next record
        goes after the last valid one. Returns how many records were applied."""
        if self.header is None:
            return 0
        handles: dict = {}
        count = 0
        start = end = self.header["replay_lsn"]
        began = time.monotonic()
        with env.begin(write=True) as lmdb_txn:
            # The last record's end is where the next one goes.
            for end, payload in self._records(self.header["replay_lsn"]):  # noqa: B007
                apply_record(env, lmdb_txn, payload, handles)
                count += 1
        self.lsn = end
        self.replayed = count
        _LOG.info(
            "journal of %s replayed: %d records (%d bytes) after its checkpoint in %.1f ms",
            os.path.dirname(self.path),
            count,
            end - start,
            (time.monotonic() - began) * 1000.0,
        )
        return count

    def _records(self, lsn: int):
        """(lsn after, payload) of each valid record from `lsn` on."""
        fd = self._fd
        size = self._size
        while True:
            offset = lsn % self.region
            left = self.region - offset
            pos = HEAD + offset
            if pos + RECORD.size > size:
                return
            magic, length, at, txnid, crc = RECORD.unpack(os.pread(fd, RECORD.size, pos))
            if at != lsn:
                return
            if magic == PAD_MAGIC and length == 0 and crc == record_crc(at, txnid, b""):
                lsn += left
                continue
            span = blocks(RECORD.size + length)
            if magic != RECORD_MAGIC or span > left or pos + RECORD.size + length > size:
                return
            payload = os.pread(fd, length, pos + RECORD.size)
            if len(payload) != length or crc != record_crc(at, txnid, payload):
                return
            lsn += span
            yield lsn, payload
