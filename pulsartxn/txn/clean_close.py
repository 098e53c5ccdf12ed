"""What a restart of the broker may trust: the marker a clean close writes last, the machine's
boot id at the last open, and the begun transactions a clean close logs so they stay open.
Part of :class:`pulsartxn.txn.coordinators.Coordinators`."""

from __future__ import annotations

from ..errors import PulsarTxnError
from .coordinator import OPEN

# meta keys: one written as the last thing a broker's close does, deleted at open; and the
# machine's boot id at the last open. Without the first, what the broker answered survived
# its stop only if the machine did not restart since (stored writes are on the device or in
# its page cache): otherwise its open transactions are unverified.
CLEAN_KEY = b"txn/closed-cleanly"
BOOT_KEY = b"txn/boot-id"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


class CleanClose:
    """The writes of a clean close of ``Coordinators``."""

    def _log_begun(self) -> None:
        """On a clean close, open transactions that have not written yet are logged, so they
        are still open (with their deadlines) after the restart."""
        puts = []
        for c in self.coordinators:
            with c.lock:
                for meta in c.txns.values():
                    if meta.new_record is not None and meta.state is OPEN:
                        puts.append((c.db, meta, meta.new_record))
        if not puts or self.storage.closed:
            return

        def apply(lmdb_txn) -> None:
            for db, _, (key, value) in puts:
                lmdb_txn.put(key, value, db=db)

        try:
            self.storage.write(apply, nbytes=64 * len(puts))
        except Exception:  # noqa: BLE001 - they wrote nothing: losing them loses nothing
            return
        for c in self.coordinators:
            with c.lock:
                for _, meta, record in puts:
                    if meta.new_record is record:
                        meta.new_record = None

    def mark_clean(self) -> None:
        """The last write of a clean close: the next open trusts what it finds."""
        try:
            self.storage.write(lambda t: t.put(CLEAN_KEY, b"1", db=self.storage.meta))
        except PulsarTxnError:
            pass  # the next open takes it for a stop without close: safe, only stricter


def _boot_id() -> bytes | None:
    """This boot of the machine (Linux), or None where it cannot be told."""
    try:
        with open(BOOT_ID, "rb") as f:
            return f.read().strip() or None
    except OSError:
        return None
