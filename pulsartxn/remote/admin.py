"""``client.admin`` of the network clients: the embedded Admin's methods (docs/API.md,
"Admin and stats"), each one call over the network; where it is answered is the subclass's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._native import TxnID
from .._native.keywords import strict_class

if TYPE_CHECKING:
    from .client import RemoteClient


@strict_class
class AdminCalls:
    """The admin methods, each made by ``_call(name, *args)`` (they need the admin token when
    the server has one); the same names and signatures as the embedded Admin's."""

    def _call(self, name: str, *args: Any) -> Any:
        raise NotImplementedError

    def topic_stats(self, topic: str) -> dict:
        """Messages and bytes in and out, storage size, and backlog per subscription."""
        return self._call("topic_stats", topic)

    def coordinators(self) -> list[dict]:
        """One line per coordinator: id, state, active transactions, low watermark."""
        return self._call("coordinators")

    def coordinator_stats(self, coordinator_id: int) -> dict:
        """A coordinator's counters, latency, finalizing transactions and recovery."""
        return self._call("coordinator_stats", coordinator_id)

    def transaction_metadata(self, txn_id: TxnID | str | int) -> dict:
        """State, timeout, open time, produced partitions and acked subscriptions."""
        return self._call("transaction_metadata", txn_id)

    def slow_transactions(self, min_open_ms: float) -> list[dict]:
        """Live transactions open for at least min_open_ms, oldest first."""
        return self._call("slow_transactions", min_open_ms)

    def scale_coordinators(self, n: int) -> None:
        """Grow the number of coordinators (shrinking is refused)."""
        return self._call("scale_coordinators", n)

    def transaction_buffer_stats(self, topic: str) -> dict:
        """Max read position, ongoing and aborted transactions, last snapshot."""
        return self._call("transaction_buffer_stats", topic)

    def pending_ack_stats(self, topic: str, subscription: str) -> dict:
        """Transactions holding acks, held entries, acks, log records and writes."""
        return self._call("pending_ack_stats", topic, subscription)

    def cluster(self) -> dict:
        """Live brokers and the owners of bundles and coordinators (a cluster's only)."""
        return self._call("cluster")

    def cluster_transactions(self, min_open_ms: float = 0) -> list[dict]:
        """Every live broker's transactions open at least min_open_ms (a cluster's only)."""
        return self._call("cluster_transactions", min_open_ms)

    def cluster_coordinators(self) -> list[dict]:
        """The coordinators each broker serves (a cluster's only)."""
        return self._call("cluster_coordinators")


class RemoteAdmin(AdminCalls):
    """``client.admin`` of a remote broker."""

    def __init__(self, client: RemoteClient) -> None:
        self._client = client

    def _call(self, name: str, *args: Any) -> Any:
        wire = [str(a) if isinstance(a, TxnID) else a for a in args]
        return self._client._json("admin", {"method": name, "args": wire})["result"]
