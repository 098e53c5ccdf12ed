"""``pulsartxn.Client("pulsartxn://host:port")``: API.md's client over Arrow Flight.

The client opens a session (a random id) and keeps it alive; if the broker restarts, calls
are retried with backoff until it is back (up to ``reconnect_timeout_s``, or a send's
``send_timeout_millis``), the session is opened again and producers and consumers are
re-created under the same names. Every message is sent with an explicit sequence id, so a
re-sent produce is stored once (de-duplication by producer name and sequence id).
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

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
from ..server import protocol
from ..server.protocol import frame
from ..txn.transaction import txn_list
from .admin import RemoteAdmin
from .batch_stream import OpenStreams
from .bounded import bounded_chunks
from .calls import SERVER_MAX_WAIT_MS, SERVER_OPERATION_TIMEOUT_MS, Calls
from .consumer import RemoteConsumer
from .handles import (
    CLOSE_TIMEOUT_S,
    DeliveringCalls,
    RemoteTransaction,
    SendDeadline,
    ServerWait,
    Unreachable,
    txn_str,
    unreachable,
)
from .options import (
    check_operation_timeout,
    parse_service_url,
    producer_options,
    subscribe_options,
    tls_roots,
)
from .producer import RemoteProducer
from .reader import RemoteReader, reader_options
from .session import SessionGate
from .spare import Spares

__all__ = ["RemoteClient", "Shared", "parse_service_url"]

# The least time between two new channels to one broker (RemoteClient._channel_lost).
CHANNEL_RENEW_S = 0.05


class Shared:
    """What every connection of one client shares: the session id (each broker keeps the
    session of that id), the capabilities of the transactions and groups it holds, and the
    deadline of the send each thread is making, and what the server may wait for the call
    each thread is making."""

    def __init__(self) -> None:
        self.session = uuid.uuid4().hex
        self.capabilities: dict[str, str] = {}
        self.group_capabilities: dict[str, str] = {}
        self.deadline = SendDeadline()
        self.wait = ServerWait()
        self.streams = OpenStreams()


def _flush_handles(txns, streams: OpenStreams) -> None:
    """What the client still holds of each transaction lands before a decision commits them
    (handles' queued sends, the open batch streams of any, named by handle or by id); one
    with a send that timed out, or a bulk send or stream that failed, refuses it
    (InvalidTxnStatus, nothing decided)."""
    for t in txns:
        if isinstance(t, RemoteTransaction):
            t._flush_for_commit()
            t._check_committable()
            continue
        error = streams.close_for_commit(txn_str(t))
        if error is not None:
            raise errors.InvalidTxnStatus(
                f"transaction {txn_str(t)} cannot commit: a bulk send of it failed "
                f"({error}); abort it"
            ) from error


@strict_class
class RemoteClient(Calls, SessionGate):
    def __init__(
        self,
        service_url: str,
        token: str | None = None,
        reconnect_timeout_s: float = 30.0,
        keepalive_s: float = 1.0,
        tls_trust_certs_file_path: str | None = None,
        operation_timeout_seconds: float = 30,
    ) -> None:
        """``pulsartxn://host:port``, or ``pulsartxn+ssl://host:port`` (TLS: the server's
        certificate is checked against `tls_trust_certs_file_path`, a PEM file, else against
        the system's roots), as Pulsar's ``pulsar+ssl://``. A call the broker does not answer
        ends with Timeout after `operation_timeout_seconds` (plus what the server may wait
        for it: a receive's timeout, a commit's), as pulsar-client's."""
        op_timeout_s = check_operation_timeout(operation_timeout_seconds)
        tls, hosts = parse_service_url(service_url)
        if len(hosts) != 1:
            raise ValueError(
                f"service_url must be pulsartxn://host:port or pulsartxn+ssl://host:port, "
                f"not {service_url!r}"
            )
        self._connect(
            service_url,
            hosts[0],
            tls_roots(tls, tls_trust_certs_file_path),
            token,
            reconnect_timeout_s,
            keepalive_s,
            Shared(),
            op_timeout_s,
        )

    @classmethod
    def _connection(
        cls,
        address: str,
        roots,
        token,
        reconnect_timeout_s,
        keepalive_s,
        shared: Shared,
        op_timeout_s: float = 30.0,
    ) -> RemoteClient:
        """One broker of a cluster: its own connection and keepalive, in the session (id and
        capabilities) `shared` with the cluster client's other brokers. `roots`: None for
        plain gRPC, else the TLS roots (b"" for the system's)."""
        self = cls.__new__(cls)
        scheme = "pulsartxn" if roots is None else "pulsartxn+ssl"
        self._connect(
            f"{scheme}://{address}",
            address,
            roots,
            token,
            reconnect_timeout_s,
            keepalive_s,
            shared,
            op_timeout_s,
        )
        return self

    def _connect(
        self,
        service_url,
        address,
        roots,
        token,
        reconnect_timeout_s,
        keepalive_s,
        shared,
        op_timeout_s,
    ) -> None:
        self.service_url = service_url
        self._address, self._roots = address, roots
        self._channel_lock = threading.Lock()
        self._flight = self._new_channel()
        headers = [(b"authorization", b"Bearer " + token.encode())] if token else []
        self._headers = headers
        self._options = flight.FlightCallOptions(headers=headers)
        self._session = shared.session
        self._streams = shared.streams
        self._deadline = shared.deadline
        self._wait = shared.wait
        self._op_timeout_s = op_timeout_s
        self._op_options = flight.FlightCallOptions(headers=headers, timeout=op_timeout_s)
        # The longest this broker waits for a receive and for a decision (its hello says).
        self._max_wait_s = SERVER_MAX_WAIT_MS / 1000.0
        self._decide_s = SERVER_OPERATION_TIMEOUT_MS / 1000.0
        self._retries = 0  # calls re-sent after the broker was unreachable
        self._once = DeliveringCalls()  # numbers of the calls that must run once
        self._cancels: list[str] = []  # creates not answered in time, to cancel (Calls._create)
        self._cancels_lock = threading.Lock()
        self._reconnect_s = reconnect_timeout_s
        self._closed = False
        self._closing = threading.Event()  # calls to the broker are no longer retried
        self._close_begun = False
        self._init_gate()
        self._objects: weakref.WeakSet = weakref.WeakSet()
        self._capabilities = shared.capabilities  # TxnID string -> its capability
        self._group_capabilities = shared.group_capabilities  # group label -> its capability
        self._in_cluster = False  # the broker said it is one of a cluster
        self._spares = Spares()  # transactions begun with the last end, for the next begin
        try:
            self._hello()
        except BaseException:
            self._flight.close()  # refused (a token, the server's session limit): nothing kept
            raise
        self.admin = RemoteAdmin(self)
        self._stop = threading.Event()
        self._keepalive = threading.Thread(
            target=self._keep_alive, args=(keepalive_s,), name="pulsartxn-keepalive", daemon=True
        )
        self._keepalive.start()

    def _new_channel(self) -> flight.FlightClient:
        self._channel_at = time.monotonic()
        if self._roots is not None:
            return flight.FlightClient(
                f"grpc+tls://{self._address}", tls_root_certs=self._roots or None
            )
        return flight.FlightClient(f"grpc://{self._address}")

    def _channel_lost(self) -> None:
        """A call found the broker unreachable: the next calls go through a new channel. On
        gRPC's older poller (server/protocol.py) a channel that failed waits out its reconnect
        backoff, seconds after the broker is back; a new one connects at once. At most one a
        CHANNEL_RENEW_S: the calls failing together renew it once."""
        if self._closing.is_set() or time.monotonic() - self._channel_at < CHANNEL_RENEW_S:
            return
        with self._channel_lock:
            if time.monotonic() - self._channel_at >= CHANNEL_RENEW_S:
                self._flight = self._new_channel()  # the old one closes once no call holds it

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
    ) -> RemoteProducer:
        """A producer on `topic` (API.md, "Producing")."""
        check_producer_options(
            send_timeout_millis,
            block_if_queue_full,
            max_pending_messages,
            compression_type,
            batching_type,
            chunking_enabled,
        )
        options = producer_options(
            batching_enabled,
            batching_max_messages,
            batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms,
        )
        p = RemoteProducer(self, topic, producer_name, options, send_timeout_millis)
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
    ) -> RemoteConsumer:
        """A consumer (API.md, "Consuming"); `consumer_type` is pulsar-client's name of
        `subscription_type`, `message_listener(consumer, message)` runs on a listener thread."""
        subscription_type = resolve_subscription_type(subscription_type, consumer_type)
        check_listener(message_listener)
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
        c = RemoteConsumer(self, topic, subscription_name, opts)
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
    ) -> RemoteReader:
        """As the embedded client's create_reader; a listener runs in this process."""
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
        r = RemoteReader(self, topic, start_message_id, opts, reader_listener)
        self._objects.add(r)
        return r

    def get_topic_partitions(self, topic: str) -> list[str]:
        """The full names of a topic's partitions, as pulsar-client's."""
        return self.topic_partitions(topic)

    def _capability_of(self, txn: str | None) -> str | None:
        return None if txn is None else self._capabilities.get(txn)

    def new_transaction(
        self,
        timeout_ms: int | None = None,
        coordinator_id: int | None = None,
        group: str | None = None,
        group_capability: str | None = None,
    ) -> RemoteTransaction:
        """A transaction of this session. Another session uses or ends it only with its
        ``capability``; joining a group another session holds needs ``group_capability``."""
        if group_capability is None and group is not None:
            group_capability = self._group_capabilities.get(group)
        stale: list[str] = []
        if group is None:
            spare, stale = self._spares.take((timeout_ms, coordinator_id), self._generation)
            if spare is not None:
                self._spares.unsent(stale, [])  # no call: the next begin names them
                return RemoteTransaction(self, TxnID.parse(spare[0]), capability=spare[1])
        else:
            stale = self._spares.dropped()
        lost = self._spares.lost()
        try:
            out = self._json(
                "new_transaction",
                {
                    "timeout_ms": timeout_ms,
                    "coordinator_id": coordinator_id,
                    "group": group,
                    "group_capability": group_capability,
                    "drop": stale,
                    "lost": lost,
                },
            )
        except BaseException:
            self._spares.unsent(stale, lost)  # named again (a repeat drops nothing twice)
            raise
        if group is not None and out.get("group_capability"):
            self._group_capabilities[group] = out["group_capability"]
        self._capabilities[out["txn"]] = out["capability"]
        return RemoteTransaction(self, TxnID.parse(out["txn"]), capability=out["capability"])

    def _ended(self, kind: tuple | None, spare: dict | None, txn: str, answered: bool) -> None:
        """An end of a transaction returned or failed, with the spare it began
        (remote/spare.py)."""
        if spare is not None:
            self._capabilities[spare["txn"]] = spare["capability"]
        self._spares.ended(kind, spare, self._generation, txn, answered)

    def group_capability(self, group: str, capability: str | None = None) -> str:
        """The secret that lets a session decide group `group` (``commit_group``,
        ``abort_group``) and open transactions in it once others have: this session's if it
        holds it, else the label's while no one else does (hand it to the other sessions that
        are to join or decide it). With `capability`, that one is checked and kept."""
        out = self._json("group_capability", {"group": group, "capability": capability})
        self._group_capabilities[group] = out["capability"]
        return out["capability"]

    def transaction(
        self, txn_id: TxnID | str | int, capability: str | None = None
    ) -> RemoteTransaction:
        """A handle on a transaction by id; one of another session needs its `capability`
        to be used or ended (its state can always be read)."""
        key = txn_str(txn_id)
        if capability is not None:
            self._capabilities[key] = capability
        t = RemoteTransaction(
            self, TxnID.parse(key), counted=False, capability=self._capability_of(key)
        )
        t.state  # noqa: B018 - TransactionNotFound / CoordinatorNotFound now
        return t

    def commit_all(self, txns: Iterable[RemoteTransaction | TxnID]) -> None:
        txns = txn_list("txns", txns)
        _flush_handles(txns, self._streams)
        keys = [txn_str(t) for t in txns]
        with self._wait.allow("decide", None):
            self._json(
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
        winners = txn_list("winners", winners)
        _flush_handles(winners, self._streams)
        with self._wait.allow("decide", None):
            out = self._json(
                "commit_group",
                {
                    "group": group,
                    "winners": [txn_str(t) for t in winners],
                    "idempotency_key": list(idempotency_key) if idempotency_key else None,
                    "group_capability": group_capability or self._group_capabilities.get(group),
                },
            )
        out["committed"] = [TxnID.parse(t) for t in out["committed"]]
        out["aborted"] = [TxnID.parse(t) for t in out["aborted"]]
        return out

    def abort_group(self, group: str, group_capability: str | None = None) -> dict:
        with self._wait.allow("decide", None):
            out = self._json(
                "abort_group",
                {
                    "group": group,
                    "group_capability": group_capability or self._group_capabilities.get(group),
                },
            )
        out["aborted"] = [TxnID.parse(t) for t in out["aborted"]]
        out["committed"] = [TxnID.parse(t) for t in out["committed"]]
        return out

    def scan(
        self, topic: str, start: int | MessageId | None = None, end: int | MessageId | None = None
    ) -> Iterator[pa.RecordBatch]:
        def bound(b):
            return b.serialize().hex() if isinstance(b, MessageId) else b

        ticket = frame(
            {
                "op": "scan",
                "topic": topic,
                "start": bound(start),
                "end": bound(end),
                "session": self._session,
            }
        )
        try:
            for chunk in bounded_chunks(
                lambda: self._flight.do_get(flight.Ticket(ticket), self._options),
                self._op_timeout_s,
                lambda: self._timed_out("scan"),
            ):
                yield chunk.data
        except flight.FlightUnavailableError as exc:
            raise unreachable(self, exc) from None
        except flight.FlightError as exc:
            raise protocol.from_flight_error(exc) from None

    def create_topic(self, topic: str, partitions: int = 0) -> None:
        self._create_topic(topic, partitions, uuid.uuid4().hex)

    def _create_topic(
        self, topic: str, partitions: int, create_id: str, retry_s: float | None = None
    ) -> None:
        """The create named `create_id`: re-sent after its answer was lost (a broker
        restart, a dropped connection), it finds the topic it made and succeeds. So is one
        the broker answered BrokerUnavailable (a cluster's ZooKeeper out of its reach: the
        topic may be recorded there all the same), within `retry_s` (reconnect_timeout_s; a
        cluster client's own for its connections); a caller's own retry would be a new call,
        and TopicAlreadyExists if the first had gone through."""
        args = {"topic": topic, "partitions": partitions, "create_id": create_id}
        deadline = time.monotonic() + (self._reconnect_s if retry_s is None else retry_s)
        delay = 0.05
        while True:
            try:
                self._json("create_topic", args)
                return
            except Unreachable:
                raise  # the connection's own retries are over
            except errors.BrokerUnavailable:
                send_by = self._deadline.at
                by = deadline if send_by is None else min(deadline, send_by)
                if self._closing.is_set() or time.monotonic() + delay > by:
                    raise
                self._closing.wait(delay)
                delay = min(delay * 2, 1.0)

    def topic_partitions(self, topic: str) -> list[str]:
        return self._json("topic_partitions", {"topic": topic})["partitions"]

    def close(self) -> None:
        """Close its producers (what they queued is sent first), consumers and readers, then
        the session, each call made once: within CLOSE_TIMEOUT_S, at once if the broker is
        down (it releases the session itself when the session expires)."""
        with self._lock:
            if self._close_begun:
                return
            self._close_begun = True
        self._closing.set()
        close_by = time.monotonic() + CLOSE_TIMEOUT_S
        if self._deadline.at is not None:  # a cluster client's close bounds all of its own
            close_by = min(close_by, self._deadline.at)
        with self._deadline.until(close_by):
            for obj in list(self._objects):
                try:
                    obj.close()
                except errors.PulsarTxnError:
                    pass
            self._closed = True
            self._stop.set()
            try:
                self._raw("close_session", {})
            except errors.PulsarTxnError:
                pass
        if self._keepalive is not threading.current_thread():
            self._keepalive.join(max(close_by - time.monotonic(), 0.0) + 0.5)
        self._flight.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
