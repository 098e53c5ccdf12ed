"""The embedded broker: wires storage, topics, partitions and subscriptions together."""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import math
import os
import struct
import threading
import time
import weakref

from ._native import FlushTimer
from .admin import Admin
from .client import Client
from .config import SHARED_DBS, BrokerConfig
from .errors import (
    AlreadyClosed,
    InvalidTopicName,
    PulsarTxnError,
    QuotaExceeded,
    TopicAlreadyExists,
    TopicNotFound,
)
from .messaging.cursor import Cursor
from .messaging.partition import Partition
from .messaging.subscription import Subscription
from .messaging.topic_name import TopicName
from .storage import Storage, WriteOp
from .txn.service import Coordinators

_U64 = struct.Struct("<Q")
MAX_PARTITIONS = 4096


class _BatchFlusher:
    """Flushes what waits for a delay: producer batches past their publish delay and
    subscription cursors and pending acks to persist (one thread per broker).

    A watched part is asked (``flush_if_older``) from its due time on, then every half delay
    until it answers True. A part watches again only once what it held has been written (by
    this thread, or by another writer: a commit takes its transaction's pending acks), so its
    latest watch gives its due time. The thread sleeps until the earliest one on a native
    timer, which wakes up without the GIL when that time has moved later meanwhile (the next
    transaction's acks): a wake-up that took the GIL cost the threads that produce a hand-off
    each time, about once a delay while acks keep coming."""

    def __init__(self, delay_ms: float) -> None:
        self.delay = delay_ms / 1000.0
        self._interval = max(self.delay / 2, 0.0002)
        self._due: dict = {}  # part -> when to ask it (time.monotonic())
        self._heap: list = []  # (due, tie, part), stale once the part's due is another
        self._tie = itertools.count()
        self._lock = threading.Lock()
        self._timer = FlushTimer()
        self._thread = threading.Thread(
            target=self._run, name="pulsartxn-batch-flusher", daemon=True
        )
        self._thread.start()

    def watch(self, part, due: float | None = None) -> None:
        """Ask `part` from `due` on (time.monotonic(); None: at once) until it is done."""
        with self._lock:
            self._put(part, 0.0 if due is None else due)
            self._set_timer()

    def _put(self, part, at: float) -> None:
        self._due[part] = at
        heapq.heappush(self._heap, (at, next(self._tie), part))

    def _set_timer(self) -> None:
        """The timer to the earliest due time (lock held)."""
        heap, due = self._heap, self._due
        while heap and due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # asked since, or watched again with another time
        if len(heap) > 2 * len(due) + 64:
            self._heap = heap = [(at, next(self._tie), part) for part, at in due.items()]
            heapq.heapify(heap)
        self._timer.set(heap[0][0] if heap else math.inf)

    def _run(self) -> None:
        timer = self._timer
        while timer.wait():
            now = time.monotonic()
            with self._lock:
                # Unwatched before they are asked: a watch() racing with a flush stays.
                asked = [part for part, at in self._due.items() if at <= now]
                for part in asked:
                    del self._due[part]
            for part in asked:
                try:
                    done = part.flush_if_older(self.delay)
                except AlreadyClosed:
                    done = True  # the broker is closing; close() writes what is left
                if not done:
                    with self._lock:
                        again = time.monotonic() + self._interval
                        if self._due.get(part, math.inf) > again:
                            self._put(part, again)
            with self._lock:
                self._set_timer()

    def stop(self) -> None:
        self._timer.stop()
        self._thread.join()


