"""``pulsartxn.Client("pulsartxn://h1:p1,h2:p2")``: the remote client on a broker cluster.

The same API as against one broker (:class:`RemoteClient`). The client keeps one connection
per broker it needs, all in one session (one id, one set of capabilities: a transaction
opened on one broker is used on another with its capability, as the cluster's brokers all
honour it). It looks a topic partition or a coordinator up (which broker owns it), keeps the
answer, and when the owner turns out down, unreachable or not the owner (``NotOwner``: the
lookup redirect), it forgets it and looks it up again with backoff until
``reconnect_timeout_s``, following the new address. Producers and consumers of a partitioned
topic are one per partition, at each partition's owner (:mod:`.cluster_producer`,
:mod:`.cluster_consumer`).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from .. import errors
from .._native import TxnID
from .._native.keywords import strict_class
from ..messaging.consumer import (
    ConsumerType,
    InitialPosition,
    Isolation,
    resolve_subscription_type,
)
from ..messaging.dead_letter import DeadLetterPolicy
from ..messaging.listener import check_listener, start_listener
from ..messaging.message import Message, MessageId
from ..messaging.send_options import BatchingType, CompressionType, check_producer_options
from ..messaging.topic_name import TopicName
from ..txn.transaction import txn_list
from .client import RemoteClient, Shared, _flush_handles
from .cluster_admin import ClusterAdmin
from .cluster_consumer import ClusterConsumer
from .cluster_producer import ClusterProducer
from .cluster_reader import ClusterReader
from .cluster_routing import _BACKOFF_FIRST_S, _BACKOFF_MAX_S, CONNECTION_RETRY_S, ClusterRouting
from .handles import (
    CLOSE_TIMEOUT_S,
    OperationTimedOut,
    RemoteTransaction,
    Unreachable,
    txn_str,
)
from .options import (
    check_client_options,
    check_operation_timeout,
    parse_service_url,
    producer_options,
    subscribe_options,
    tls_roots,
)
from .reader import reader_options
from .spare import Spares

__all__ = ["ClusterAdmin", "ClusterClient", "connect"]

# The longest a new_transaction waits to abort a stale spare elsewhere (_drop_spares).
DROP_SPARE_S = 1.0


def connect(
    service_url: str,
    token: str | None = None,
    reconnect_timeout_s: float = 30.0,
    keepalive_s: float = 1.0,
    tls_trust_certs_file_path: str | None = None,
    operation_timeout_seconds: float = 30,
):
    """What ``pulsartxn.Client(service_url)`` gives: a :class:`ClusterClient` when the broker
    reached (the URL's brokers are tried in turn) is one of a cluster, else the
    :class:`RemoteClient` of that one broker, as before clusters."""
    op_timeout_s = check_operation_timeout(operation_timeout_seconds)
    check_client_options(token, reconnect_timeout_s, keepalive_s)
    tls, hosts = parse_service_url(service_url)
    if len(hosts) == 1:
        client = RemoteClient(
            service_url,
            token,
            reconnect_timeout_s,
            keepalive_s,
            tls_trust_certs_file_path,
            op_timeout_s,
        )
        if not client._in_cluster:
            return client
        client._reconnect_s = min(reconnect_timeout_s, CONNECTION_RETRY_S)
        shared = Shared()
        shared.session = client._session
        shared.capabilities = client._capabilities
        shared.group_capabilities = client._group_capabilities
        shared.deadline = client._deadline
        shared.wait = client._wait
        roots = tls_roots(tls, tls_trust_certs_file_path)
        return ClusterClient(
            service_url, hosts, roots, token, reconnect_timeout_s, keepalive_s, shared, client
        )
    roots = tls_roots(tls, tls_trust_certs_file_path)
    shared = Shared()
    deadline = time.monotonic() + reconnect_timeout_s
    delay = _BACKOFF_FIRST_S
    while True:
        for address in hosts:
            try:
                client = RemoteClient._connection(
                    address,
                    roots,
                    token,
                    min(reconnect_timeout_s, CONNECTION_RETRY_S),
                    keepalive_s,
                    shared,
                    op_timeout_s,
                )
                break
            except (Unreachable, OperationTimedOut) as exc:  # the next one may answer
                last = exc
        else:
            if time.monotonic() + delay > deadline:
                raise errors.BrokerUnavailable(
                    f"no broker of {service_url} could be reached: {last}"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)
            continue
        break
    if not client._in_cluster:
        client._reconnect_s = reconnect_timeout_s  # one broker, as a single-host URL gives
        return client
    return ClusterClient(
        service_url, hosts, roots, token, reconnect_timeout_s, keepalive_s, shared, client
    )


@strict_class
class ClusterClient(ClusterRouting):
    """API.md's client over a cluster of brokers (see the module's docstring). Made by
    :func:`connect`, from the connection to the first broker reached."""

    def __init__(
        self,
        service_url: str,
        hosts: list[str],
        roots,
        token,
        reconnect_timeout_s: float,
        keepalive_s: float,
        shared: Shared,
        first: RemoteClient,
    ) -> None:
        self.service_url = service_url
        self._hosts = list(hosts)
        self._roots = roots
        self._token = token
        self._reconnect_s = reconnect_timeout_s
        self._keepalive_s = keepalive_s
        self._shared = shared
        self._session = shared.session
        self._deadline = shared.deadline  # of the send each thread is making
        self._wait = shared.wait  # what the server may wait for the call each thread makes
        self._op_timeout_s = first._op_timeout_s
        address = first._address
        self._conns: dict[str, RemoteClient] = {address: first}
        self._home = address  # the broker asked what any broker answers
        self._owners: dict[tuple, str] = {}  # (kind, name) -> the owner's address
        self._lock = threading.Lock()
        self._closed = False
        self._closing = False  # close() under way: nothing waits for a broker that is down
        self._retry_count = 0  # calls re-sent after a broker was down or not the owner
        self._round_robin = itertools.count()
        self._spares = Spares()  # transactions begun with the last end, for the next begin
        self._objects: weakref.WeakSet = weakref.WeakSet()  # closed with the client
        try:
            info = first._json("cluster_info", {})
        except BaseException:
            first.close()
            raise
        self._coordinators: int = info["coordinators"]
        for addr in info.get("brokers", {}).values():
            if addr and addr not in self._hosts:
                self._hosts.append(addr)
        self.admin = ClusterAdmin(self)

    # -- API.md ----------------------------------------------------------------------------

    def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        batching_enabled: bool = True,
        batching_max_messages: int | None = None,
        batching_max_allowed_size_in_bytes: int | None = None,
        batching_max_publish_delay_ms: float | None = None,
        send_timeout_millis: int = 30_000,
        block_if_queue_full: bool = False,
        max_pending_messages: int = 1000,
        compression_type: CompressionType = CompressionType.NONE,
        batching_type: BatchingType = BatchingType.Default,
        chunking_enabled: bool = False,
    ) -> ClusterProducer:
        """A producer on `topic` (API.md, "Producing")."""
        check_producer_options(
            send_timeout_millis,
            block_if_queue_full,
            max_pending_messages,
            compression_type,
            batching_type,
            chunking_enabled,
        )
        self._check_open()
        options = producer_options(
            batching_enabled,
            batching_max_messages,
            batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms,
        )
        full = TopicName.parse(topic).full if isinstance(topic, str) else topic
        p = ClusterProducer(
            self, full, self._partitions(topic), producer_name, options, send_timeout_millis
        )
        self._objects.add(p)
        return p

    def subscribe(
        self,
        topic: str,
        subscription_name: str,
        subscription_type: ConsumerType | None = None,
        initial_position: InitialPosition = InitialPosition.Latest,
        isolation: Isolation = Isolation.READ_COMMITTED,
        consumer_name: str | None = None,
        negative_ack_redelivery_delay_ms: int = 60_000,
        receiver_queue_size: int | None = None,
        unacked_messages_timeout_ms: int | None = None,
        dead_letter_policy: DeadLetterPolicy | None = None,
        consumer_type: ConsumerType | None = None,
        message_listener: Callable[[Any, Message], None] | None = None,
    ) -> ClusterConsumer:
        """A consumer (API.md, "Consuming"); `consumer_type` is pulsar-client's name of
        `subscription_type`, `message_listener(consumer, message)` runs on a listener thread."""
        subscription_type = resolve_subscription_type(subscription_type, consumer_type)
        check_listener(message_listener)
        self._check_open()
        opts = subscribe_options(
            subscription_type,
            initial_position,
            isolation,
            consumer_name,
            negative_ack_redelivery_delay_ms,
            receiver_queue_size,
            unacked_messages_timeout_ms,
            dead_letter_policy,
        )
        full = TopicName.parse(topic).full if isinstance(topic, str) else topic
        c = ClusterConsumer(self, full, self._partitions(topic), subscription_name, opts)
        self._objects.add(c)
        if message_listener is not None:
            start_listener(c, message_listener)
        return c

    def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        reader_listener: Callable[[Any, Message], None] | None = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        start_message_id_inclusive: bool = False,
        isolation: Isolation = Isolation.READ_COMMITTED,
    ) -> ClusterReader:
        """A reader per partition at its owner, merged (see cluster_reader.py)."""
        self._check_open()
        opts = reader_options(
            start_message_id,
            reader_listener,
            receiver_queue_size,
            reader_name,
            subscription_role_prefix,
            is_read_compacted,
            start_message_id_inclusive,
            isolation,
        )
        full = TopicName.parse(topic).full if isinstance(topic, str) else topic
        parts = self._partitions(topic)
        r = ClusterReader(self, full, parts, start_message_id, opts, reader_listener)
        self._objects.add(r)
        return r

    def get_topic_partitions(self, topic: str) -> list[str]:
        """The full names of a topic's partitions, as pulsar-client's."""
        return self.topic_partitions(topic)

    def new_transaction(
        self,
        timeout_ms: int | None = None,
        coordinator_id: int | None = None,
        group: str | None = None,
        group_capability: str | None = None,
    ) -> RemoteTransaction:
        """A transaction of this session, on coordinator `coordinator_id`, else the group's
        (all of a group's transactions live on one coordinator), else the next in turn."""
        self._check_open()
        if group is None:
            spare, stale = self._spares.take((timeout_ms, coordinator_id), 0)
            self._drop_spares(stale, self._spares.lost())
            if spare is not None:
                txn_id = TxnID.parse(spare[0])
                route = self._coordinator(txn_id.coordinator_id)
                return RemoteTransaction(route, txn_id, capability=spare[1])
        if coordinator_id is None:
            if group is not None:
                coordinator_id = self._group_coordinator(group)
            else:
                coordinator_id = next(self._round_robin) % self._coordinators
        if group_capability is None and group is not None:
            group_capability = self._shared.group_capabilities.get(group)
        route = self._coordinator(coordinator_id)
        out = route._json(
            "new_transaction",
            {
                "timeout_ms": timeout_ms,
                "coordinator_id": coordinator_id,
                "group": group,
                "group_capability": group_capability,
            },
        )
        if group is not None and out.get("group_capability"):
            self._shared.group_capabilities[group] = out["group_capability"]
        self._shared.capabilities[out["txn"]] = out["capability"]
        return RemoteTransaction(route, TxnID.parse(out["txn"]), capability=out["capability"])

    def _ended(self, kind: tuple | None, spare: dict | None, txn: str, answered: bool) -> None:
        """An end returned or failed, with the spare it began at its coordinator's broker (one
        on that broker: the next transaction's coordinator is the broker's own, not the next
        in turn; the client's sessions at every broker are one, so a restarted broker's is
        kept, and found unknown at its first use, as a begin made just before the restart)."""
        if spare is not None:
            self._shared.capabilities[spare["txn"]] = spare["capability"]
        self._spares.ended(kind, spare, 0, txn, answered)

    def _drop_spares(self, stale: list[str], lost: list[str]) -> None:
        """Abort the spares not taken in time (`stale`), each at its coordinator's owner, and
        those begun with ends whose answer never came (`lost`), at the broker that ran each
        end: its transaction's coordinator's owner, which remembers the spare it began
        (there is no begin there to name them in). Each call waits DROP_SPARE_S at most: if
        that broker is away, their own timeout ends them, and the begin that follows does
        not wait for the broker."""
        lost_at: dict[int, list[str]] = {}  # coordinator -> the ends it ran
        for ended in lost:
            lost_at.setdefault(TxnID.parse(ended).coordinator_id, []).append(ended)
        calls = [
            (
                TxnID.parse(key).coordinator_id,
                "end",
                {"txn": key, "capability": self._capability_of(key), "commit": False},
            )
            for key in stale
        ]
        calls += [
            (coordinator, "drop_spares", {"lost": ends}) for coordinator, ends in lost_at.items()
        ]
        for coordinator, action, args in calls:
            try:
                with self._deadline.until(time.monotonic() + DROP_SPARE_S):
                    self._coordinator(coordinator)._json(action, args)
            except errors.PulsarTxnError:
                pass  # it ended already, or its broker does not answer in time

    def group_capability(self, group: str, capability: str | None = None) -> str:
        """As RemoteClient.group_capability, at the group's coordinator."""
        route = self._coordinator(self._group_coordinator(group))
        return route.call(lambda c: c.group_capability(group, capability))

    def transaction(
        self, txn_id: TxnID | str | int, capability: str | None = None
    ) -> RemoteTransaction:
        """A handle on a transaction by id (at its coordinator's owner); one of another
        session needs its `capability` to be used or ended."""
        self._check_open()
        key = txn_str(txn_id)
        if capability is not None:
            self._shared.capabilities[key] = capability
        tid = TxnID.parse(key)
        t = RemoteTransaction(
            self._coordinator(tid.coordinator_id),
            tid,
            counted=False,
            capability=self._capability_of(key),
        )
        t.state  # noqa: B018 - TransactionNotFound / CoordinatorNotFound now
        return t

    def commit_all(self, txns: Iterable[RemoteTransaction | TxnID]) -> None:
        """One decision over transactions of coordinators that one broker owns; across
        brokers it could not be atomic, and is refused."""
        self._check_open()
        txns = txn_list("txns", txns)
        keys = [txn_str(t) for t in txns]
        coordinators = sorted({TxnID.parse(k).coordinator_id for k in keys})
        if not coordinators:
            self._any(lambda c: c.commit_all([]))
            return
        owners = {c: self._owner("coordinator", c) for c in coordinators}
        if len(set(owners.values())) > 1:
            raise errors.InvalidConfiguration(
                "commit_all over transactions whose coordinators are on different brokers "
                f"({', '.join(f'coordinator {c}: {a}' for c, a in owners.items())}) could not "
                "be atomic: open them on one coordinator (coordinator_id=, or one group), or "
                "commit them one by one"
            )
        _flush_handles(txns, self._shared.streams)
        route = self._coordinator(coordinators[0])
        with self._wait.allow("decide", None):
            route._json(
                "commit_all",
                {"txns": keys, "capabilities": [self._capability_of(k) for k in keys]},
            )

    def commit_group(
        self,
        group: str,
        winners: Iterable[RemoteTransaction | TxnID],
        idempotency_key: tuple[str, int] | None = None,
        group_capability: str | None = None,
    ) -> dict:
        self._check_open()
        winners = txn_list("winners", winners)
        route = self._coordinator(self._group_coordinator(group))
        return route.call(
            lambda c: c.commit_group(group, winners, idempotency_key, group_capability)
        )

    def abort_group(self, group: str, group_capability: str | None = None) -> dict:
        self._check_open()
        route = self._coordinator(self._group_coordinator(group))
        return route.call(lambda c: c.abort_group(group, group_capability))

    def scan(
        self, topic: str, start: int | MessageId | None = None, end: int | MessageId | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Every partition of `topic` from its owner, in partition order."""
        self._check_open()
        for partition in self._partitions(topic, create=False):
            reader, first = self._follow("partition", partition, _opener(partition, start, end))
            if first is None:
                continue
            yield first
            yield from reader

    def create_topic(self, topic: str, partitions: int = 0) -> None:
        self._check_open()
        # One name for every broker it is sent to: one that made it and could not answer.
        create_id = uuid.uuid4().hex
        self._any(lambda c: c._create_topic(topic, partitions, create_id, self._reconnect_s))

    def topic_partitions(self, topic: str) -> list[str]:
        self._check_open()
        return self._any(lambda c: c.topic_partitions(topic))

    def close(self) -> None:
        """Closes its producers (what they hold is sent, to brokers that answer: one that is
        down is not waited for) and consumers, then every connection: all within
        CLOSE_TIMEOUT_S, each call made once."""
        if self._closing:
            return
        self._closing = True
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn._closing.set()
        with self._deadline.until(time.monotonic() + CLOSE_TIMEOUT_S):
            for obj in list(self._objects):
                try:
                    obj.close()
                except errors.PulsarTxnError:
                    pass
            self._objects.clear()
            with self._lock:
                self._closed = True
                conns = list(self._conns.values())
            for conn in conns:
                conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterClient({self.service_url!r})"


def _opener(partition: str, start, end):
    """A scan of one partition opened on a connection: (the rest, its first batch); what a
    broker refuses before the first batch (NotOwner, down) is followed."""

    def open_(conn):
        reader = conn.scan(partition, start, end)
        return reader, next(reader, None)

    return open_
