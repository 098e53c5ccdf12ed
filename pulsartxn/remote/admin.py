"""``client.admin`` of the network clients: the embedded Admin's methods (docs/API.md,
"Admin and stats"), each one call over the network; where it is answered is the subclass's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._native import MessageId, TxnID
from .._native.keywords import strict_class
from ..messaging.admin_ops import format_id
from ..server.protocol import ADMIN_ONCE_METHODS

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

    def partitioned_stats(self, topic: str, per_partition: bool = False) -> dict:
        """topic_stats of a partitioned topic, with each partition's when asked."""
        return self._call("partitioned_stats", topic, per_partition)

    def list_topics(self) -> list[dict]:
        """Every topic by name with its partition count (0: non-partitioned)."""
        return self._call("list_topics")

    def delete_topic(self, topic: str, force: bool = False) -> None:
        """Delete a topic (refused while transactions use it, or connected unless force)."""
        return self._call("delete_topic", topic, force)

    def list_subscriptions(self, topic: str) -> list[str]:
        """The names of a topic's durable subscriptions, sorted."""
        return self._call("list_subscriptions", topic)

    def create_subscription(
        self, topic: str, subscription: str, position: MessageId | str = "latest"
    ) -> None:
        """Create a durable subscription at "latest", "earliest" or a message id."""
        return self._call("create_subscription", topic, subscription, position)

    def delete_subscription(self, topic: str, subscription: str, force: bool = False) -> None:
        """Delete a subscription (refused while transactions hold acks, or connected)."""
        return self._call("delete_subscription", topic, subscription, force)

    def reset_cursor(self, topic: str, subscription: str, position: MessageId | str | int) -> None:
        """Move a subscription to a message id or a publish time in ms, as consumer.seek."""
        return self._call("reset_cursor", topic, subscription, position)

    def skip(self, topic: str, subscription: str, n: int) -> int:
        """Acknowledge the next n messages; how many were skipped."""
        return self._call("skip", topic, subscription, n)

    def clear_backlog(self, topic: str, subscription: str) -> None:
        """Acknowledge every message readable now."""
        return self._call("clear_backlog", topic, subscription)

    def peek(self, topic: str, subscription: str, n: int = 1) -> list[dict]:
        """The next n committed messages of a subscription, which does not move."""
        return self._call("peek", topic, subscription, n)

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

    def transaction_in_buffer_stats(self, topic: str, txn_id: TxnID | str | int) -> dict:
        """One transaction's state in a topic's transaction buffer."""
        return self._call("transaction_in_buffer_stats", topic, txn_id)

    def transaction_in_pending_ack_stats(
        self, topic: str, subscription: str, txn_id: TxnID | str | int
    ) -> dict:
        """One transaction's acks held on a subscription."""
        return self._call("transaction_in_pending_ack_stats", topic, subscription, txn_id)

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
        return admin_call(self._client, name, wire_args(args))


def admin_call(conn: RemoteClient, name: str, wire: list, held=None) -> Any:
    """One admin call on a broker's connection; one that must run once
    (protocol.ADMIN_ONCE_METHODS) is numbered there (RemoteClient._json_once, `held` by a
    caller that may make it again)."""
    args = {"method": name, "args": wire}
    if name in ADMIN_ONCE_METHODS:
        return conn._json_once("admin", args, held=held)["result"]
    return conn._json("admin", args)["result"]


def wire_args(args) -> list:
    """Admin arguments as JSON: TxnIDs and MessageIds as their text."""
    return [
        str(a) if isinstance(a, TxnID) else format_id(a) if isinstance(a, MessageId) else a
        for a in args
    ]
