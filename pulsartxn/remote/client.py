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
from ..server.protocol import SessionLost, frame, unframe
from .admin import RemoteAdmin
from .bounded import bounded_chunks
from .consumer import RemoteConsumer
from .handles import (
    CLOSE_TIMEOUT_S,
    OperationTimedOut,
    RemoteTransaction,
    SendDeadline,
    SendTimedOut,
    ServerWait,
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

__all__ = ["RemoteClient", "Shared", "parse_service_url"]

# What a broker waits at most for a receive and for a decision when its hello does not say.
_SERVER_MAX_WAIT_MS = 10_000
_SERVER_OPERATION_TIMEOUT_MS = 30_000


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


def _flush_handles(txns) -> None:
    """Handles' messages still batched client-side land before a decision commits them; a
    handle with a send that timed out refuses it (InvalidTxnStatus, nothing decided)."""
    for t in txns:
        if isinstance(t, RemoteTransaction):
            t._flush_for_commit()
            t._check_committable()


@strict_class
class RemoteClient(SessionGate):
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
        if roots is not None:
            self._flight = flight.FlightClient(
                f"grpc+tls://{address}", tls_root_certs=roots or None
            )
        else:
            self._flight = flight.FlightClient(f"grpc://{address}")
        headers = [(b"authorization", b"Bearer " + token.encode())] if token else []
        self._headers = headers
        self._options = flight.FlightCallOptions(headers=headers)
        self._session = shared.session
        self._deadline = shared.deadline
        self._wait = shared.wait
        self._op_timeout_s = op_timeout_s
        self._op_options = flight.FlightCallOptions(headers=headers, timeout=op_timeout_s)
        # The longest this broker waits for a receive and for a decision (its hello says).
        self._max_wait_s = _SERVER_MAX_WAIT_MS / 1000.0
        self._decide_s = _SERVER_OPERATION_TIMEOUT_MS / 1000.0
        self._retries = 0  # calls re-sent after the broker was unreachable
        self._reconnect_s = reconnect_timeout_s
        self._closed = False
        self._closing = threading.Event()  # calls to the broker are no longer retried
        self._close_begun = False
        self._init_gate()
        self._objects: weakref.WeakSet = weakref.WeakSet()
        self._capabilities = shared.capabilities  # TxnID string -> its capability
        self._group_capabilities = shared.group_capabilities  # group label -> its capability
        self._in_cluster = False  # the broker said it is one of a cluster
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

    # -- calls -----------------------------------------------------------------------------

    def _hello(self) -> bool:
        """Open the session (or keep it, after a reconnect); whether it is new there."""
        (out,) = self._raw("hello", {"version": protocol.VERSION})
        answer = unframe(out, 1 << 62)[0]
        self._in_cluster = bool(answer.get("cluster"))
        self._max_wait_s = answer.get("max_wait_ms", _SERVER_MAX_WAIT_MS) / 1000.0
        self._decide_s = answer.get("operation_timeout_ms", _SERVER_OPERATION_TIMEOUT_MS) / 1000.0
        return answer.get("new", True)

    def _raw(self, action: str, args: dict, payload: bytes = b"", seen=None) -> list[bytes]:
        """One call, retried while the broker is unreachable (with backoff) up to
        reconnect_timeout_s, or to the thread's send deadline (SendTimedOut, also when the
        broker does not answer); without one, an unanswered attempt ends at the operation
        timeout (OperationTimedOut). `seen`: the generation a handle in `args` was made in; once
        the session has been opened again the call is not re-sent with it (SessionLost: the
        caller makes the handle again; a restarted broker numbers handles afresh)."""
        body = frame({**args, "session": self._session}, payload)
        deadline = time.monotonic() + self._reconnect_s
        delay = 0.05
        while True:
            if seen is not None:
                self._check_generation(seen)
            try:
                options = self._call_options()
                results = self._flight.do_action(flight.Action(action, body), options)
                return [r.body.to_pybytes() for r in results]
            except flight.FlightUnavailableError as exc:
                if self._closing.is_set():  # a closing client does not wait for the broker
                    raise unreachable(self, exc) from None
                self._retries += 1
                send_by = self._deadline.at
                if send_by is not None and send_by <= deadline:  # the send gives up first
                    left = send_by - time.monotonic()
                    self._closing.wait(max(min(delay, left), 0.0))
                    if left <= delay:
                        raise SendTimedOut(str(unreachable(self, exc))) from None
                elif time.monotonic() + delay > deadline:
                    raise unreachable(self, exc) from None
                else:
                    self._closing.wait(delay)
                delay = min(delay * 2, 1.0)
            except flight.FlightTimedOutError:
                if self._deadline.at is not None:
                    raise SendTimedOut(f"broker at {self.service_url} did not answer") from None
                name = f"admin {args.get('method')}" if action == "admin" else action
                raise self._timed_out(name) from None
            except flight.FlightError as exc:
                raise protocol.from_flight_error(exc) from None

    def _call_options(self) -> flight.FlightCallOptions:
        """A call's options: with the time left to the thread's send deadline, if any, else
        the operation timeout plus what the server may wait for the call."""
        left = self._deadline.left()
        if left is not None:
            return flight.FlightCallOptions(headers=self._headers, timeout=left)
        wait = self._server_wait()
        if not wait:
            return self._op_options
        return flight.FlightCallOptions(headers=self._headers, timeout=self._op_timeout_s + wait)

    def _server_wait(self) -> float:
        """Seconds this broker may wait on behalf of the thread's call (see ServerWait)."""
        kind, seconds = self._wait.kind, self._wait.seconds
        if kind == "receive":
            return self._max_wait_s if seconds is None else min(seconds, self._max_wait_s)
        if kind == "decide":
            return self._decide_s if seconds is None else seconds
        return 0.0

    def _timed_out(self, call: str) -> OperationTimedOut:
        wait = self._server_wait()
        extra = f" (+{wait:g} s the broker may wait for it)" if wait else ""
        return OperationTimedOut(
            f"{call}: broker at {self.service_url} did not answer within "
            f"operation_timeout_seconds={self._op_timeout_s:g}{extra}"
        )

    def _call(self, action: str, args: dict, payload: bytes = b"", owner=None) -> list[bytes]:
        """A call in this session; a lost session (the broker restarted) is opened again and
        the owner's handle re-created, then the call is made once more."""
        if self._closed:
            raise errors.AlreadyClosed("client is closed")
        for attempt in (0, 1):
            if owner is not None:
                args = {**args, "handle": owner._ensure()}
            # A handle's calls name the generation it was made in (see _raw).
            seen = owner._generation if owner is not None else self._generation
            try:
                return self._raw(action, args, payload, seen if owner is not None else None)
            except SessionLost:
                if attempt:
                    raise
                self._reopen(seen)
        raise AssertionError("unreachable")

    def _json(self, action: str, args: dict, payload: bytes = b"", owner=None) -> dict:
        (out,) = self._call(action, args, payload, owner)
        return unframe(out, 1 << 62)[0]

    def _keep_alive(self, every: float) -> None:
        while not self._stop.wait(every):
            if self._closing.is_set():  # no call starts that close() would have to wait for
                return
            seen = self._generation
            try:
                # Bounded, so a paused broker holds neither this thread nor a reopen for ever.
                with self._deadline.until(time.monotonic() + CLOSE_TIMEOUT_S):
                    try:
                        self._raw("keepalive", {})
                    except SessionLost:
                        self._reopen(seen)
            except errors.PulsarTxnError:
                pass
            except Exception:  # noqa: BLE001 - closed under it ("FlightClient is closed")
                if self._stop.is_set():
                    return
                raise

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
        out = self._json(
            "new_transaction",
            {
                "timeout_ms": timeout_ms,
                "coordinator_id": coordinator_id,
                "group": group,
                "group_capability": group_capability,
            },
        )
        if group is not None and out.get("group_capability"):
            self._group_capabilities[group] = out["group_capability"]
        self._capabilities[out["txn"]] = out["capability"]
        return RemoteTransaction(self, TxnID.parse(out["txn"]), capability=out["capability"])

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
        txns = list(txns)
        _flush_handles(txns)
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
        winners = list(winners)
        _flush_handles(winners)
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
        self._json("create_topic", {"topic": topic, "partitions": partitions})

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
