"""``client.admin`` on a cluster: each admin call answered by the broker that holds what it
is about (docs/API.md, "Admin and stats")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._native import TxnID
from ..messaging.topic_name import TopicName
from .admin import AdminCalls
from .handles import txn_str

if TYPE_CHECKING:
    from .cluster import ClusterClient


class ClusterAdmin(AdminCalls):
    """``client.admin`` on a cluster: a coordinator's views at its owner, the cluster's
    (``cluster()``: who owns what; ``cluster_transactions()``, ``cluster_coordinators()``)
    and the rest at any broker."""

    def __init__(self, client: ClusterClient) -> None:
        self._client = client

    def _call(self, name: str, *args: Any) -> Any:
        client = self._client
        wire = [str(a) if isinstance(a, TxnID) else a for a in args]

        def run(conn):
            return conn._json("admin", {"method": name, "args": wire})["result"]

        coordinator = None
        if name == "coordinator_stats" and args and _is_int(args[0]):
            coordinator = args[0]
        elif name == "transaction_metadata" and args:
            try:
                coordinator = TxnID.parse(txn_str(args[0])).coordinator_id
            except (TypeError, ValueError):
                coordinator = None  # the broker says what is wrong with it
        client._check_open()
        if coordinator is not None and 0 <= coordinator < client._coordinators:
            return client._follow("coordinator", coordinator, run)
        if name in _PER_PARTITION and args and isinstance(args[0], str):
            return self._per_partition(name, args)
        return client._any(run)

    def _per_partition(self, name: str, args) -> dict:
        """A partition's figures from its owner; a partitioned topic's, from each partition's
        owner, put together as one broker with all of them would answer."""
        client = self._client
        parts = client._partitions(args[0], create=False)
        answers = {}
        for part in parts:
            wire = [part, *args[1:]]

            def run(conn, wire=wire):
                return conn._json("admin", {"method": name, "args": wire})["result"]

            answers[part] = client._follow("partition", part, run)
        if len(parts) == 1:
            return answers[parts[0]]
        full = TopicName.parse(args[0]).full
        if name == "topic_stats":
            return _sum_stats(full, answers)
        out = {"topic": full}
        if name == "pending_ack_stats":
            out["subscription"] = args[1]
        out["partitions"] = {
            p: {k: v for k, v in a.items() if k not in ("topic", "subscription")}
            for p, a in answers.items()
        }
        return out


# Admin calls about one topic: answered by its partitions' owners.
_PER_PARTITION = ("topic_stats", "transaction_buffer_stats", "pending_ack_stats")


def _sum_stats(full: str, answers: dict) -> dict:
    """topic_stats of a partitioned topic from its partitions': counts summed, and each
    subscription's counts summed over the partitions."""
    out: dict = {"topic": full, "partitions": len(answers), "subscriptions": {}}
    for stats in answers.values():
        for key, value in stats.items():
            if key in ("topic", "partitions"):
                continue
            if key == "subscriptions":
                for sub, figures in value.items():
                    agg = out["subscriptions"].setdefault(sub, {})
                    for k, v in figures.items():
                        agg[k] = agg.get(k, 0) + v if _is_int(v) else agg.get(k, v)
            elif _is_int(value):
                out[key] = out.get(key, 0) + value
            else:
                out.setdefault(key, value)
    return out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
