"""``client.admin`` on a cluster: each admin call answered by the broker that holds what it
is about (docs/API.md, "Admin and stats")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import errors
from .._native import TxnID
from ..messaging import admin_ops
from ..messaging.topic_name import TopicName
from ..server.protocol import ADMIN_TOPIC_METHODS
from .admin import AdminCalls, admin_call, wire_args
from .calls import HeldNumbers
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
        held = HeldNumbers()
        try:
            return self._route(name, args, held)
        finally:
            held.release()

    def _route(self, name: str, args, held: HeldNumbers) -> Any:
        client = self._client
        wire = wire_args(args)

        def run(conn):
            return admin_call(conn, name, wire, held)

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
        if name == "delete_topic":
            raise errors.InvalidConfiguration(
                "admin.delete_topic() is not offered on a cluster: its metadata is shared"
            )
        if name in _GATHERED and args and isinstance(args[0], str):
            return self._gathered(name, list(args))
        if name in _PER_PARTITION and args and isinstance(args[0], str):
            return self._per_partition(name, args)
        return client._any(run)

    def _at(self, part: str, name: str, args) -> Any:
        """One admin call about partition `part`, at its owner; made again there (its owner
        restarted, say), it carries the number it had (HeldNumbers)."""
        wire = wire_args([part, *args])
        held = HeldNumbers()

        def run(conn):
            return admin_call(conn, name, wire, held)

        try:
            return self._client._follow("partition", part, run)
        finally:
            held.release()

    def _gathered(self, name: str, args: list) -> Any:
        """A call about a subscription of a topic, made partition by partition at each owner
        and put together as one broker with all of them would answer."""
        parts = self._client._partitions(args[0], create=False)
        full = TopicName.parse(args[0]).full
        rest = args[1:]
        if name == "partitioned_stats":
            if (len(parts) == 1 and parts[0] == full) or (rest and not _is_flag(rest[0])):
                return self._at(parts[0], name, rest)  # the broker says why it is refused
            answers = {p: self._at(p, "topic_stats", []) for p in parts}
            out = _sum_stats(full, answers)
            if len(rest) > 0 and rest[0] is True:
                out["per_partition"] = answers
            return out
        position = None
        if name in ("create_subscription", "reset_cursor") and len(rest) > 1:
            position = rest[1]
            if isinstance(position, str) or not _is_int(position):
                position = admin_ops.parse_id(position)
        if position is None or _is_int(position) or position.partition() < 0:
            position = None  # every partition alike: the same argument to each
        elif name == "reset_cursor":
            named = [p for p in parts if TopicName.parse(p).partition_index == position.partition()]
            parts = named or parts[:1]  # the broker refuses a foreign id
        if name == "list_subscriptions":
            return sorted({s for p in parts for s in self._at(p, name, rest)})
        if name in ("skip", "peek"):
            n = rest[1] if len(rest) > 1 else 1
            out: Any = 0 if name == "skip" else []
            for p in parts:
                try:
                    got = self._at(p, name, [rest[0], n - (out if name == "skip" else len(out))])
                except errors.PulsarTxnError as exc:
                    if name == "skip" and out:  # what it skipped stays skipped: say how much
                        raise type(exc)(
                            f"{exc} (this skip had skipped {out} of {n} messages on the "
                            f"partitions before {p})"
                        ) from None
                    raise
                out += got
                if (out if name == "skip" else len(out)) >= n:
                    break
            return out
        if name in ("reset_cursor", "clear_backlog") and len(parts) > 1 and rest:
            self._refuse_held(full, parts, rest[0])
        if name == "create_subscription" and len(parts) > 1 and rest:
            # As one broker: refused where it exists on any partition, before any is made.
            if any(rest[0] in self._at(p, "list_subscriptions", []) for p in parts):
                raise errors.SubscriptionAlreadyExists(
                    f"subscription {errors.excerpt(rest[0])} already exists on {full}"
                )
        answers = {}
        missing = 0
        for p in parts:
            here = rest
            if name == "create_subscription" and position is not None and len(parts) > 1:
                mine = TopicName.parse(p).partition_index == position.partition()
                here = [rest[0], rest[1] if mine else "latest"]
            try:
                answers[p] = self._at(p, name, here)
            except errors.SubscriptionNotFound:
                # As one broker: deleted where it is, not found only if it is nowhere.
                if name != "delete_subscription" or len(parts) == 1:
                    raise
                missing += 1
        if missing == len(parts):
            raise errors.SubscriptionNotFound(
                f"subscription {errors.excerpt(rest[0])} does not exist on {full}"
            )
        if len(parts) == 1 or name not in _IN_STATS:
            return answers.get(parts[0])  # a delete's first partition may have had none
        out = {k: v for k, v in answers[parts[0]].items() if k in ("subscription", "txn_id")}
        out["topic"] = full
        out["partitions"] = {
            p: {k: v for k, v in a.items() if k not in ("topic", "subscription", "txn_id")}
            for p, a in answers.items()
        }
        return out

    def _refuse_held(self, full: str, parts: list, subscription) -> None:
        """As one broker refuses a reset while transactions hold acks on any partition,
        before any moves: TransactionConflict if one holds some now on one of `parts`. (One
        that starts holding meanwhile is refused at its own partition, as before.)"""
        for p in parts:
            try:
                stats = self._at(p, "pending_ack_stats", [subscription])
            except errors.PulsarTxnError:
                continue  # no such subscription there: the reset itself says so
            if stats.get("ongoing_txn_size"):
                raise errors.TransactionConflict(
                    f"cannot reset subscription {errors.excerpt(subscription)} on {full}: "
                    f"open transactions hold acknowledgements on {p}; commit or abort them first"
                )

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
_GATHERED = tuple(m for m in ADMIN_TOPIC_METHODS if m not in _PER_PARTITION)
_IN_STATS = ("transaction_in_buffer_stats", "transaction_in_pending_ack_stats")


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


def _is_flag(value) -> bool:
    return isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
