"""``pulsartxn serve``: a broker served over Arrow Flight.

Each remote client opens a session (``sessions.py``); its producers, consumers and transaction
handles live in the session. Every call is checked against the bearer token when one is
configured (constant-time comparison), bounded in size, and parsed strictly: a malformed call
gets an error and changes nothing.
"""

from __future__ import annotations

import inspect
import itertools
import secrets

import pyarrow as pa
import pyarrow.flight as flight

from .. import errors
from .._native.entryformat import READ_SCHEMA
from ..client import Client
from ..messaging.consumer import SUBSCRIBE_ENUMS
from ..messaging.dead_letter import DeadLetterPolicy, dead_letter_topic
from ..messaging.message import MessageId
from ..messaging.once import OnceCall
from . import protocol
from .protocol import SessionLost, frame, jsonable, unframe
from .readers import ReaderActions, id_fields
from .replay import Replays, call_numbers
from .sessions import (
    ADMIN,
    MAX_SESSIONS,
    AuthFactory,
    Session,
    SessionLimits,
    Sessions,
    create_id,
    room,
)
from .streams import Streams, capped_wait
from .txn_actions import TxnActions

# The longest a call waits on the server by default (a receive for ever would hold a server
# thread for ever): a client that waits longer asks again.
MAX_WAIT_MS = 10_000