class Broker:
    """``Broker(data_dir, ...)``: an embedded broker on an LMDB data directory."""

    def __init__(
        self,
        data_dir,
        num_coordinators: int = 16,
        default_txn_timeout_ms: int = 60_000,
        sync: bool = True,
        txn_participants=None,
        **options,
    ) -> None:
        """txn_participants: optional ``(kind, name) -> participant or None`` consulted before
        the broker's own partitions and subscriptions when a transaction is finalized (fault
        injection, custom resource managers); a participant has ``end_txn(txn_id, commit,
        low_watermark)`` and must treat a repeated call as success."""
        self.config = BrokerConfig(
            data_dir,
            num_coordinators=num_coordinators,
            default_txn_timeout_ms=default_txn_timeout_ms,
            sync=sync,
            **options,
        )
        cfg = self.config
        self.storage = Storage(
            cfg.data_dir,
            sync=cfg.sync,
            map_size=cfg.map_size,
            max_dbs=cfg.max_dbs,
            group_max_records=cfg.group_max_records,
            group_max_bytes=cfg.group_max_bytes,
            group_linger_ms=cfg.group_linger_ms,
            journal=cfg.journal,
            journal_bytes=cfg.journal_bytes,
        )
        self.broker_id = "standalone"
        self._lock = threading.RLock()
        self._closed = False
        self._topics_db = self.storage.open_db(b"topics")
        self._ledgers_db = self.storage.open_db(b"ledgers")
        self._cursors_db = self.storage.open_db(b"cursors")
        self._partitions: dict[str, Partition] = {}
        self._clients: weakref.WeakSet = weakref.WeakSet()
        self._flusher = _BatchFlusher(cfg.batching_max_publish_delay_ms)
        try:
            self.topic_count, self.partition_count = self._count_topics()
            self.txn = Coordinators(self, txn_participants)
        except BaseException:
            self._flusher.stop()
            self.storage.close()
            raise
        self.admin = Admin(self)
        self.txn.start()

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def data_dir(self) -> str:
        return self.storage.data_dir

    def client(self, *, session: str | None = None):
        """An in-process client. `session`: the network session it serves (the server's):
        its transactions then outlive this process, until that session is gone."""
        self._check_open()
        client = Client._embedded(self, session)
        self._clients.add(client)
        return client

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("the broker is closed")  # no data dir: this may cross the wire

    def close(self) -> None:
        """Flush producers, persist cursors, close LMDB. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for client in list(self._clients):
            try:
                client.close()
            except PulsarTxnError:
                pass
        self.txn.close()
        for part in list(self._partitions.values()):
            snapshots = part.buffer.snapshot
            if snapshots.ended_since or snapshots.new_aborts or part.buffer.ongoing:
                snapshots.take(wait=True)
            for sub in list(part.subscriptions.values()):
                sub.pending_ack.flush()
                sub.wait_persisted()
        self._flusher.stop()
        self.txn.mark_clean()
        self.storage.close()

    def low_watermark_moved(self, coordinator_id: int, low_watermark: int) -> None:
        """A coordinator's low watermark rose (its timer): the partitions and subscriptions
        loaded here drop what they hold of its transactions below it."""
        with self._lock:
            parts = list(self._partitions.values())
        for part in parts:
            op = part.buffer.advance(coordinator_id, low_watermark)
            if op is not None and not self.storage.closed:
                op.durable = False  # ends of finished transactions: redone if lost
                try:
                    self.storage.submit(op)
                except AlreadyClosed:
                    return
            for sub in list(part.subscriptions.values()):
                sub.pending_ack.advance(coordinator_id, low_watermark)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- topics ----------------------------------------------------------------------------

    def _metadata(self, name: TopicName) -> dict | None:
        with self.storage.read() as txn:
            raw = txn.get(name.full.encode(), db=self._topics_db)
            return json.loads(bytes(raw)) if raw is not None else None

    def create_topic(self, topic: str, partitions: int = 0) -> None:
        """Create a topic: partitioned with `partitions` > 0, else non-partitioned."""
        self._check_open()
        name = TopicName.parse(topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise TypeError(f"partitions must be an int, not {type(partitions).__name__}")
        if not 0 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions {partitions} out of range 0..{MAX_PARTITIONS}")
        if name.partition_index >= 0:
            raise InvalidTopicName(f"{name.full} names a partition; create its topic instead")
        name.check_new(partitions)
        with self._lock:
            if self._metadata(name) is not None:
                raise TopicAlreadyExists(f"topic {name.full} already exists")
            self._check_quota(max(partitions, 1))
            base = name.full.encode()

            def apply(txn):
                txn.put(base, json.dumps({"partitions": partitions}).encode(), db=self._topics_db)

            self.storage.write(apply)
            self.topic_count += 1
            self.partition_count += max(partitions, 1)

    def _check_quota(self, partitions: int) -> None:
        """QuotaExceeded unless one more topic of `partitions` fits (lock held): max_topics,
        max_partitions, and a named database per partition beside the coordinators'."""
        cfg = self.config
        if self.topic_count >= cfg.max_topics:
            raise QuotaExceeded(
                f"the broker holds {self.topic_count} topics, its limit (max_topics="
                f"{cfg.max_topics})"
            )
        total = self.partition_count + partitions
        if total > cfg.max_partitions:
            raise QuotaExceeded(
                f"{partitions} more partitions would make {total}, over max_partitions="
                f"{cfg.max_partitions}"
            )
        room = cfg.max_dbs - SHARED_DBS - self.txn.claimed
        if total > room:
            raise QuotaExceeded(
                f"{partitions} more partitions would make {total}: the store's max_dbs="
                f"{cfg.max_dbs} named databases leave room for {room} beside the broker's own "
                f"and {self.txn.claimed} transaction coordinators"
            )

    def topic_partitions(self, topic: str) -> list[str]:
        self._check_open()
        name = TopicName.parse(topic)
        meta = self._metadata(name)
        if meta is None:
            base = name.base
            parent = self._metadata(base) if base != name else None
            if parent is not None and name.partition_index < parent["partitions"]:
                return [name.full]
            raise TopicNotFound(f"topic {name.full} does not exist")
        n = meta["partitions"]
        return [name.partition(i).full for i in range(n)] if n else [name.full]

    def _resolve(self, topic: str, create: bool = True) -> tuple[str, list[Partition]]:
        """The topic's full name and its partitions, auto-creating a non-partitioned topic."""
        self._check_open()
        name = TopicName.parse(topic)
        with self._lock:
            try:
                names = self.topic_partitions(name.full)
            except TopicNotFound:
                if not create:
                    raise
                if name.partition_index >= 0 and self._metadata(name.base) is not None:
                    raise TopicNotFound(f"partition {name.full} does not exist") from None
                self.create_topic(name.full, 0)
                names = [name.full]
            return name.full, [self._partition(n) for n in names]

    def _partition(self, full: str) -> Partition:
        part = self._partitions.get(full)
        if part is not None:
            return part
        key = full.encode()
        with self.storage.read() as txn:
            raw = txn.get(key, db=self._ledgers_db)
            ledger_id = _U64.unpack(raw)[0] if raw is not None else None
        if ledger_id is None:

            def apply(txn):
                counter = txn.get(b"next_ledger_id", db=self.storage.meta)
                lid = _U64.unpack(counter)[0] if counter is not None else 1
                txn.put(b"next_ledger_id", _U64.pack(lid + 1), db=self.storage.meta)
                txn.put(key, _U64.pack(lid), db=self._ledgers_db)
                return lid

            ledger_id = self.storage.write(apply)
        part = Partition(
            self.storage,
            TopicName.parse(full),
            ledger_id,
            {
                "every_txns": self.config.txn_snapshot_every_txns,
                "every_ms": self.config.txn_snapshot_every_ms,
            },
        )
        part.broker_flusher = self._flusher
        part.buffer.txn_check = self.txn.check_open
        with self.storage.read() as txn:
            cursor = txn.cursor(db=self._cursors_db)
            prefix = key + b"\0"
            if cursor.set_range(prefix):
                for k, v in cursor:
                    k = bytes(k)
                    if not k.startswith(prefix):
                        break
                    sub_name = k[len(prefix) :].decode()
                    part.subscriptions[sub_name] = Subscription(
                        part, sub_name, Cursor.deserialize(v)
                    )
        self._partitions[full] = part
        return part

    def _subscription(self, part: Partition, name: str, earliest: bool) -> Subscription:
        with self._lock:
            sub = part.subscriptions.get(name)
            if sub is not None:
                return sub
            start = part.first_entry_id - 1 if earliest else part.last_entry_id
            cursor = Cursor(start)
            key = part.topic.encode() + b"\0" + name.encode()
            data = cursor.serialize()
            self.storage.write(lambda txn: txn.put(key, data, db=self._cursors_db))
            sub = Subscription(part, name, cursor)
            with part.lock:
                part.subscriptions[name] = sub
            return sub

    def _delete_subscription(self, sub: Subscription) -> None:
        """The cursor and the pending-ack log of `sub` go in one write: a new subscription
        of the name starts clean."""
        part = sub.partition
        key = part.topic.encode() + b"\0" + sub.name.encode()

        def apply(txn):
            txn.delete(key, db=self._cursors_db)
            sub.pending_ack.delete_log(txn)

        with self._lock:
            sub.wait_persisted()
            self.storage.write(apply)
            with part.lock:
                part.subscriptions.pop(sub.name, None)

    def producer_id(self, producer_name: str) -> int:
        """A stable 64-bit id of a producer name (written in each entry's header)."""
        return int.from_bytes(
            hashlib.blake2b(producer_name.encode(), digest_size=8).digest(), "little"
        )

    def _count_topics(self) -> tuple[int, int]:
        """(topics, partitions) the store holds; a non-partitioned topic counts one."""
        topics = partitions = 0
        with self.storage.read() as txn:
            for _, raw in txn.cursor(db=self._topics_db):
                topics += 1
                partitions += max(json.loads(bytes(raw))["partitions"], 1)
        return topics, partitions

    def ledgers_in_use(self) -> int:
        """Partitions that have a ledger: a named database each."""
        with self.storage.read() as txn:
            return txn.stat(self._ledgers_db)["entries"]

    def _known_topics(self) -> list[str]:
        with self.storage.read() as txn:
            return [bytes(k).decode() for k, _ in txn.cursor(db=self._topics_db)]

    def write(self, apply, **kwargs):
        return self.storage.write(apply, **kwargs)

    def submit(self, op: WriteOp):
        return self.storage.submit(op)

    def __repr__(self) -> str:
        return f"Broker({self.config.data_dir!r}{', closed' if self._closed else ''})"


def default_data_dir() -> str:
    return os.environ.get("PULSARTXN_DATA_DIR", "pulsartxn-data")
