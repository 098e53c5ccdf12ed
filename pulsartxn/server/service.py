"""``pulsartxn serve``: a broker served over Arrow Flight.

Each remote client opens a session; its producers, consumers and transaction handles live in
the session. A session that stops sending keep-alives (the client died or was cut off), or
that its client closes, is closed: its consumers' unacknowledged messages go back to be
redelivered, its producers are closed, and the open transactions only it held are aborted
(nobody else could end them), but those in a group, which their group's decision or their
timeout ends. A server that stops keeps its sessions' transactions: clients reconnect under
the same session id and go on; those whose session does not come back within the session
timeout are aborted as above. Every call is checked against
the bearer token when one is configured (constant-time comparison), bounded in size, and
parsed strictly: a malformed call gets an error and changes nothing.
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.flight as flight

from .. import errors
from .._native.entryformat import READ_SCHEMA
from ..client import as_txn_id
from ..messaging.consumer import ConsumerType, InitialPosition, Isolation
from ..messaging.message import MessageId
from ..txn.log import IN_PROCESS
from ..txn.state import FINAL
from . import protocol
from .protocol import frame, jsonable, unframe

STREAM_INFLIGHT = 4  # send_batch writes of one DoPut stream in flight before the next waits
STREAM_BATCH_BYTES = 4 << 20  # payload bytes per record batch of a dispatch stream
# The longest a call waits on the server by default (a receive for ever would hold a server
# thread for ever): a client that waits longer asks again.
MAX_WAIT_MS = 10_000
MAX_SESSIONS = 4096  # clients connected at once (each may hold SessionLimits)

log = logging.getLogger(__name__)


class SessionLost(errors.PulsarTxnError):
    """The session named by a call is unknown here (expired, or the server restarted)."""


protocol._ERRORS["SessionLost"] = SessionLost


# A session's transaction handles are pruned of ended ones when they exceed this (and twice
# what was left after the last pruning).
_PRUNE_TXNS_AT = 1024


@dataclass(frozen=True)
class SessionLimits:
    """What one session may hold at once: past them, a typed QuotaExceeded, never memory or
    threads taken from the others."""

    consumers: int = 1024
    producers: int = 1024
    transactions: int = 10_000  # open transactions it opened or holds
    waiting_receives: int = 256  # receives parked on the server, each holding a thread


class _Session:
    def __init__(self, sid: str, client) -> None:
        self.id = sid
        self.client = client
        self.producers: dict[int, object] = {}
        self.consumers: dict[int, object] = {}
        self.txns: dict[str, object] = {}
        self.groups: set[str] = set()  # labels whose capability it holds
        self.waiting = 0  # receives parked on the server
        self._prune_at = _PRUNE_TXNS_AT
        self.last_seen = time.monotonic()
        self.lock = threading.Lock()

    def remember(self, key: str, txn) -> None:
        """Keep the handle of a transaction this session uses (its acks and pending sends are
        counted there). Those that have ended are dropped once they pile up: a long session
        runs millions of transactions, and one that timed out is never ended by its client.
        Not those in ERROR (not in FINAL): a coordinator that cannot answer now may hold one
        open."""
        with self.lock:
            self.txns[key] = txn
            if len(self.txns) > self._prune_at:
                self.txns = {k: t for k, t in self.txns.items() if t.state not in FINAL}
                self._prune_at = max(_PRUNE_TXNS_AT, 2 * len(self.txns))

    def prune(self) -> None:
        """Drop the handles of transactions that have ended."""
        with self.lock:
            self.txns = {k: t for k, t in self.txns.items() if t.state not in FINAL}

    def forget(self, key: str) -> None:
        with self.lock:
            self.txns.pop(key, None)

    def close(self) -> None:
        for c in list(self.consumers.values()):
            try:
                c.close()  # unacknowledged messages are redelivered to others
            except errors.PulsarTxnError:
                pass
        try:
            self.client.close()
        except errors.PulsarTxnError:
            pass


ADMIN, CLIENT = "admin", "client"


class _Role(flight.ServerMiddleware):
    """What the call's credentials allow: ADMIN (every call) or CLIENT (no admin call)."""

    def __init__(self, role: str) -> None:
        self.role = role


