"""The embedded broker: wires storage, topics, partitions and subscriptions together."""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ._native import FlushTimer
from ._native.keywords import strict_class, unexpected_keyword
from .admin import Admin
from .client import Client
from .config import BrokerConfig
from .errors import (
    AlreadyClosed,
    PulsarTxnError,
)
from .messaging.partition import Partition
from .messaging.topics import Topics
from .storage import Storage, WriteOp
from .txn.coordinators import Coordinators
from .txn.participant import Participants


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


@strict_class
class Broker:
    """``Broker(data_dir, ...)``: an embedded broker on an LMDB data directory."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        num_coordinators: int = 16,
        default_txn_timeout_ms: int = 60_000,
        sync: bool = True,
        txn_participants: Callable[[str, Any], Any] | None = None,
        cluster: Any = None,
        **options: Any,
    ) -> None:
        """txn_participants: optional ``(kind, name) -> participant or None`` consulted before
        the broker's own partitions and subscriptions when a transaction is finalized (fault
        injection, custom resource managers); a participant has ``end_txn(txn_id, commit,
        low_watermark)`` and must treat a repeated call as success.

        cluster: this broker is one of a cluster (``pulsartxn serve --cluster``): an object
        with ``attach(storage) -> broker id`` and ``coordinators`` (the cluster's count),
        a ``participant(kind, name)`` like `txn_participants` for those on other brokers,
        and the txn layer's ``Placement``."""
        known = [f.name for f in dataclasses.fields(BrokerConfig)]
        for name in options:
            if name not in known:
                raise unexpected_keyword("Broker", name, [*known, "txn_participants", "cluster"])
        if cluster is not None:
            num_coordinators = cluster.coordinators
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
        self.cluster = cluster
        try:
            self.broker_id = "standalone" if cluster is None else cluster.attach(self.storage)
        except BaseException:
            self.storage.close()
            raise
        self._closed = False
        self._clients: weakref.WeakSet = weakref.WeakSet()
        self._flusher = _BatchFlusher(cfg.batching_max_publish_delay_ms)
        try:
            self.topics = Topics(self.storage, cfg, self._wire, lambda: self.txn.claimed)
            elsewhere = txn_participants
            if cluster is not None:
                elsewhere = _first_of(txn_participants, cluster.participant)
            participants = Participants(self._buffer_of, self._pending_ack_of, elsewhere)
            self.txn = Coordinators(self, participants, cluster)
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

    def client(self, *, session: str | None = None) -> Client:
        """An in-process client. `session`: the network session it serves (the server's):
        its transactions then outlive this process, until that session is gone."""
        self.check_open()
        client = Client._embedded(self, session)
        self._clients.add(client)
        return client

    def check_open(self) -> None:
        """AlreadyClosed once the broker is closed."""
        if self._closed:
            raise AlreadyClosed("the broker is closed")  # no data dir: this may cross the wire

    def close(self) -> None:
        """Flush producers, persist cursors, close LMDB. Idempotent."""
        with self.topics.lock:
            if self._closed:
                return
            self._closed = True
        for client in list(self._clients):
            try:
                client.close()
            except PulsarTxnError:
                pass
        self.txn.close()
        for part in self.topics.loaded():
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
        for part in self.topics.loaded():
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

    def create_topic(
        self, topic: str, partitions: int = 0, *, create_id: str | None = None
    ) -> None:
        """Create a topic: partitioned with `partitions` > 0, else non-partitioned.
        `create_id` names the call: made again with it after its answer was lost, it succeeds
        when its first attempt created the topic."""
        self.check_open()
        self.topics.create(topic, partitions, create_id)

    def topic_partitions(self, topic: str) -> list[str]:
        self.check_open()
        return self.topics.partitions_of(topic)

    def _wire(self, part: Partition) -> None:
        part.broker_flusher = self._flusher
        part.buffer.txn_check = self.txn.check_open

    def _buffer_of(self, full: str):
        """A partition's transaction buffer (its coordinators' participant)."""
        return self.topics.partition(full).buffer

    def _pending_ack_of(self, full: str, subscription: str):
        """A subscription's pending acks; None once it is unsubscribed."""
        sub = self.topics.partition(full).subscriptions.get(subscription)
        return sub.pending_ack if sub is not None else None

    def producer_id(self, producer_name: str) -> int:
        """A stable 64-bit id of a producer name (written in each entry's header)."""
        return int.from_bytes(
            hashlib.blake2b(producer_name.encode(), digest_size=8).digest(), "little"
        )

    def write(self, apply: Callable[..., Any], **kwargs: Any) -> Any:
        return self.storage.write(apply, **kwargs)

    def submit(self, op: WriteOp) -> Any:
        return self.storage.submit(op)

    def __repr__(self) -> str:
        return f"Broker({self.config.data_dir!r}{', closed' if self._closed else ''})"


def _first_of(*lookups):
    """A participant lookup asking each of `lookups` (None: skipped) in turn."""
    found = [f for f in lookups if f is not None]

    def find(kind, name):
        for f in found:
            participant = f(kind, name)
            if participant is not None:
                return participant
        return None

    return find


def default_data_dir() -> str:
    return os.environ.get("PULSARTXN_DATA_DIR", "pulsartxn-data")
