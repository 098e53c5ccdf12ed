"""Admin and stats (API.md, "Admin and stats")."""

from __future__ import annotations

import contextlib
import functools

from ._native import TxnID
from ._native.keywords import strict_class
from .errors import (
    ConsumerBusy,
    InvalidConfiguration,
    InvalidTopicName,
    ProducerBusy,
    PulsarTxnError,
    SubscriptionAlreadyExists,
    SubscriptionNotFound,
    TopicNotFound,
    TransactionConflict,
    excerpt,
)
from .messaging import admin_ops, positions
from .messaging.message import MessageId
from .messaging.once import OnceCall
from .messaging.topic_name import TopicName, check_keyed_name
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

    def partitioned_stats(self, topic: str, per_partition: bool = False) -> dict:
        """topic_stats of a partitioned topic (TopicNotFound for another), with each
        partition's own under "per_partition" when asked, as pulsar-admin's."""
        _check_flag("per_partition", per_partition)
        self._broker.check_open()
        full, partitions = self._broker.topics.resolve(topic, create=False)
        if partitions[0].index < 0 or full != partitions[0].name.base.full:
            raise TopicNotFound(f"{full} is not a partitioned topic")
        out = self.topic_stats(full)
        if per_partition:
            out["per_partition"] = {p.topic: self.topic_stats(p.topic) for p in partitions}
        return out

    # -- topics and subscriptions (pulsar-admin's "topics" group) -----------------------------

    def list_topics(self) -> list[dict]:
        """Every topic by name, ``{"topic", "partitions"}``: a partitioned one once, with its
        partition count, and each non-partitioned one with 0 (partitions are not listed)."""
        self._broker.check_open()
        return [{"topic": t, "partitions": n} for t, n in self._broker.topics.listing()]

    def delete_topic(self, topic: str, force: bool = False) -> None:
        """Delete a topic, its messages and subscriptions, durably. Refused while an open
        transaction has written to it or holds acks on it (even with force); refused while
        producers, consumers or readers are connected unless force, which closes them."""
        self._delete_topic(topic, force)

    def _delete_topic(self, topic: str, force: bool = False, once: OnceCall | None = None):
        """delete_topic, as call `once` (messaging/once.py) if given."""
        _check_flag("force", force)
        self._broker.check_open()
        topics = self._broker.topics
        with topics.lock:
            if once is not None and once.done(TopicName.parse(topic).full)[0]:
                return
            full, parts = topics.resolve(topic, create=False)
            if full not in dict(topics.listing()):
                raise InvalidTopicName(f"{full} names a partition; delete its topic instead")
            _check_no_txns(f"delete {full}", parts)
            producers = {p for part in parts for p in part.producers.values()}
            consumers = {
                c
                for part in parts
                for sub in [*part.subscriptions.values(), *part.readers.values()]
                for c in list(sub.consumers)
            }
            if (producers or consumers) and not force:
                error = ProducerBusy if producers else ConsumerBusy
                raise error(
                    f"cannot delete {full}: {len(producers)} producers and {len(consumers)} "
                    "consumers or readers are connected (force=True closes them)"
                )
            for handle in [*producers, *consumers]:
                handle.close()
            _check_no_txns(f"delete {full}", parts)  # a closed producer's last batch
            topics.remove(full, parts, None if once is None else once.rider(full, None))

    def list_subscriptions(self, topic: str) -> list[str]:
        """The names of a topic's durable subscriptions (readers' are not), sorted."""
        self._broker.check_open()
        _, parts = self._broker.topics.resolve(topic, create=False)
        return sorted({name for part in parts for name in list(part.subscriptions)})

    def create_subscription(
        self, topic: str, subscription: str, position: MessageId | str = "latest"
    ) -> None:
        """Create a durable subscription at "latest", "earliest" or a message id (its
        partition from that message on, any other from the latest)."""
        self._create_subscription(topic, subscription, position)

    def _create_subscription(self, topic, subscription, position="latest", once=None) -> None:
        """create_subscription, as call `once` (messaging/once.py) if given: partitions it
        created the subscription on before are left as they are."""
        self._broker.check_open()
        topics = self._broker.topics
        start = admin_ops.parse_id(position)
        with topics.lock:
            full, parts = topics.resolve(topic, create=False)
            check_keyed_name("subscription", subscription, [p.topic for p in parts])
            left = [p for p in parts if once is None or not once.done(p.topic)[0]]
            if any(subscription in part.subscriptions for part in left):
                raise SubscriptionAlreadyExists(
                    f"subscription {excerpt(subscription)} already exists on {full}"
                )
            topics.room_for_subscription(left, subscription)
            named = None
            if not positions.is_everywhere(start):
                named = positions.partition_of(start, parts, full)
            starts = [
                positions.start_of(p, start if named in (None, p) else MessageId.latest)
                for p in left
            ]
            for part, (mark, partial) in zip(left, starts):
                rider = None if once is None else once.rider(part.topic, None)
                topics.subscription(
                    part, subscription, False, at=mark, rider=rider, partial=partial
                )

    def delete_subscription(self, topic: str, subscription: str, force: bool = False) -> None:
        """Delete a subscription, durably: refused while transactions hold acks on it (even
        with force), and while consumers are connected unless force, which closes them."""
        self._delete_subscription(topic, subscription, force)

    def _delete_subscription(self, topic, subscription, force=False, once=None) -> None:
        """delete_subscription, as call `once` (messaging/once.py) if given: partitions it
        deleted the subscription on before are left as they are."""
        _check_flag("force", force)
        self._broker.check_open()
        topics = self._broker.topics
        with topics.lock:
            full, subs, _ = self._subs(topic, subscription, once)
            if not subs:
                return  # this call deleted it everywhere before
            with contextlib.ExitStack() as locks:
                for sub in subs:
                    locks.enter_context(sub.lock)
                _check_no_txns(f"delete subscription {subscription!r} on {full}", [], subs)
                consumers = {c for sub in subs for c in sub.consumers}
                if consumers and not force:
                    raise ConsumerBusy(
                        f"subscription {excerpt(subscription)} on {full} has {len(consumers)} "
                        "consumers connected (force=True closes them)"
                    )
                for sub in subs:
                    sub.unsubscribed = True  # acks refused from here on
            for consumer in consumers:
                consumer.close()
            for sub in subs:
                topics.delete(sub, None if once is None else once.rider(sub.partition.topic, None))

    def reset_cursor(self, topic: str, subscription: str, position: MessageId | str | int) -> None:
        """Move a subscription as ``consumer.seek``: to a message id (that message comes
        again), or a publish time in ms; refused while transactions hold acks on it."""
        if not isinstance(position, str):
            positions.check_position(position)
        target = admin_ops.parse_id(position) if isinstance(position, str) else position
        self._broker.check_open()
        full, subs, _ = self._subs(topic, subscription)
        if not positions.is_everywhere(target):
            part = positions.partition_of(target, [s.partition for s in subs], full)
            subs = [s for s in subs if s.partition is part]
        positions.reset(subs, [positions.start_of(s.partition, target) for s in subs])
        for sub in subs:
            for consumer in list(sub.consumers):
                consumer._wake()

    def skip(self, topic: str, subscription: str, n: int) -> int:
        """Acknowledge the next n messages a consumer would get (fewer at the end), durably;
        how many were skipped."""
        return self._skip(topic, subscription, n)

    def _skip(self, topic: str, subscription: str, n: int, once: OnceCall | None = None) -> int:
        """skip, as call `once` (messaging/once.py) if given: a partition it skipped on
        before counts what it skipped there then, and is not skipped on again."""
        admin_ops.check_count(n)
        self._broker.check_open()
        _, subs, skipped = self._subs(topic, subscription, once)
        done = sum(skipped)  # what this call skipped before, on partitions it reached
        for sub in subs:
            if done == n:
                break
            memo = None if once is None else functools.partial(once.rider, sub.partition.topic)
            done += admin_ops.skip(sub, n - done, memo)
        return done

    def clear_backlog(self, topic: str, subscription: str) -> None:
        """Acknowledge every message readable now (those of open transactions stay), as a
        seek to the end; refused while transactions hold acks on it."""
        self._broker.check_open()
        subs = self._subs(topic, subscription)[1]
        positions.reset(subs, [(s.partition.dispatch_end(True) - 1, None) for s in subs])

    def peek(self, topic: str, subscription: str, n: int = 1) -> list[dict]:
        """The next n committed messages a consumer would get (partition by partition), without
        moving the subscription: message_id (text), topic, publish_time, key, properties and
        payload (base64)."""
        admin_ops.check_count(n)
        self._broker.check_open()
        out: list[dict] = []
        for sub in self._subs(topic, subscription)[1]:
            out += admin_ops.peek(sub, n - len(out))
            if len(out) == n:
                break
        return out

    def _subs(self, topic: str, subscription: str, once=None) -> tuple[str, list, list]:
        """A topic's full name, its partitions' subscriptions named `subscription`, and what
        call `once` (if given) did on the partitions it has taken effect on, which are left
        out of the subscriptions (none is then no error if it did anything)."""
        if not isinstance(subscription, str):
            raise TypeError(f"subscription must be a str, not {excerpt(subscription)}")
        full, parts = self._broker.topics.resolve(topic, create=False)
        subs: list = []
        did: list = []
        for p in parts:
            done, what = (False, None) if once is None else once.done(p.topic)
            if done:
                did.append(what)
            elif subscription in p.subscriptions:
                subs.append(p.subscriptions[subscription])
        if not subs and not did:
            raise SubscriptionNotFound(
                f"subscription {excerpt(subscription)} does not exist on {full}"
            )
        return full, subs, did

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

    def transaction_in_buffer_stats(self, topic: str, txn_id: TxnID | str | int) -> dict:
        """One transaction in a partition's transaction buffer: "ongoing" (with the first
        entry it wrote, start_position), "committed", "aborted" or "unknown" (none here, or
        forgotten); per partition for a partitioned topic."""
        self._broker.check_open()
        tid = as_txn_id(txn_id)
        full, partitions = self._broker.topics.resolve(topic, create=False)
        per = {p.topic: _in_buffer(p.buffer, tid) for p in partitions}
        if len(partitions) == 1:
            return {"topic": full, "txn_id": str(tid), **per[full]}
        return {"topic": full, "txn_id": str(tid), "partitions": per}

    def transaction_in_pending_ack_stats(
        self, topic: str, subscription: str, txn_id: TxnID | str | int
    ) -> dict:
        """One transaction's acks held on a subscription: its cumulative ack position (or
        None) and the entries its individual acks hold; per partition when partitioned."""
        self._broker.check_open()
        tid = as_txn_id(txn_id)
        full, subs, _ = self._subs(topic, subscription)
        per = {s.partition.topic: _in_pending_ack(s, tid) for s in subs}
        out = {"topic": full, "subscription": subscription, "txn_id": str(tid)}
        if len(subs) == 1 and subs[0].partition.topic == full:
            return {**out, **per[full]}
        return {**out, "partitions": per}

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


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {excerpt(value)}")


