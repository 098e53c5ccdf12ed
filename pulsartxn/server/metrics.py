"""Prometheus metrics of a served broker (``pulsartxn serve --metrics-port``).

A collector reads the broker's counters when Prometheus scrapes, and only then: plain
attribute reads, no coordinator or buffer lock, nothing added to a hot path. Names are
Pulsar's where Pulsar has the figure (docs/operations.md, "Metrics"), ``pulsartxn_`` else.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from ..txn.meta import HISTOGRAM_MS
from ..txn.state import CoordinatorStatus

_TXN = ("cluster", "coordinator_id")
_TOPIC = ("cluster", "namespace", "topic")
_SUB = ("cluster", "namespace", "topic", "subscription")
# Pulsar's coordinator gauges: (name, help, attribute of the coordinator).
_COORDINATOR_GAUGES = (
    ("pulsar_txn_created_count", "Transactions begun", "created"),
    ("pulsar_txn_committed_count", "Transactions committed", "committed"),
    ("pulsar_txn_aborted_count", "Transactions aborted (timed out ones included)", "aborted"),
    ("pulsar_txn_timeout_count", "Transactions aborted by their timeout", "timed_out"),
    ("pulsar_txn_append_log_count", "Records put in the transaction log", "log_appends"),
)


class BrokerCollector(Collector):
    """The broker's transaction, buffer, pending ack, storage and session figures, read at
    each scrape. `sessions`: the server's (None: no session gauge)."""

    def __init__(self, broker, sessions=None, cluster: str = "standalone") -> None:
        self._broker = broker
        self._sessions = sessions
        self._cluster = cluster

    def describe(self):
        return []  # families depend on what is loaded: none is described ahead of a scrape

    def collect(self):
        if self._broker.storage.closed:
            return
        yield from self._coordinators()
        yield from self._participants()
        yield from self._storage()
        if self._sessions is not None:
            live = GaugeMetricFamily("pulsartxn_sessions", "Client sessions connected")
            live.add_metric([], self._sessions.count())
            yield live
            most = GaugeMetricFamily("pulsartxn_sessions_max", "The most sessions at once")
            most.add_metric([], self._sessions.max_sessions)
            yield most

    def _coordinators(self):
        coordinators = [
            c
            for c in list(self._broker.txn.coordinators)
            if c.status is not CoordinatorStatus.ELSEWHERE  # another broker's: it reports it
        ]
        active = GaugeMetricFamily("pulsar_txn_active_count", "Live transactions", labels=_TXN)
        gauges = [GaugeMetricFamily(n, h, labels=_TXN) for n, h, _ in _COORDINATOR_GAUGES]
        names = [f"le_{b}" for b in HISTOGRAM_MS] + ["le_overflow"]
        latency = [
            GaugeMetricFamily(
                f"pulsar_txn_execution_latency_{n}",
                "Ended transactions whose begin-to-end time (ms) fell in this bucket alone",
                labels=_TXN,
            )
            for n in names
        ]
        retries = CounterMetricFamily(
            "pulsartxn_txn_finalize_retries",
            "Failed attempts to tell a participant a transaction's outcome (each retried)",
            labels=_TXN,
        )
        append_failures = CounterMetricFamily(
            "pulsartxn_txn_append_failures",
            "Decisions whose log record could not be written (the transaction stayed open)",
            labels=_TXN,
        )
        ready = GaugeMetricFamily(
            "pulsartxn_txn_coordinator_ready",
            "1 when the coordinator serves, 0 while it recovers or after its log failed",
            labels=_TXN,
        )
        for c in coordinators:
            labels = [self._cluster, str(c.id)]
            active.add_metric(labels, len(c.txns))
            for family, (_, _, attr) in zip(gauges, _COORDINATOR_GAUGES):
                family.add_metric(labels, getattr(c, attr))
            for family, n in zip(latency, list(c.histogram)):
                family.add_metric(labels, n)
            retries.add_metric(labels, c.finalize_retries)
            append_failures.add_metric(labels, c.append_failures)
            ready.add_metric(labels, 1 if c.status is CoordinatorStatus.READY else 0)
        yield active
        yield from gauges
        yield from latency
        yield from (retries, append_failures, ready)

    def _participants(self):
        tb = {
            "active": GaugeMetricFamily(
                "pulsar_txn_tb_active_total", "Ongoing transactions on the topic", labels=_TOPIC
            ),
            "committed": CounterMetricFamily(
                "pulsar_txn_tb_committed", "Transactions committed on the topic", labels=_TOPIC
            ),
            "aborted": CounterMetricFamily(
                "pulsar_txn_tb_aborted", "Transactions aborted on the topic", labels=_TOPIC
            ),
            "aborted_remembered": GaugeMetricFamily(
                "pulsartxn_txn_tb_aborted_txns",
                "Aborted transactions the buffer keeps to filter reads",
                labels=_TOPIC,
            ),
        }
        tp_committed = CounterMetricFamily(
            "pulsar_txn_tp_committed_count",
            "Transactions whose acks the subscription committed",
            labels=_SUB,
        )
        tp_aborted = CounterMetricFamily(
            "pulsar_txn_tp_aborted_count",
            "Transactions whose acks the subscription released (aborted)",
            labels=_SUB,
        )
        for part in self._broker.topics.loaded():
            buffer = part.buffer
            labels = [self._cluster, _namespace(part.topic), part.topic]
            tb["active"].add_metric(labels, len(buffer.ongoing))
            tb["committed"].add_metric(labels, buffer.committed)
            tb["aborted"].add_metric(labels, buffer.aborted)
            tb["aborted_remembered"].add_metric(labels, len(buffer.aborts))
            for name, sub in list(part.subscriptions.items()):
                pending = sub.pending_ack
                tp_committed.add_metric([*labels, name], pending.committed)
                tp_aborted.add_metric([*labels, name], pending.aborted)
        yield from tb.values()
        yield from (tp_committed, tp_aborted)

    def _storage(self):
        stats = self._broker.storage.stats()
        yield _histogram(
            "pulsartxn_group_commit_records",
            "Records per group commit (one LMDB write transaction)",
            stats["group_records"],
        )
        yield _histogram(
            "pulsartxn_group_commit_seconds",
            "A group commit's time, its sync included (the journal's, or LMDB's without one)",
            stats["commit_seconds"],
        )
        failed = CounterMetricFamily(
            "pulsartxn_group_commit_failures", "Group commits that failed (nothing of them written)"
        )
        failed.add_metric([], stats["failed_groups"])
        yield failed
        yield _gauge(
            "pulsartxn_journal_enabled",
            "1 when the journal makes groups durable",
            int(stats["journal"]),
        )
        yield _gauge(
            "pulsartxn_storage_halted",
            "1 once a failed write or sync stopped the store's writes (reopen to recover)",
            int(stats["halted"]),
        )
        if not stats["journal"]:
            return
        yield _histogram(
            "pulsartxn_journal_write_seconds",
            "A journal record's write, from its start to the device having it",
            stats["journal_write_seconds"],
        )
        yield _histogram(
            "pulsartxn_journal_fsync_seconds",
            "The fdatasync that makes journal records durable",
            stats["journal_fsync_seconds"],
        )
        yield _gauge(
            "pulsartxn_checkpoint_lag_bytes",
            "Journal bytes written since the last checkpoint (what a restart replays)",
            stats["checkpoint_lag_bytes"],
        )
        yield _gauge(
            "pulsartxn_checkpoint_age_seconds",
            "Seconds since the last checkpoint",
            stats["checkpoint_age_s"],
        )
        yield _gauge(
            "pulsartxn_journal_region_bytes",
            "The journal's size: a checkpoint is due when a quarter of it is used",
            stats["journal_region_bytes"],
        )
        checkpoints = CounterMetricFamily("pulsartxn_checkpoints", "Checkpoints taken")
        checkpoints.add_metric([], stats["checkpoints"])
        yield checkpoints


def _namespace(topic: str) -> str:
    """tenant/namespace of persistent://tenant/namespace/name."""
    return "/".join(topic.split("://", 1)[-1].split("/")[:2])


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _histogram(name: str, doc: str, figures: dict) -> HistogramMetricFamily:
    """A storage Buckets snapshot (a count per bucket alone) as Prometheus's cumulative one."""
    family = HistogramMetricFamily(name, doc)
    total, buckets = 0, []
    for bound, n in figures["buckets"].items():
        total += n
        buckets.append((bound, total))
    family.add_metric([], buckets, figures["sum"])
    return family


class MetricsServer:
    """``/metrics`` over HTTP on (host, port), port 0 picking a free one (``.port``)."""

    def __init__(self, broker, host: str, port: int, *, sessions=None, cluster: str = "standalone"):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker, sessions, cluster))
        ProcessCollector(registry=self.registry)
        self._httpd, self._thread = start_http_server(port, host, self.registry)
        self.host = host
        self.port = self._httpd.server_port
        self._closed = threading.Event()

    def close(self) -> None:
        """Stop serving; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
