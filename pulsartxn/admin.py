"""Admin and stats (API.md, "Admin and stats")."""

from __future__ import annotations

from ._native import TxnID
from ._native.keywords import strict_class
from .errors import InvalidConfiguration, PulsarTxnError, excerpt
from .txn.transaction import as_txn_id


@strict_class
class Admin:
    """``broker.admin`` (also ``client.admin``): stats and coordinator management; the remote
    and cluster clients' admins have the same methods."""

    def __init__(self, broker) -> None:
        self._broker = broker

    def topic_stats(self, topic: str) -> dict:
        """Messages and bytes in and out, storage size, and backlog per subscription."""
        full, partitions = self._broker.topics.resolve(topic, create=False)
        out = {
            "topic": full,
            "partitions": len(partitions) if len(partitions) > 1 or partitions[0].index >= 0 else 0,
            "msg_in": 0,
            "bytes_in": 0,
            "msg_out": 0,
            "bytes_out": 0,
            "entries": 0,
            "messages": 0,
            "storage_size": 0,
            "subscriptions": {},
        }
        subs: dict[str, dict] = out["subscriptions"]
        for part in partitions:
            out["msg_in"] += part.msg_in
            out["bytes_in"] += part.bytes_in
            out["msg_out"] += part.msg_out
            out["bytes_out"] += part.bytes_out
            out["entries"] += part.next_entry_id - part.first_entry_id
            out["messages"] += part.total_messages
            out["storage_size"] += part.storage_size()
            for name, sub in list(part.subscriptions.items()):
                s = sub.stats()
                agg = subs.setdefault(
                    name,
                    {
                        "backlog": 0,
                        "consumers": 0,
                        "waiting": 0,
                        "unacked": 0,
                        "msg_out": 0,
                        "bytes_out": 0,
                        "delayed": 0,
                        "type": s["type"],
                    },
                )
                for k in (
                    "backlog",
                    "consumers",
                    "waiting",
                    "unacked",
                    "msg_out",
                    "bytes_out",
                    "delayed",
                ):
                    agg[k] += s[k]
                agg["type"] = agg["type"] or s["type"]
        return out

    # -- transaction coordinators ----------------------------------------------------------

    def coordinators(self) -> list[dict]:
        """One line per coordinator: id, state, active transactions, low watermark."""
        self._broker.check_open()
        out = []
        for c in self._broker.txn.coordinators:
            st = c.stats()
            out.append(
                {
                    "coordinator_id": c.id,
                    "state": st["state"],
                    "error": st["error"],
                    "active": st["active"],
                    "low_watermark": st["low_watermark"],
                    "next_sequence": st["next_sequence"],
                }
            )
        return out

    def coordinator_stats(self, coordinator_id: int) -> dict:
        """Counters (created, committed, aborted, timed out, active), the begin-to-end latency
        histogram, transactions still being finalized, recovery time and counts."""
        self._broker.check_open()
        service = self._broker.txn
        stats = service.coordinator(coordinator_id).stats()
        stats["decision_errors"] = list(service.groups.errors)
        return stats

    def transaction_metadata(self, txn_id: TxnID | str | int) -> dict:
        """State, timeout, open time, produced partitions and acked subscriptions of a live
        transaction; state only (``{"txn_id", "state"}``) for one recently finished."""
        self._broker.check_open()
        tid = as_txn_id(txn_id)
        service = self._broker.txn
        c = service.of(tid)
        with c.lock:
            meta = c.txns.get(tid.sequence)
            if meta is not None:
                return c.metadata(meta)
        return {"txn_id": str(tid), "state": service.state_of(tid).value}

    def slow_transactions(self, min_open_ms: float) -> list[dict]:
        """Live transactions open for at least min_open_ms, oldest first."""
        self._broker.check_open()
        if isinstance(min_open_ms, bool) or not isinstance(min_open_ms, (int, float)):
            raise TypeError(f"min_open_ms must be a number, not {excerpt(min_open_ms)}")
        if min_open_ms < 0:
            raise ValueError(f"min_open_ms must not be negative, got {min_open_ms}")
        return self._broker.txn.slow(min_open_ms)

    def scale_coordinators(self, n: int) -> None:
        """Grow the number of coordinators on a live broker (shrinking is refused)."""
        self._broker.check_open()
        self._broker.txn.scale(n)

    # -- transaction buffers and pending acks ----------------------------------------------

    def transaction_buffer_stats(self, topic: str) -> dict:
        """Max read position, ongoing and aborted transactions, last snapshot; per partition
        for a partitioned topic (``{"partitions": {name: stats}}``)."""
        self._broker.check_open()
        full, partitions = self._broker.topics.resolve(topic, create=False)
        if len(partitions) == 1:
            return {"topic": full, **partitions[0].buffer.stats()}
        return {"topic": full, "partitions": {p.topic: p.buffer.stats() for p in partitions}}

    def pending_ack_stats(self, topic: str, subscription: str) -> dict:
        """Transactions holding acks, held entries, acks, log records and writes."""
        self._broker.check_open()
        full, partitions = self._broker.topics.resolve(topic, create=False)
        out = {"topic": full, "subscription": subscription}
        per = {}
        for p in partitions:
            sub = p.subscriptions.get(subscription)
            if sub is not None:
                per[p.topic] = sub.pending_ack.stats()
                per[p.topic]["error"] = str(sub.error) if sub.error is not None else None
        if not per:
            raise PulsarTxnError(f"subscription {excerpt(subscription)} does not exist on {full}")
        if len(partitions) == 1:
            out.update(next(iter(per.values())))
        else:
            out["partitions"] = per
        return out

    # -- a cluster's views (docs/cluster.md): a standalone broker has none ------------------

    def cluster(self) -> dict:
        """Live brokers and the owners of bundles and coordinators (a cluster's only)."""
        raise _standalone("cluster")

    def cluster_transactions(self, min_open_ms: float = 0) -> list[dict]:
        """Every live broker's transactions open at least min_open_ms (a cluster's only)."""
        raise _standalone("cluster_transactions")

    def cluster_coordinators(self) -> list[dict]:
        """The coordinators each broker serves (a cluster's only)."""
        raise _standalone("cluster_coordinators")


def _standalone(call: str) -> InvalidConfiguration:
    return InvalidConfiguration(
        f"admin.{call}() needs a broker cluster (docs/cluster.md); this broker is standalone"
    )