def _check_no_txns(what: str, parts: list, subs: list = ()) -> None:
    """TransactionConflict while an open transaction has written to `parts` or holds acks
    on `subs` (every subscription of `parts` too)."""
    subs = [*subs, *(s for p in parts for s in list(p.subscriptions.values()))]
    held: set = set()
    for part in parts:
        with part.lock:
            held.update(part.buffer.ongoing, part.buffer.inflight)
    for sub in subs:
        held |= sub.ack_holders()
    if held:
        named = ", ".join(str(t) for t in sorted(held)[:5])
        raise TransactionConflict(
            f"cannot {what}: open transactions {named} wrote to it or hold "
            "acknowledgements on it; commit or abort them first"
        )


def _in_buffer(buffer, tid: TxnID) -> dict:
    with buffer.lock:
        start = buffer.ongoing.get(tid)
        if start is not None or tid in buffer.inflight:
            state = "ongoing"
        elif tid in buffer.aborts:
            state = "aborted"
        elif tid in buffer.ended:
            state = "committed" if buffer.ended[tid] else "aborted"
        else:
            state = "unknown"
    return {"state": state, "start_position": start, "aborted": state == "aborted"}


def _in_pending_ack(sub, tid: TxnID) -> dict:
    pending = sub.pending_ack
    with pending.lock:
        cumulative = pending.cumulative.get(tid)
        entries = pending.index.entries_of(tid) if tid in pending.index.transactions() else []
    held = [f"{e}:{-1 if acks is None else ','.join(map(str, acks))}" for _, e, acks in entries]
    return {
        "cumulative_ack_position": None
        if cumulative is None
        else f"{cumulative[0]}:{cumulative[1]}",
        "held_entries": len(entries),
        "held": held[:100],
    }


def _standalone(call: str) -> InvalidConfiguration:
    return InvalidConfiguration(
        f"admin.{call}() needs a broker cluster (docs/cluster.md); this broker is standalone"
    )
