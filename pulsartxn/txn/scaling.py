"""How many coordinators a store has: the count it saved, grown to the configured one or by
``scale()``, each fitting in the named databases and the memory budget, and their first
blocks of sequences reserved ahead. Part of :class:`pulsartxn.txn.coordinators.Coordinators`."""

from __future__ import annotations

import logging
import struct

from .._native import MAX_SEQUENCE
from ..config import SHARED_DBS
from ..errors import InvalidConfiguration, QuotaExceeded, StorageError, excerpt
from . import log
from .coordinator import Coordinator
from .meta import COORDINATOR_BYTES
from .state import CoordinatorStatus

_LOG = logging.getLogger("pulsartxn.txn")


class CoordinatorScaling:
    """The count and growth of ``Coordinators`` (which holds the state they read)."""

    def _open_count(self, stored: int) -> int:
        """The saved count of coordinators, grown to the configured one. A data directory never
        shrinks its coordinators (their logs would be orphaned), but a count that an older
        broker saved before its coordinators opened, and that max_dbs cannot hold, drops those
        that never handed out an id: none has a sequence reserved, so nothing names them."""
        cfg = self.broker.config
        n = max(stored, cfg.num_coordinators)
        in_use = SHARED_DBS + self.broker.topics.ledgers_in_use()
        if in_use + n <= cfg.max_dbs:
            return n
        used = self._reserved_ids()
        n = max(cfg.num_coordinators, max(used, default=-1) + 1)
        if in_use + n > cfg.max_dbs:
            need = in_use + n + cfg.max_partitions
            raise InvalidConfiguration(
                f"this store's {n} transaction coordinators and {in_use - SHARED_DBS} "
                f"partitions do not fit in max_dbs={cfg.max_dbs} named databases: open it with "
                f"`pulsartxn serve --max-dbs {need}` (Broker(max_dbs={need}))"
            )
        _LOG.warning(
            "the store's saved count of %d transaction coordinators never opened (they do not "
            "fit in max_dbs=%d); opening the %d that may have handed out transaction ids",
            stored,
            cfg.max_dbs,
            n,
        )
        return n

    def _reserved_ids(self) -> set[int]:
        """Coordinators that had sequences reserved: only those ever handed out an id."""
        prefix = log.hwm_key(0)[:-1]
        ids = set()
        with self.storage.read() as lmdb_txn:
            cursor = lmdb_txn.cursor(db=self.storage.meta)
            if cursor.set_range(prefix):
                for key, _ in cursor:
                    key = bytes(key)
                    if not key.startswith(prefix):
                        break
                    if key[len(prefix) :].isdigit():
                        ids.add(int(key[len(prefix) :]))
        return ids

    def _check_room(self, n: int) -> None:
        """QuotaExceeded unless `n` coordinators fit: a named database each beside the
        broker's own and max_partitions (or the partitions there are), and the memory budget."""
        cfg = self.broker.config
        partitions = max(self.broker.topics.partition_count, cfg.max_partitions)
        room = cfg.max_dbs - SHARED_DBS - partitions
        if n > room:
            raise QuotaExceeded(
                f"{n} transaction coordinators do not fit: each takes one of the store's "
                f"max_dbs={cfg.max_dbs} named databases, of which {SHARED_DBS} are the broker's "
                f"own and {partitions} are kept for partitions (max_partitions="
                f"{cfg.max_partitions}); at most {max(room, 0)}"
            )
        budget = cfg.max_coordinators_memory_bytes
        if n * COORDINATOR_BYTES > budget:
            raise QuotaExceeded(
                f"{n} transaction coordinators may hold {n * COORDINATOR_BYTES >> 20} MiB "
                f"({COORDINATOR_BYTES >> 10} KiB each), over max_coordinators_memory_bytes="
                f"{budget}; at most {budget // COORDINATOR_BYTES}"
            )

    def _reserve_ahead(self, coordinators: list[Coordinator]) -> None:
        """Reserve every ready coordinator's first block of sequences in one write: each would
        otherwise make the first new_transaction() it serves wait for a synced write of its
        own (16 of them after each start, by default)."""
        # The mark the allocator would ask for at its first next(): a block past the next
        # sequence, never past the end of the sequence space.
        marks = [
            (c, min(c.allocator.next_sequence + c.allocator.block_size, MAX_SEQUENCE + 1))
            for c in coordinators
            if c.status is CoordinatorStatus.READY and c.allocator is not None
        ]
        if not marks:
            return

        def apply(lmdb_txn) -> None:
            for c, mark in marks:
                lmdb_txn.put(log.hwm_key(c.id), mark.to_bytes(16, "big"), db=self.storage.meta)

        try:
            self.storage.write(apply)
        except StorageError:
            return  # a full disk, say: each reserves its own block when it first needs it
        for c, mark in marks:
            c.reserved_ahead = mark

    def scale(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"number of coordinators must be an int, not {excerpt(n)}")
        # Not under self._lock while writing: the group commit's callbacks take that lock.
        with self._scale_lock:
            current = len(self.coordinators)
            if n < current:
                raise ValueError(
                    f"cannot shrink coordinators from {current} to {n}: logs would be orphaned"
                )
            if self.placement is not None:
                raise InvalidConfiguration("a cluster's coordinators are set when it is made")
            if n > 65536:
                raise ValueError(f"at most 65536 coordinators, not {n}")
            if n == current:
                return
            with self.broker.topics.lock:  # create_topic counts the claimed databases under it
                self._check_room(n)
                self.claimed = n
            try:
                added = [Coordinator(self, i) for i in range(current, n)]
                for c in added:
                    c.recover({})
                self._store_count(n)  # once they opened: a count that cannot open is not saved
            except BaseException:
                self.claimed = current
                raise
            self._reserve_ahead(added)
            with self._lock:
                self.coordinators = self.coordinators + added

    def _store_count(self, n: int) -> None:
        value = struct.pack("<I", n)
        meta = self.storage.meta
        self.storage.write(lambda lmdb_txn: lmdb_txn.put(log.COORDINATORS_KEY, value, db=meta))