class BrokerServer(Streams, ReaderActions, TxnActions, flight.FlightServerBase):
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
        cluster=None,
    ) -> None:
        """`token`: what clients must present; `admin_token`: what admin calls need (both
        None: everything open). `tls`: (certificate, key) in PEM: grpc+tls. `max_wait_ms`:
        the longest a call waits here (a client waiting longer asks again). `max_sessions`:
        clients connected at once. `cluster`: the broker's ClusterNode in a cluster."""
        self.max_wait_ms = max_wait_ms
        self.replays = Replays()  # delivering calls' answers, for a call made again
        middleware = {"auth": AuthFactory(token, admin_token)}
        scheme = "grpc+tls" if tls else "grpc"
        super().__init__(
            f"{scheme}://{host}:{port}",
            middleware=middleware,
            tls_certificates=[tls] if tls else None,
        )
        self.broker = broker
        self.cluster = cluster
        self.max_request_bytes = max_request_bytes
        self.sessions = Sessions(broker, session_timeout_s, limits or SessionLimits(), max_sessions)
        # Handle numbers of one process start are never those of another: a call re-sent
        # after a restart cannot name another producer or consumer of its session.
        self._handles = itertools.count(secrets.randbelow(1 << 48) + 1)
        self._actions = {
            name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_on_")
        }
        self._admin_actions = {self._on_admin}
        if cluster is not None:
            peers = cluster.peer_actions()  # between brokers: the admin token's
            self._actions.update(peers)
            self._admin_actions.update(peers.values())
        untabled = set(self._actions) - set(protocol.ACTION_ARGS)
        if untabled:  # every call's arguments are checked (protocol.ACTION_ARGS)
            raise RuntimeError(f"actions without a table of arguments: {sorted(untabled)}")

    # -- plumbing --------------------------------------------------------------------------

    def shutdown_sessions(self) -> None:
        self.sessions.shutdown()

    def _admin_only(self, context, what: str) -> None:
        middleware = context.get_middleware("auth")
        if middleware is not None and middleware.role != ADMIN:
            raise errors.NotAuthorized(f"{what} needs the admin token")

    def _role(self, context) -> None:
        middleware = context.get_middleware("auth")
        self.sessions.set_role(middleware is None or middleware.role == ADMIN)

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
            protocol.check_args(action.type, args, protocol.ACTION_ARGS[action.type])
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
        new = self.sessions.open(args.get("session"))
        return {
            "new": new,
            "version": protocol.VERSION,
            "broker": self.broker.broker_id,
            "cluster": self.cluster is not None,
            # What a call may wait here: the client's deadline for it leaves room for that.
            "max_wait_ms": self.max_wait_ms,
            "operation_timeout_ms": self.broker.config.operation_timeout_ms,
        }

    def _on_cluster_info(self, args, payload):
        self.sessions.get(args)
        if self.cluster is None:
            return {
                "cluster": False,
                "broker": self.broker.broker_id,
                "coordinators": len(self.broker.txn.coordinators),
                "brokers": {self.broker.broker_id: ""},
            }
        return self.cluster.info()

    def _on_lookup(self, args, payload):
        self.sessions.get(args)
        if self.cluster is None:
            return {"broker": self.broker.broker_id, "address": ""}
        return self.cluster.lookup(args["kind"], args["name"])

    def _settle(self, txn, acked=None) -> None:
        """In a cluster: an op of a transaction whose coordinator is another broker's is
        answered once durable (see ClusterNode.settle)."""
        if txn is not None and self.cluster is not None:
            self.cluster.settle(txn.id, acked)

    def _serve_topic(self, topic, create: bool = True) -> None:
        """In a cluster: `topic` is known here and its partitions are this broker's."""
        if self.cluster is not None:
            self.cluster.serve_topic(topic, create)

    def _on_keepalive(self, args, payload):
        self.sessions.get(args)
        return {}

    def _on_close_session(self, args, payload):
        self.sessions.close(args.get("session"))
        return {}

    def _on_create_topic(self, args, payload):
        self.sessions.get(args)
        cid = create_id(args)
        if self.cluster is not None:
            self.cluster.create_topic(args["topic"], args.get("partitions", 0), cid)
            return {}
        self.broker.create_topic(args["topic"], args.get("partitions", 0), create_id=cid)
        return {}

    def _on_topic_partitions(self, args, payload):
        self.sessions.get(args)
        if self.cluster is not None:
            return {"partitions": self.cluster.topic_partitions(args["topic"])}
        return {"partitions": self.broker.topic_partitions(args["topic"])}

    # -- producers -------------------------------------------------------------------------

    def _on_create_producer(self, args, payload):
        s = self.sessions.get(args)
        room(len(s.producers), self.sessions.limits.producers, "producers")
        self._serve_topic(args["topic"])
        opts = protocol.options(args, _PRODUCER_OPTIONS)
        handle = next(self._handles)
        p = s.keep(
            s.producers,
            handle,
            lambda: s.client.create_producer(args["topic"], **opts),
            create_id(args),
        )
        return {"handle": handle, "name": p.producer_name(), "last_sequence": p.last_sequence_id()}

    def _producer(self, s: Session, args):
        p = s.producers.get(args.get("handle"))
        if p is None:
            raise SessionLost(f"unknown producer {errors.excerpt(args.get('handle'))}")
        return p

    def _on_send_many(self, args, payload):
        """Messages with explicit sequence ids (a re-send after a reconnect is stored once);
        durable when answered."""
        s = self.sessions.get(args)
        p = self._producer(s, args)
        txn = self.sessions.txn(s, args.get("txn"), capability=args.get("capability"))
        futures, off = [], 0
        topics = {part.partition.index: part.partition.topic for part in p._parts}
        messages = args["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TypeError(f"messages must be a list of maps, not {errors.excerpt(messages)}")
        for m in messages:
            protocol.check_args("send_many message", m, protocol.MESSAGE_ARGS)
            if not isinstance(m["n"], int) or m["n"] < 0:
                raise ValueError(f"malformed send: message length {errors.excerpt(m['n'])}")
        if sum(m["n"] for m in messages) > len(payload):
            raise ValueError("malformed send: message lengths past the payload")
        for i, m in enumerate(messages):
            n = m["n"]
            content = bytes(payload[off : off + n])
            off += n
            meta = protocol.metadata_args(m.get("meta"))
            try:
                fut = p.send_async(
                    content,
                    properties=m.get("props"),
                    partition_key=m.get("key"),
                    sequence_id=m.get("seq"),
                    txn=txn,
                    **meta,
                )
            except (errors.InvalidTxnStatus, errors.TransactionNotFound) as exc:
                if txn is None:
                    raise
                # The transaction ended while the client held these: as a batch waiting
                # here would be, they are dropped, their sequence ids on record.
                rest = [(r.get("key"), r.get("seq")) for r in messages[i:]]
                futures.extend(p._refused(rest, exc))
                break
            futures.append(fut)
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
        self._settle(txn)
        return {"ids": ids, "errors": errs, "partitions": sorted(stored.items()) if txn else []}

    def _on_flush(self, args, payload):
        s = self.sessions.get(args)
        self._producer(s, args).flush()
        return {}

    def _on_close_producer(self, args, payload):
        s = self.sessions.get(args)
        with s.lock:
            p = s.producers.pop(args.get("handle"), None)
        if p is not None:
            p.close()
        return {}

    # -- consumers -------------------------------------------------------------------------

    def _on_subscribe(self, args, payload):
        s = self.sessions.get(args)
        opts = protocol.options(args, _CONSUMER_OPTIONS)
        for key, enum in SUBSCRIBE_ENUMS:
            if key in opts:
                name = opts[key]
                if not isinstance(name, str) or name not in enum.__members__:
                    raise ValueError(
                        f"{key} must name a {enum.__name__}, not {errors.excerpt(name)}"
                    )
                opts[key] = enum[opts[key]]
        room(len(s.consumers), self.sessions.limits.consumers, "consumers")
        self._serve_topic(args["topic"])
        if opts.get("dead_letter_policy") is not None:
            opts["dead_letter_policy"] = DeadLetterPolicy.from_wire(opts["dead_letter_policy"])
            self._serve_dead_letter(args["topic"], args["subscription"], opts)
        handle = next(self._handles)
        c = s.keep(
            s.consumers,
            handle,
            lambda: s.client.subscribe(args["topic"], args["subscription"], **opts),
            create_id(args),
        )
        return {"handle": handle, "name": c.consumer_name()}

    def _serve_dead_letter(self, topic, subscription, opts) -> None:
        """In a cluster: a message moves to its dead letter topic in one local write, so that
        topic must be this broker's too (InvalidConfiguration, not NotOwner: no retry helps)."""
        if self.cluster is None:
            return
        dlq = dead_letter_topic(opts["dead_letter_policy"], topic, subscription)
        try:
            self.cluster.serve_topic(dlq)
        except errors.NotOwner as exc:
            raise errors.InvalidConfiguration(
                f"dead letter topic {dlq} is not served by the broker of {topic}: {exc}"
            ) from None

    def _consumer(self, s: Session, args):
        c = s.consumers.get(args.get("handle"))
        if c is None:
            raise SessionLost(f"unknown consumer {errors.excerpt(args.get('handle'))}")
        return c

    def _on_receive(self, args, payload):
        s = self.sessions.get(args)
        wait = capped_wait(args.get("timeout_millis"), self.max_wait_ms)
        consumer = self._consumer(s, args)
        with self.sessions.waiting(s):
            return self.replays.run(
                consumer, args, lambda: protocol.encode_message(consumer.receive(wait)), "receive"
            )

    def _mid(self, args) -> MessageId:
        return MessageId.deserialize(bytes.fromhex(args["id"]))

    def _on_ack(self, args, payload):
        s = self.sessions.get(args)
        c = self._consumer(s, args)
        txn = self.sessions.txn(s, args.get("txn"), capability=args.get("capability"))
        name = c._acknowledge(self._mid(args), txn, cumulative=bool(args.get("cumulative")))
        self._settle(txn, name)
        return {"participant": list(name) if name else None}

    def _on_nack(self, args, payload):
        s = self.sessions.get(args)
        self._consumer(s, args).negative_acknowledge(self._mid(args))
        return {}

    def _on_redeliver(self, args, payload):
        s = self.sessions.get(args)
        c = self._consumer(s, args)
        c.redeliver_unacknowledged_messages()
        self.replays.forget(c)  # what its calls were given is delivered again anyway
        return {}

    def _on_has_message_available(self, args, payload):
        s = self.sessions.get(args)
        return {"value": self._consumer(s, args).has_message_available()}

    def _on_get_last_message_id(self, args, payload):
        s = self.sessions.get(args)
        mid = self._consumer(s, args).get_last_message_id()
        return {"id": id_fields(mid)}

    def _on_close_consumer(self, args, payload):
        s = self.sessions.get(args)
        with s.lock:
            c = s.consumers.pop(args.get("handle"), None)
        if c is not None:
            c.close()
        return {}

    def _on_unsubscribe(self, args, payload):
        s = self.sessions.get(args)
        return self.replays.run(s, args, lambda: self._unsubscribe(s, args), "unsubscribe")

    def _unsubscribe(self, s: Session, args) -> dict:
        c = self._consumer(s, args)
        c.unsubscribe()  # ConsumerBusy leaves the consumer as it was
        with s.lock:
            s.consumers.pop(args.get("handle"), None)
        return {}

    # -- admin and scans -------------------------------------------------------------------

    # A standalone broker's admin answers the cluster's calls too (InvalidConfiguration).
    _ADMIN = frozenset(protocol.ADMIN_METHODS + protocol.CLUSTER_ADMIN_METHODS)

    def _on_admin(self, args, payload):
        s = self.sessions.get(args)
        if args.get("method") in protocol.ADMIN_ONCE_METHODS:
            # Once per call number: a re-sent call gets its first answer from memory (the
            # replays) or, after a restart, does not run again where it took effect (once).
            call, below = call_numbers(args)
            run_once = None
            if call is not None:
                run_once = OnceCall(self.broker.storage, s.id, call, below)
            return self.replays.run(s, args, lambda: self._admin(args, run_once), "admin")
        return self._admin(args)

    def _admin(self, args, run_once: OnceCall | None = None) -> dict:
        method = args.get("method")
        call_args = args.get("args", [])
        if not isinstance(call_args, list):
            raise TypeError(f"admin args must be a list, not {errors.excerpt(call_args)}")
        if self.cluster is not None and method in (*protocol.CLUSTER_ADMIN_METHODS, "list_topics"):
            return {"result": jsonable(getattr(self.cluster, method)(*call_args))}
        if self.cluster is not None and method == "delete_topic":
            raise errors.InvalidConfiguration("delete_topic is not offered on a cluster")
        if method in _ABOUT_A_TOPIC and call_args and isinstance(call_args[0], str):
            self._serve_topic(call_args[0], create=False)  # its owner's figures, no other
        if method not in self._ADMIN:
            raise ValueError(f"unknown admin call {errors.excerpt(method)}")
        if run_once is not None:
            call = getattr(self.broker.admin, "_" + method)  # as call `run_once`
            return {"result": jsonable(call(*call_args, once=run_once))}
        return {"result": jsonable(getattr(self.broker.admin, method)(*call_args))}


_ABOUT_A_TOPIC = protocol.ADMIN_TOPIC_METHODS


def _keywords(method, *positional: str) -> frozenset:
    """The option names a request may carry: the client method's keywords."""
    return frozenset(inspect.signature(method).parameters) - {"self", *positional}


# The embedded client's signatures are the list: a new option there is one here too.
_PRODUCER_OPTIONS = _keywords(Client.create_producer, "topic")
# (consumer_type is resolved and message_listener runs on the client: neither travels.)
_CONSUMER_OPTIONS = _keywords(
    Client.subscribe, "topic", "subscription_name", "consumer_type", "message_listener"
)
