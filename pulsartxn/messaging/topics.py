"""The store's topics, their partitions and subscriptions: the registry clients, the admin
and the transaction coordinators look them up in. The broker wires each partition it loads."""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable

from ..config import SHARED_DBS, BrokerConfig
from ..errors import (
    InvalidTopicName,
    QuotaExceeded,
    TopicAlreadyExists,
    TopicNotFound,
    excerpt,
)
from ..storage import Storage
from ..txn.snapshot import DB as SNAPSHOT_DB
from .cursor import Cursor
from .partition import Partition
from .subscription import Subscription
from .topic_name import TopicName

_U64 = struct.Struct("<Q")
MAX_PARTITIONS = 4096


def check_create_id(value: object) -> str | None:
    """The id a client gives a create call (a topic's here, a producer's or consumer's over
    the network), if any: a str of 1-64 characters, else TypeError."""
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 64):
        raise TypeError(f"create_id must be a str of 1-64 characters, not {excerpt(value)}")
    return value


class Topics:
    def __init__(
        self,
        storage: Storage,
        config: BrokerConfig,
        wire: Callable[[Partition], None],
        coordinator_dbs: Callable[[], int],
    ) -> None:
        """`wire(partition)` connects a partition as it is loaded; `coordinator_dbs()`: the
        named databases the transaction coordinators hold (partitions need the rest)."""
        self.storage = storage
        self.config = config
        self._wire = wire
        self._coordinator_dbs = coordinator_dbs
        # Creating topics, loading partitions and subscriptions; clients also hold it while
        # they register producers and consumers on several partitions at once.
        self.lock = threading.RLock()
        self._topics_db = storage.open_db(b"topics")
        self._ledgers_db = storage.open_db(b"ledgers")
        self._cursors_db = storage.open_db(b"cursors")
        self._partitions: dict[str, Partition] = {}
        self.topic_count, self.partition_count = self._count()

    def _metadata(self, name: TopicName) -> dict | None:
        with self.storage.read() as lmdb_txn:
            raw = lmdb_txn.get(name.full.encode(), db=self._topics_db)
            return json.loads(bytes(raw)) if raw is not None else None

    def create(self, topic: str, partitions: int = 0, create_id: str | None = None) -> None:
        """Create a topic: partitioned with `partitions` > 0, else non-partitioned. A create
        named `create_id` that finds the topic made by a call of that name (its answer was
        lost, and the call is re-sent) succeeds; else TopicAlreadyExists."""
        name = TopicName.parse(topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise TypeError(f"partitions must be an int, not {type(partitions).__name__}")
        if not 0 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions {partitions} out of range 0..{MAX_PARTITIONS}")
        if name.partition_index >= 0:
            raise InvalidTopicName(f"{name.full} names a partition; create its topic instead")
        name.check_new(partitions)
        record = {"partitions": partitions}
        if check_create_id(create_id) is not None:
            record["create_id"] = create_id
        with self.lock:
            found = self._metadata(name)
            if found is not None:
                if create_id is not None and found == record:
                    return  # this call's own topic: it is re-sent
                raise TopicAlreadyExists(f"topic {name.full} already exists")
            self._check_quota(max(partitions, 1))
            base = name.full.encode()

            def apply(lmdb_txn):
                lmdb_txn.put(base, json.dumps(record).encode(), db=self._topics_db)

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
        claimed = self._coordinator_dbs()
        room = cfg.max_dbs - SHARED_DBS - claimed
        if total > room:
            raise QuotaExceeded(
                f"{partitions} more partitions would make {total}: the store's max_dbs="
                f"{cfg.max_dbs} named databases leave room for {room} beside the broker's own "
                f"and {claimed} transaction coordinators"
            )

    def partitions_of(self, topic: str) -> list[str]:
        """The full names of a topic's partitions (itself when non-partitioned)."""
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

    def resolve(self, topic: str, create: bool = True) -> tuple[str, list[Partition]]:
        """The topic's full name and its partitions, auto-creating a non-partitioned topic."""
        name = TopicName.parse(topic)
        with self.lock:
            try:
                names = self.partitions_of(name.full)
            except TopicNotFound:
                if not create:
                    raise
                if name.partition_index >= 0 and self._metadata(name.base) is not None:
                    raise TopicNotFound(f"partition {name.full} does not exist") from None
                self.create(name.full, 0)
                names = [name.full]
            return name.full, [self.partition(n) for n in names]

    def partition(self, full: str) -> Partition:
        """A partition by its full name, loaded (with its subscriptions) on first use."""
        with self.lock:
            part = self._partitions.get(full)
            if part is None:
                part = self._partitions[full] = self._load(full)
            return part

    def loaded(self) -> list[Partition]:
        with self.lock:
            return list(self._partitions.values())

    def _load(self, full: str) -> Partition:
        key = full.encode()
        with self.storage.read() as lmdb_txn:
            raw = lmdb_txn.get(key, db=self._ledgers_db)
            ledger_id = _U64.unpack(raw)[0] if raw is not None else None
        if ledger_id is None:

            def apply(lmdb_txn):
                counter = lmdb_txn.get(b"next_ledger_id", db=self.storage.meta)
                lid = _U64.unpack(counter)[0] if counter is not None else 1
                lmdb_txn.put(b"next_ledger_id", _U64.pack(lid + 1), db=self.storage.meta)
                lmdb_txn.put(key, _U64.pack(lid), db=self._ledgers_db)
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
        self._wire(part)
        with self.storage.read() as lmdb_txn:
            cursor = lmdb_txn.cursor(db=self._cursors_db)
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
        return part

    def subscription(
        self,
        part: Partition,
        name: str,
        earliest: bool,
        at: int | None = None,
        rider=None,
        partial: tuple[int, int, int] | None = None,
    ) -> Subscription:
        """The subscription `name` on `part`, created (its cursor written) if new; `at`: the
        new cursor's mark-delete position instead of the earliest's or the latest's, and
        `partial` a cumulative ack inside the next entry (positions.start_of), in the same
        write; `rider(lmdb_txn)`: written with a new one's cursor."""
        with self.lock:
            sub = part.subscriptions.get(name)
            if sub is not None:
                return sub
            self.room_for_subscription([part], name)
            start = part.first_entry_id - 1 if earliest else part.latest_entry_id
            if at is not None:
                start = at
            cursor = Cursor(start)
            if partial is not None:
                cursor.ack_cumulative(*partial)
            key = part.topic.encode() + b"\0" + name.encode()
            data = cursor.serialize()

            def apply(lmdb_txn):
                lmdb_txn.put(key, data, db=self._cursors_db)
                if rider is not None:
                    rider(lmdb_txn)

            self.storage.write(apply)
            sub = Subscription(part, name, cursor)
            with part.lock:
                part.subscriptions[name] = sub
            return sub

    def room_for_subscription(self, parts, name: str) -> None:
        """QuotaExceeded unless subscription `name` fits on each of `parts` that lacks it
        (lock held): max_subscriptions_per_topic. A topic's partitions are checked together,
        before any is made."""
        limit = self.config.max_subscriptions_per_topic
        for part in parts:
            if name not in part.subscriptions and len(part.subscriptions) >= limit:
                raise QuotaExceeded(
                    f"{part.topic} holds {len(part.subscriptions)} subscriptions, its limit "
                    f"(max_subscriptions_per_topic={limit}): delete unused ones"
                )

    def delete(self, sub: Subscription, rider=None) -> None:
        """The cursor and the pending-ack log of `sub` go in one write: a new subscription
        of the name starts clean. `rider(lmdb_txn)` is written with them."""
        part = sub.partition
        key = sub.key

        def apply(lmdb_txn):
            lmdb_txn.delete(key, db=self._cursors_db)
            sub.pending_ack.delete_log(lmdb_txn)
            if rider is not None:
                rider(lmdb_txn)

        with self.lock:
            sub.wait_persisted()
            self.storage.write(apply)
            with part.lock:
                part.subscriptions.pop(sub.name, None)

    def remove(self, full: str, partitions: list[Partition], rider=None) -> None:
        """Delete a topic in one write: its metadata, and each partition's entries, ledger,
        de-duplication rows, buffer snapshots, cursors and pending-ack logs (lock held, the
        caller checked that nothing uses them); `rider(lmdb_txn)` is written with them."""
        for part in partitions:
            for sub in list(part.subscriptions.values()):
                sub.unsubscribed = True  # a cursor write still queued writes nothing
                sub.wait_persisted()
        snapshots = self.storage.open_db(SNAPSHOT_DB)

        def apply(lmdb_txn):
            lmdb_txn.delete(full.encode(), db=self._topics_db)
            for part in partitions:
                key = part.topic.encode()
                lmdb_txn.delete(key, db=self._ledgers_db)
                entries = lmdb_txn.cursor(db=self.storage.open_db(b"ledger/" + key))
                while entries.first():
                    entries.delete()
                for db in (part._dedup_db, part._dedup_index_db, snapshots, self._cursors_db):
                    _delete_prefix(lmdb_txn, db, key + b"\0")
                for sub in part.subscriptions.values():
                    sub.pending_ack.delete_log(lmdb_txn)
            if rider is not None:
                rider(lmdb_txn)

        self.storage.write(apply)
        for part in partitions:
            self._partitions.pop(part.topic, None)
        self.topic_count -= 1
        self.partition_count -= max(len(partitions), 1)

    def listing(self) -> list[tuple[str, int]]:
        """(full name, partitions) of every topic, by name; 0 partitions: non-partitioned."""
        with self.storage.read() as lmdb_txn:
            return [
                (bytes(k).decode(), json.loads(bytes(v))["partitions"])
                for k, v in lmdb_txn.cursor(db=self._topics_db)
            ]

    def _count(self) -> tuple[int, int]:
        """(topics, partitions) the store holds; a non-partitioned topic counts one."""
        topics = partitions = 0
        with self.storage.read() as lmdb_txn:
            for _, raw in lmdb_txn.cursor(db=self._topics_db):
                topics += 1
                partitions += max(json.loads(bytes(raw))["partitions"], 1)
        return topics, partitions

    def ledgers_in_use(self) -> int:
        """Partitions that have a ledger: a named database each."""
        with self.storage.read() as lmdb_txn:
            return lmdb_txn.stat(self._ledgers_db)["entries"]

    def known(self) -> list[str]:
        """Every topic's full name."""
        with self.storage.read() as lmdb_txn:
            return [bytes(k).decode() for k, _ in lmdb_txn.cursor(db=self._topics_db)]


def _delete_prefix(lmdb_txn, db, prefix: bytes) -> None:
    cursor = lmdb_txn.cursor(db=db)
    while cursor.set_range(prefix) and bytes(cursor.key()).startswith(prefix):
        cursor.delete()
