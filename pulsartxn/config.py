"""Broker configuration: one dataclass, every knob with Pulsar's default where Pulsar has one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .txn.meta import COORDINATOR_BYTES

# Named databases of the broker's own (meta, topics, ledgers, cursors, dedup, ...: 11 today);
# the rest of max_dbs holds one per coordinator and one per partition.
SHARED_DBS = 16


@dataclass
class BrokerConfig:
    data_dir: str | os.PathLike
    num_coordinators: int = 16
    default_txn_timeout_ms: int = 60_000
    sync: bool = True  # fsync every group commit
    # With sync: each group is made durable by one fdatasync of a write-ahead journal and
    # LMDB is checkpointed in the background (storage/journal.py); False: LMDB syncs every
    # commit itself (two device flushes). journal_bytes: the journal's circular region.
    journal: bool = True
    journal_bytes: int = 16 << 20
    map_size: int = 1 << 40  # LMDB map: virtual address space, the file grows as used
    max_dbs: int = 16_384  # LMDB named databases (ledgers are one per partition)
    # Quotas: topics, and partitions in all (a non-partitioned topic counts one), checked when
    # a topic is created; what max_dbs leaves beside the coordinators bounds the partitions too.
    max_topics: int = 10_000
    max_partitions: int = 10_000
    # Durable subscriptions on one topic (each partition's), checked when one is created:
    # each holds memory and a cursor (Pulsar's maxSubscriptionsPerTopic).
    max_subscriptions_per_topic: int = 10_000
    # What coordinators may hold (COORDINATOR_BYTES each, 264 KiB: about 990 by default);
    # scale_coordinators also leaves max_partitions of max_dbs to the partitions.
    max_coordinators_memory_bytes: int = 256 << 20
    max_message_size: int = 5 * 1024 * 1024  # Pulsar's default maxMessageSize
    # Group commit (Pulsar's batched transaction log: 512 records / 4 MiB / 1 ms).
    group_max_records: int = 512
    group_max_bytes: int = 4 * 1024 * 1024
    group_linger_ms: float = 0.0  # 0: commit as soon as the queue is drained
    # Producer batching defaults (Pulsar: 1000 messages, 128 KiB, 1 ms publish delay).
    batching_max_messages: int = 1000
    batching_max_bytes: int = 128 * 1024
    batching_max_publish_delay_ms: float = 1.0
    # Dispatch. One receive call materializes at most a consumer's receiver queue size in
    # messages (its own, capped to the maximum) and dispatch_max_bytes of message data (one
    # larger message goes out alone): what one consumer asks for cannot fill the broker.
    receiver_queue_size: int = 1000
    max_receiver_queue_size: int = 50_000
    dispatch_max_bytes: int = 64 * 1024 * 1024
    # The least unacked_messages_timeout_ms a subscribe may ask for (pulsar-client's: 10 s).
    min_ack_timeout_ms: int = 10_000
    # Transactions. A timeout above the maximum is capped to it; a limit on live transactions
    # per coordinator keeps memory bounded (Pulsar #15133); deadlines are checked every tick
    # (Pulsar: 100 ms).
    max_txn_timeout_ms: int = 3_600_000
    max_active_txns_per_coordinator: int = 100_000
    txn_timeout_tick_ms: float = 100.0
    # False: a transaction's first record rides with its first write (data, pending acks or
    # its end), so new_transaction() costs no fsync and one that never wrote anything leaves
    # no trace after a crash. True: new_transaction() returns once its record is durable, as
    # Pulsar's coordinator does (a transaction begun survives a restart before it writes).
    durable_begin: bool = False
    # How long a commit or abort waits for its decision and its participants before it
    # raises Timeout saying the state (Pulsar's client operationTimeout: 30 s).
    operation_timeout_ms: int = 30_000
    # Transaction buffer snapshots (Pulsar: every 1000 transactions or 5 s, and on close).
    txn_snapshot_every_txns: int = 1000
    txn_snapshot_every_ms: float = 5000.0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data_dir = os.fspath(self.data_dir)
        for name in (
            "num_coordinators",
            "default_txn_timeout_ms",
            "max_message_size",
            "group_max_records",
            "group_max_bytes",
            "batching_max_messages",
            "batching_max_bytes",
            "receiver_queue_size",
            "max_receiver_queue_size",
            "dispatch_max_bytes",
            "min_ack_timeout_ms",
            "max_dbs",
            "max_topics",
            "max_partitions",
            "max_subscriptions_per_topic",
            "max_coordinators_memory_bytes",
            "max_txn_timeout_ms",
            "max_active_txns_per_coordinator",
            "txn_snapshot_every_txns",
            "journal_bytes",
            "operation_timeout_ms",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.num_coordinators > 65536:
            raise ValueError(f"num_coordinators {self.num_coordinators} exceeds 65536")
        if self.num_coordinators * COORDINATOR_BYTES > self.max_coordinators_memory_bytes:
            raise ValueError(
                f"num_coordinators {self.num_coordinators} may hold "
                f"{self.num_coordinators * COORDINATOR_BYTES >> 20} MiB "
                f"({COORDINATOR_BYTES >> 10} KiB each), over max_coordinators_memory_bytes "
                f"{self.max_coordinators_memory_bytes}"
            )
        if not isinstance(self.txn_timeout_tick_ms, (int, float)) or not (
            0 < self.txn_timeout_tick_ms <= 60_000
        ):
            raise ValueError(
                f"txn_timeout_tick_ms must be in (0, 60000], got {self.txn_timeout_tick_ms!r}"
            )
        for name in ("group_linger_ms", "batching_max_publish_delay_ms"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