class _AuthFactory(flight.ServerMiddlewareFactory):
    """Bearer tokens, as Pulsar's roles: the admin token allows every call, the client token
    every call but the admin ones. A kind without a token is open to all (no token at all:
    development on loopback)."""

    def __init__(self, token: str | None, admin_token: str | None) -> None:
        self._client = b"Bearer " + token.encode() if token else None
        self._admin = b"Bearer " + admin_token.encode() if admin_token else None

    def start_call(self, info, headers):
        values = headers.get("authorization") or headers.get("Authorization") or []
        got = values[0].encode() if values else b""
        # Both compared, in constant time, whatever the first says.
        is_admin = self._admin is not None and hmac.compare_digest(got, self._admin)
        is_client = self._client is not None and hmac.compare_digest(got, self._client)
        if is_admin or (self._admin is None and self._client is None):
            return _Role(ADMIN)
        if is_client or self._client is None:
            return _Role(CLIENT)
        raise flight.FlightUnauthenticatedError("missing or wrong bearer token")


class BrokerServer(flight.FlightServerBase):
    def __init__(
        self,
        broker,
        host: str = "127.0.0.1",
        port: int = 6650,
        token: str | None = None,
        max_request_bytes: int = protocol.DEFAULT_MAX_REQUEST_BYTES,
        session_timeout_s: float = 10.0,
        *,
        admin_token: str | None = None,
        tls: tuple[bytes, bytes] | None = None,
        max_wait_ms: int = MAX_WAIT_MS,
        limits: SessionLimits | None = None,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        """`token`: what clients must present; `admin_token`: what admin calls need (both
        None: everything open). `tls`: (certificate, key) in PEM: grpc+tls. `max_wait_ms`:
        the longest a call waits here (a client waiting longer asks again). `max_sessions`:
        clients connected at once."""
        self.max_wait_ms = max_wait_ms
        self.max_sessions = max_sessions
        self.limits = limits or SessionLimits()
        middleware = {"auth": _AuthFactory(token, admin_token)}
        scheme = "grpc+tls" if tls else "grpc"
        super().__init__(
            f"{scheme}://{host}:{port}",
            middleware=middleware,
            tls_certificates=[tls] if tls else None,
        )
        self.broker = broker
        self.max_request_bytes = max_request_bytes
        self.session_timeout_s = session_timeout_s
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._handles = itertools.count(1)
        self._stopped = threading.Event()
        self._started = time.monotonic()
        self._swept = False  # the transactions of sessions gone with a previous server
        self._reaper = threading.Thread(target=self._reap, name="pulsartxn-sessions", daemon=True)
        self._reaper.start()
        self._actions = {
            name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_on_")
        }
        self._admin_actions = {self._on_admin}
        self._local = threading.local()  # the call's role (do_action, do_put, do_get)
        self._key = _capability_key(broker)
        self._reserved: dict[str, float] = {}  # group label -> when its capability was given

    # -- plumbing --------------------------------------------------------------------------

    def _reap(self) -> None:
        while not self._stopped.wait(min(1.0, self.session_timeout_s / 4)):
            now = time.monotonic()
            with self._lock:
                dead = [
                    s for s in self._sessions.values() if now - s.last_seen > self.session_timeout_s
                ]
                for s in dead:
                    del self._sessions[s.id]
            for s in dead:
                log.info("a session expired: closing its consumers and producers")
                s.close()
                self._abort_orphans(s)
            if not self._swept and now - self._started > self.session_timeout_s:
                self._swept = True
                self._abort_orphans(None)

    def _abort_orphans(self, gone: _Session | None) -> None:
        """Abort the open transactions no live session holds (opened, or used by id) and no
        group claims: those of the session `gone`, or (None) those of sessions that did not
        come back after a restart."""
        with self._lock:
            live = list(self._sessions.values())
        sids = {s.id for s in live}
        held = {key for s in live for key in list(s.txns)}
        mine = set(gone.txns) if gone is not None else set()

        def orphan(meta) -> bool:
            if meta.group is not None or meta.owner is None or meta.owner == IN_PROCESS:
                return False
            key = str(meta.txn_id)
            if meta.owner in sids or key in held:
                return False
            return gone is None or meta.owner == gone.id or key in mine

        try:
            self.broker.txn.abort_orphans(self.broker.txn.owned(orphan))
        except errors.PulsarTxnError:
            pass  # the broker is closing

    def shutdown_sessions(self) -> None:
        self._stopped.set()
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for s in sessions:
            s.close()

    def _session(self, args: dict) -> _Session:
        sid = args.get("session")
        with self._lock:
            s = self._sessions.get(sid) if isinstance(sid, str) else None
        if s is None:
            raise SessionLost(f"unknown session {errors.excerpt(sid)}")
        s.last_seen = time.monotonic()
        return s

    def _txn(self, s: _Session, value, required: bool = False, capability=None):
        """The session's handle on a transaction: one it opened or was given the capability
        of (an admin's call needs none)."""
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise TypeError(f"txn must be a TxnID string, not {errors.excerpt(value)}")
        txn = s.txns.get(value)
        if txn is None:
            if not self._admin() and not self._holds(b"txn:" + value.encode(), capability):
                raise errors.NotAuthorized(
                    f"transaction {errors.excerpt(value)} belongs to another session: "
                    "present its capability"
                )
            txn = s.client.transaction(value)
            s.remember(value, txn)
        return txn

    # -- capabilities: a secret per transaction and per group label, keyed by the server --

    def _capability(self, what: bytes) -> str:
        return hmac.new(self._key, what, "sha256").hexdigest()[:32]

    def _holds(self, what: bytes, capability) -> bool:
        return isinstance(capability, str) and hmac.compare_digest(
            capability.encode(), self._capability(what).encode()
        )

    def _admin(self) -> bool:
        return getattr(self._local, "admin", True)

    def _group(self, s: _Session, label, capability, claim: bool) -> str | None:
        """The capability of group `label` for session `s`: it holds it, presents it, or (with
        `claim`) takes it while nobody else does (no live member, not given out lately)."""
        if not isinstance(label, str):
            return None  # the call refuses the label itself
        what = b"group:" + label.encode()
        if self._admin() or label in s.groups or self._holds(what, capability):
            s.groups.add(label)
            return self._capability(what)
        if claim and not self.broker.txn.group_members(label) and label not in self._reserved:
            s.groups.add(label)
            self._reserved[label] = time.monotonic()
            return self._capability(what)
        raise errors.NotAuthorized(
            f"group {errors.excerpt(label)} belongs to another session: present its capability"
        )

    @staticmethod
    def _room(count: int, limit: int, what: str) -> None:
        if count >= limit:
            raise errors.QuotaExceeded(f"a session may hold at most {limit} {what}")

    @contextlib.contextmanager
    def _waiting(self, s: _Session):
        """A receive parked on the server for `s` (each holds a server thread)."""
        with s.lock:
            self._room(s.waiting, self.limits.waiting_receives, "receives waiting at once")
            s.waiting += 1
        try:
            yield
        finally:
            with s.lock:
                s.waiting -= 1

    def _admin_only(self, context, what: str) -> None:
        middleware = context.get_middleware("auth")
        if middleware is not None and middleware.role != ADMIN:
            raise errors.NotAuthorized(f"{what} needs the admin token")

    def _role(self, context) -> None:
        middleware = context.get_middleware("auth")
        self._local.admin = middleware is None or middleware.role == ADMIN

    def do_action(self, context, action):
        try:
            self._role(context)
            handler = self._actions.get(action.type)
            if handler is None:
                raise ValueError(f"unknown action {errors.excerpt(action.type)}")
            if handler in self._admin_actions:
                self._admin_only(context, f"{action.type}")
            # The body is checked where gRPC left it (a copy would double what a client sends).
            args, payload = unframe(action.body, self.max_request_bytes)
            try:
                out = handler(args, payload)
            except KeyError as exc:
                name = exc.args[0] if exc.args else None
                if isinstance(name, str) and name not in args:  # args["topic"] of a bad call
                    raise ValueError(
                        f"{action.type}: missing argument {errors.excerpt(name)}"
                    ) from None
                raise
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001 - every error goes back to the caller
            raise protocol.to_flight_error(exc) from None
        if isinstance(out, list):
            return [flight.Result(pa.py_buffer(r)) for r in out]
        return [flight.Result(pa.py_buffer(out if isinstance(out, bytes) else frame(out)))]

    def list_actions(self, context):
        return [(name, "") for name in sorted(self._actions)]

    # Flight calls this service does not offer: a clean error, never a traceback.
    def list_flights(self, context, criteria):
        raise protocol.to_flight_error(ValueError("ListFlights is not offered: use scan"))

    def get_flight_info(self, context, descriptor):
        raise protocol.to_flight_error(ValueError("GetFlightInfo is not offered: use scan"))

    def get_schema(self, context, descriptor):
        # What a scan streams, whatever is asked (pyarrow answers an error raised here with
        # the handler's traceback).
        return flight.SchemaResult(READ_SCHEMA())

    def do_exchange(self, context, descriptor, reader, writer):
        raise protocol.to_flight_error(ValueError("DoExchange is not offered"))

    # -- sessions and topics ---------------------------------------------------------------

    def _on_hello(self, args, payload):
        if args.get("version") != protocol.VERSION:
            raise errors.InvalidConfiguration(
                f"protocol version {errors.excerpt(args.get('version'))} is not {protocol.VERSION}"
            )
        sid = args.get("session")
        if not isinstance(sid, str) or not 8 <= len(sid) <= 64:
            raise ValueError("hello needs a session id of 8..64 characters")
        with self._lock:
            if sid not in self._sessions:
                if len(self._sessions) >= self.max_sessions:
                    raise errors.QuotaExceeded(
                        f"the server holds its limit of {self.max_sessions} sessions "
                        "(pulsartxn serve --max-sessions)"
                    )
                self._sessions[sid] = _Session(sid, self.broker.client(session=sid))
        return {"version": protocol.VERSION, "broker": self.broker.broker_id}

    def _on_keepalive(self, args, payload):
        self._session(args)
        return {}

    def _on_close_session(self, args, payload):
        with self._lock:
            s = self._sessions.pop(args.get("session"), None)
        if s is not None:
            s.close()
            self._abort_orphans(s)
        return {}

    def _on_create_topic(self, args, payload):
        self._session(args)
        self.broker.create_topic(args["topic"], args.get("partitions", 0))
        return {}

    def _on_topic_partitions(self, args, payload):
        self._session(args)
        return {"partitions": self.broker.topic_partitions(args["topic"])}

    # -- producers -------------------------------------------------------------------------

    def _on_create_producer(self, args, payload):
        s = self._session(args)
        self._room(len(s.producers), self.limits.producers, "producers")
        p = s.client.create_producer(args["topic"], **_options(args, _PRODUCER_OPTIONS))
        handle = next(self._handles)
        with s.lock:
            s.producers[handle] = p
        return {"handle": handle, "name": p.producer_name(), "last_sequence": p.last_sequence_id()}

    def _producer(self, s: _Session, args):
        p = s.producers.get(args.get("handle"))
        if p is None:
            raise SessionLost(f"unknown producer {errors.excerpt(args.get('handle'))}")
        return p

    def _on_send_many(self, args, payload):
        """Messages with explicit sequence ids (a re-send after a reconnect is stored once);
        durable when answered."""
        s = self._session(args)
        p = self._producer(s, args)
        txn = self._txn(s, args.get("txn"), capability=args.get("capability"))
        futures, off = [], 0
        topics = {part.partition.index: part.partition.topic for part in p._parts}
        for m in args["messages"]:
            n = m["n"]
            if not isinstance(n, int) or n < 0 or off + n > len(payload):
                raise ValueError("malformed send: message lengths past the payload")
            content = bytes(payload[off : off + n])
            off += n
            futures.append(
                p.send_async(content, m.get("props"), m.get("key"), m.get("seq"), txn=txn)
            )
        p.flush()
        ids, errs = [], []
        stored: dict = {}  # a transaction's messages per partition, for its commit
        for f in futures:
            try:
                mid = f.result()
                ids.append(mid.serialize().hex())
                errs.append(None)
                topic = topics.get(mid.partition())
                if topic is not None:
                    stored[topic] = stored.get(topic, 0) + 1
            except Exception as exc:  # noqa: BLE001 - reported per message
                ids.append(None)
                errs.append([type(exc).__name__, str(exc)])
        return {"ids": ids, "errors": errs, "partitions": sorted(stored.items()) if txn else []}

    def _on_flush(self, args, payload):
        s = self._session(args)
        self._producer(s, args).flush()
        return {}

    def _on_close_producer(self, args, payload):
        s = self._session(args)
        with s.lock:
            p = s.producers.pop(args.get("handle"), None)
        if p is not None:
            p.close()
        return {}

    def do_put(self, context, descriptor, reader, writer):
        try:
            self._role(context)
            args, _ = unframe(descriptor.command, self.max_request_bytes)
            s = self._session(args)
            p = self._producer(s, args)
            txn = self._txn(s, args.get("txn"), capability=args.get("capability"))
            total = 0
            size = 0
            stored: dict = {}
            # A stream's batches are written as they come (the writer thread commits one while
            # the next is read), and the answer waits until all are durable; a few in flight.
            inflight: list = []
            try:
                for chunk in reader:
                    batch = chunk.data
                    if batch.nbytes > self.max_request_bytes:
                        raise ValueError(
                            f"a send_batch batch of {batch.nbytes} bytes exceeds the limit of "
                            f"{self.max_request_bytes}: send smaller batches"
                        )
                    size += batch.nbytes
                    if size > self.max_request_bytes * 16:
                        raise ValueError("send_batch stream exceeds the server's limit")
                    if "value" not in batch.schema.names:
                        raise ValueError("send_batch batches need a 'value' column")
                    keys = batch.column("key") if "key" in batch.schema.names else None
                    n, futures, t, parts = p._submit_batch(batch.column("value"), keys, txn, False)
                    total += n
                    for topic, k in parts.items():
                        stored[topic] = stored.get(topic, 0) + k
                    inflight.append((futures, t))
                    while len(inflight) > STREAM_INFLIGHT:
                        p._wait_batches(*inflight.pop(0))
            finally:
                for futures, t in inflight:
                    p._wait_batches(futures, t)
            out = {"count": total, "partitions": sorted(stored.items()) if txn else []}
            writer.write(pa.py_buffer(json.dumps(out).encode()))
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise protocol.to_flight_error(exc) from None

    # -- consumers -------------------------------------------------------------------------

    def _on_subscribe(self, args, payload):
        s = self._session(args)
        opts = _options(args, _CONSUMER_OPTIONS)
        for key, enum in (
            ("subscription_type", ConsumerType),
            ("initial_position", InitialPosition),
            ("isolation", Isolation),
        ):
            if key in opts:
                name = opts[key]
                if not isinstance(name, str) or name not in enum.__members__:
                    raise ValueError(
                        f"{key} must name a {enum.__name__}, not {errors.excerpt(name)}"
                    )
                opts[key] = enum[opts[key]]
        self._room(len(s.consumers), self.limits.consumers, "consumers")
        c = s.client.subscribe(args["topic"], args["subscription"], **opts)
        handle = next(self._handles)
        with s.lock:
            s.consumers[handle] = c
        return {"handle": handle, "name": c.consumer_name()}

    def _consumer(self, s: _Session, args):
        c = s.consumers.get(args.get("handle"))
        if c is None:
            raise SessionLost(f"unknown consumer {errors.excerpt(args.get('handle'))}")
        return c

    def _on_receive(self, args, payload):
        s = self._session(args)
        wait = _capped_wait(args.get("timeout_millis"), self.max_wait_ms)
        consumer = self._consumer(s, args)
        with self._waiting(s):
            msg = consumer.receive(wait)
        return protocol.encode_message(msg)

    def _mid(self, args) -> MessageId:
        return MessageId.deserialize(bytes.fromhex(args["id"]))

    def _on_ack(self, args, payload):
        s = self._session(args)
        c = self._consumer(s, args)
        txn = self._txn(s, args.get("txn"), capability=args.get("capability"))
        if args.get("cumulative"):
            name = c.acknowledge_cumulative(self._mid(args), txn=txn)
        else:
            name = c.acknowledge(self._mid(args), txn=txn)
        return {"participant": list(name) if name else None}

    def _on_nack(self, args, payload):
        s = self._session(args)
        self._consumer(s, args).negative_acknowledge(self._mid(args))
        return {}

    def _on_redeliver(self, args, payload):
        s = self._session(args)
        self._consumer(s, args).redeliver_unacknowledged_messages()
        return {}

    def _on_has_message_available(self, args, payload):
        s = self._session(args)
        return {"value": self._consumer(s, args).has_message_available()}

    def _on_get_last_message_id(self, args, payload):
        s = self._session(args)
        mid = self._consumer(s, args).get_last_message_id()
        # Fields, not serialize(): "nothing yet" is entry -1, which has no wire form.
        return {
            "id": [
                mid.ledger_id(),
                mid.entry_id(),
                mid.partition(),
                mid.batch_index(),
                mid.batch_size(),
            ]
        }

    def _on_close_consumer(self, args, payload):
        s = self._session(args)
        with s.lock:
            c = s.consumers.pop(args.get("handle"), None)
        if c is not None:
            c.close()
        return {}

    def _on_unsubscribe(self, args, payload):
        s = self._session(args)
        c = self._consumer(s, args)
        c.unsubscribe()  # ConsumerBusy leaves the consumer as it was
        with s.lock:
            s.consumers.pop(args.get("handle"), None)
        return {}

    # -- transactions ----------------------------------------------------------------------

    def _on_new_transaction(self, args, payload):
        s = self._session(args)
        label = args.get("group")
        if len(s.txns) >= self.limits.transactions:
            s.prune()  # those that ended through other handles or timed out go first
            self._room(len(s.txns), self.limits.transactions, "open transactions")
        group_capability = None
        if label is not None:
            group_capability = self._group(s, label, args.get("group_capability"), claim=True)
        txn = s.client.new_transaction(args.get("timeout_ms"), args.get("coordinator_id"), label)
        s.remember(str(txn.id), txn)
        return {
            "txn": str(txn.id),
            "capability": self._capability(b"txn:" + str(txn.id).encode()),
            "group_capability": group_capability,
        }

    def _on_group_capability(self, args, payload):
        s = self._session(args)
        label = args["group"]
        if not isinstance(label, str) or not label:
            raise ValueError(f"group must be a non-empty str, not {errors.excerpt(label)}")
        return {"capability": self._group(s, label, args.get("capability"), claim=True)}

    def _on_txn_state(self, args, payload):
        s = self._session(args)
        value, capability = args["txn"], args.get("capability")
        if value in s.txns or self._admin() or capability is not None:
            # A handle on it: the session holds it from now on (it outlives its opener's).
            return {"state": self._txn(s, value, True, capability).state.value}
        # Reading a state needs no capability (using or ending it does).
        return {"state": self.broker.txn.state_of(as_txn_id(value)).value}

    def _on_end(self, args, payload):
        s = self._session(args)
        txn = self._txn(s, args["txn"], required=True, capability=args.get("capability"))
        if args.get("commit"):
            counts = None
            if args.get("counted"):  # the client's handle opened it: its counts are whole
                acks = {tuple(k): n for k, n in args.get("expected_acks") or []}
                sends = {str(k): n for k, n in args.get("expected_sends") or []}
                counts = (acks, sends)
            txn.commit(args.get("timeout_ms"), counts=counts)
        else:
            txn.abort(args.get("timeout_ms"))
        state = txn.state
        if state in FINAL:
            s.forget(args["txn"])
        return {"state": state.value}

    def _on_commit_all(self, args, payload):
        s = self._session(args)
        caps = args.get("capabilities") or [None] * len(args["txns"])
        handles = [self._txn(s, t, True, c) for t, c in zip(args["txns"], caps)]
        s.client.commit_all(handles)
        return {}

    def _on_commit_group(self, args, payload):
        s = self._session(args)
        self._group(s, args["group"], args.get("group_capability"), claim=False)
        key = args.get("idempotency_key")
        out = s.client.commit_group(
            args["group"], args["winners"], tuple(key) if key is not None else None
        )
        return jsonable(out)

    def _on_abort_group(self, args, payload):
        s = self._session(args)
        self._group(s, args["group"], args.get("group_capability"), claim=False)
        return jsonable(s.client.abort_group(args["group"]))

    # -- admin and scans -------------------------------------------------------------------

    _ADMIN = frozenset(protocol.ADMIN_METHODS)

    def _on_admin(self, args, payload):
        self._session(args)
        method = args.get("method")
        if method not in self._ADMIN:
            raise ValueError(f"unknown admin call {errors.excerpt(method)}")
        return {"result": jsonable(getattr(self.broker.admin, method)(*args.get("args", [])))}

    def do_get(self, context, ticket):
        try:
            self._role(context)
            args, _ = unframe(ticket.ticket, self.max_request_bytes)
            s = self._session(args)
            if args.get("op") == "receive":
                # Dispatch to a consumer: what batch_receive gives, as one record batch.
                consumer = self._consumer(s, args)
                with self._waiting(s):
                    msgs = consumer.batch_receive(
                        args.get("max_num_messages", 1000),
                        _capped_wait(args.get("timeout_millis", 100), self.max_wait_ms),
                    )
                # Streamed in batches of a bounded size (a message past it goes alone).
                return flight.GeneratorStream(
                    protocol.dispatch_schema(), protocol.message_batches(msgs, STREAM_BATCH_BYTES)
                )
            if args.get("op") != "scan":
                raise ValueError(f"unknown stream {errors.excerpt(args.get('op'))}")
            start, end = args.get("start"), args.get("end")
            if isinstance(start, str):
                start = MessageId.deserialize(bytes.fromhex(start))
            if isinstance(end, str):
                end = MessageId.deserialize(bytes.fromhex(end))
            batches = s.client.scan(args["topic"], start, end)
            return flight.GeneratorStream(READ_SCHEMA(), batches)
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise protocol.to_flight_error(exc) from None


def serve(
    data_dir: str,
    host: str,
    port: int,
    token: str | None,
    max_request_bytes: int = protocol.DEFAULT_MAX_REQUEST_BYTES,
    session_timeout_s: float = 10.0,
    *,
    admin_token: str | None = None,
    tls: tuple[bytes, bytes] | None = None,
    insecure: bool = False,
    max_wait_ms: int = MAX_WAIT_MS,
    limits: SessionLimits | None = None,
    max_sessions: int = MAX_SESSIONS,
    **broker_options,
) -> None:
    """Run a broker and serve it until SIGINT/SIGTERM; then close it cleanly (in-flight
    groups committed, sessions closed, LMDB closed). Off loopback, a server without a token
    is refused unless `insecure` (anyone who reaches the port could do anything)."""
    import ipaddress
    import signal

    from ..broker import Broker

    loopback = host == "localhost"
    try:
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not loopback and token is None and admin_token is None and not insecure:
        raise errors.InvalidConfiguration(
            f"serving on {host} without a token lets anyone who reaches it do anything: "
            "give --token-file (and --admin-token-file), or --insecure"
        )
    if port:
        _check_free(host, port)  # one clear line, not gRPC's log and a traceback
    broker = Broker(data_dir, **broker_options)
    try:
        server = BrokerServer(
            broker,
            host,
            port,
            token,
            max_request_bytes,
            session_timeout_s,
            admin_token=admin_token,
            tls=tls,
            max_wait_ms=max_wait_ms,
            limits=limits,
            max_sessions=max_sessions,
        )
    except BaseException:
        broker.close()
        raise
    stop = threading.Event()

    def on_signal(signum, frame_):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    scheme = "pulsartxn+ssl" if tls else "pulsartxn"
    print(f"pulsartxn serving {broker.data_dir} on {scheme}://{host}:{server.port}", flush=True)
    if token is None and admin_token is None:
        log.warning("no token: every call is allowed to anyone who reaches %s:%s", host, port)
    try:
        stop.wait()
    finally:
        server.shutdown_sessions()
        server.shutdown()
        broker.close()
        print("pulsartxn server stopped", flush=True)


CAPABILITY_KEY = b"server/capability-key"


def _capability_key(broker) -> bytes:
    """The server's secret for capabilities, kept in the broker's store (a restarted server
    honours those it gave out): made at the first start."""
    storage = broker.storage
    with storage.read() as txn:
        raw = txn.get(CAPABILITY_KEY, db=storage.meta)
        if raw is not None:
            return bytes(raw)
    key = secrets.token_bytes(32)  # the data directory is this process's alone (locked)
    storage.write(lambda t: t.put(CAPABILITY_KEY, key, db=storage.meta))
    return key


_PRODUCER_OPTIONS = frozenset(
    {
        "producer_name",
        "batching_enabled",
        "batching_max_messages",
        "batching_max_allowed_size_in_bytes",
        "batching_max_publish_delay_ms",
    }
)
_CONSUMER_OPTIONS = frozenset(
    {
        "subscription_type",
        "initial_position",
        "isolation",
        "consumer_name",
        "negative_ack_redelivery_delay_ms",
        "receiver_queue_size",
    }
)


def _options(args, known: frozenset) -> dict:
    """A request's options: a dict of known names only (an unknown one is an error)."""
    opts = args.get("options") or {}
    if not isinstance(opts, dict):
        raise TypeError(f"options must be a map, not {errors.excerpt(opts)}")
    for key in opts:
        if key not in known:
            raise TypeError(f"unknown option {errors.excerpt(key)}")
    return dict(opts)


def _capped_wait(timeout_millis, cap: int):
    """A wait asked for (None: for ever), at most `cap` ms (bad values are the callee's to
    refuse)."""
    if timeout_millis is None:
        return cap
    if isinstance(timeout_millis, int) and not isinstance(timeout_millis, bool):
        return min(timeout_millis, cap)
    return timeout_millis


def _check_free(host: str, port: int) -> None:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
