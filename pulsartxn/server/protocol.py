"""What travels between the remote client and the server, and how errors come back.

Actions carry a frame: a little-endian u32 length, that many bytes of JSON (the call's
arguments), then raw bytes (message content). Bulk produce is a DoPut stream of record batches
(``value`` binary, optional ``key`` string) whose descriptor command is the JSON of the call;
scans are DoGet streams in API.md's read schema. An error raised by the broker travels as a
FlightServerError whose extra_info names its class, and is raised again as that class on the
client.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from .. import errors
from .._native import message_fields, messages_from_fields
from ..messaging.message import Message, MessageId

# gRPC's EventEngine client and listener cost a Flight call about twice the CPU of its older
# poller (bench/RESULTS.md, "gRPC's poller"). gRPC reads this once, when its first client or
# server starts, and every one of ours is made after this import; a value the user set stays.
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)

VERSION = 1
# The most ids one call names to be undone: creates it cancels (Calls._create,
# Session.cancel), spares it drops (remote/spare.py).
MAX_CANCELS = 64


def id_list(value, name: str, what: str) -> list[str]:
    """An argument naming what a call undoes: a list of at most MAX_CANCELS strings (None:
    none), else TypeError before anything is undone."""
    if value is None:
        return []
    if (
        not isinstance(value, list)
        or len(value) > MAX_CANCELS
        or not all(isinstance(v, str) for v in value)
    ):
        raise TypeError(
            f"{name} must be a list of at most {MAX_CANCELS} {what}, not {errors.excerpt(value)}"
        )
    return value


# Admin calls served remotely (API.md, "Admin and stats").
ADMIN_METHODS = (
    "topic_stats",
    "coordinators",
    "coordinator_stats",
    "transaction_metadata",
    "slow_transactions",
    "transaction_buffer_stats",
    "pending_ack_stats",
    "scale_coordinators",
    "list_topics",
    "delete_topic",
    "list_subscriptions",
    "create_subscription",
    "delete_subscription",
    "reset_cursor",
    "skip",
    "clear_backlog",
    "peek",
    "partitioned_stats",
    "transaction_in_buffer_stats",
    "transaction_in_pending_ack_stats",
)
# Admin calls about one topic (its first argument): its partitions' owners answer them.
ADMIN_TOPIC_METHODS = (
    "topic_stats",
    "transaction_buffer_stats",
    "pending_ack_stats",
    *ADMIN_METHODS[ADMIN_METHODS.index("delete_topic") :],
)
# Admin calls of a cluster (docs/cluster.md): who owns what, and every broker's transactions.
CLUSTER_ADMIN_METHODS = ("cluster", "cluster_transactions", "cluster_coordinators")
# Admin calls that a second run would not answer as the first (skip would skip again, a delete
# find nothing): numbered, so that one re-sent after its answer was lost gets the first answer.
ADMIN_ONCE_METHODS = ("delete_topic", "create_subscription", "delete_subscription", "skip")
_LEN = struct.Struct("<I")
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024

# The arguments each call takes (the keys of its JSON): any other is refused before the call
# runs, as an unknown keyword is in Python. SESSION: what naming the caller's session reads.
SESSION = frozenset({"session", "cancel"})
_HANDLE = SESSION | {"handle"}
_CREATE = SESSION | {"topic", "create_id", "options"}
ACTION_ARGS: dict[str, frozenset] = {
    "hello": frozenset({"session", "version"}),
    "close_session": frozenset({"session"}),
    "keepalive": SESSION,
    "cluster_info": SESSION,
    "lookup": SESSION | {"kind", "name"},
    "admin": SESSION | {"method", "args", "call", "below"},
    "create_topic": SESSION | {"topic", "partitions", "create_id"},
    "topic_partitions": SESSION | {"topic"},
    "create_producer": _CREATE,
    "subscribe": _CREATE | {"subscription"},
    "create_reader": _CREATE | {"start", "start_time", "resume"},
    "close_producer": _HANDLE,
    "close_consumer": _HANDLE,
    "unsubscribe": _HANDLE | {"call", "below"},
    "send_many": _HANDLE | {"messages", "txn", "capability"},
    "flush": _HANDLE,
    "receive": _HANDLE | {"timeout_millis", "call", "below"},
    "ack": _HANDLE | {"id", "txn", "capability", "cumulative"},
    "nack": _HANDLE | {"id"},
    "redeliver": _HANDLE,
    "seek": _HANDLE | {"id", "timestamp"},
    "get_last_message_id": _HANDLE,
    "get_last_message_ids": _HANDLE,
    "has_message_available": _HANDLE,
    "read_next": _HANDLE | {"timeout_millis", "call", "below"},
    "read_many": _HANDLE | {"max_num_messages", "call", "below"},
    "new_transaction": SESSION
    | {"timeout_ms", "coordinator_id", "group", "group_capability", "drop", "lost"},
    "drop_spares": SESSION | {"drop", "lost"},
    "group_capability": SESSION | {"group", "capability"},
    "txn_state": SESSION | {"txn", "capability"},
    "end": SESSION
    | {
        "txn",
        "capability",
        "commit",
        "counted",
        "expected_acks",
        "expected_sends",
        "timeout_ms",
        "next",
    },
    "commit_all": SESSION | {"txns", "capabilities"},
    "commit_group": SESSION | {"group", "group_capability", "idempotency_key", "winners"},
    "abort_group": SESSION | {"group", "group_capability"},
    # Between the brokers of a cluster (server/cluster.py), with the admin token.
    "peer_register": frozenset({"txn", "partitions", "subscriptions"}),
    "peer_state": frozenset({"txn"}),
    "peer_fail": frozenset({"txn", "error"}),
    "peer_end": frozenset({"txn", "commit", "lwm", "kind", "name"}),
    "peer_admin": frozenset({"method", "args"}),
}
# A send_many message; a bulk stream's command (DoPut); a dispatch or scan stream (DoGet).
MESSAGE_ARGS = frozenset({"n", "meta", "props", "key", "seq"})
PUT_ARGS = _HANDLE | {"txn", "capability"}
GET_ARGS = {
    "receive": _HANDLE | {"op", "max_num_messages", "timeout_millis", "call", "below"},
    "scan": SESSION | {"op", "topic", "start", "end"},
}


def check_args(call: str, args: dict, known: frozenset) -> None:
    """TypeError naming the first argument of `args` that `call` does not take."""
    for key in args:
        if key not in known:
            raise TypeError(
                f"{call}: unknown argument {errors.excerpt(key)} (it takes "
                f"{', '.join(sorted(known))})"
            )


class SessionLost(errors.PulsarTxnError):
    """The session named by a call is unknown here (expired, or the server restarted)."""


# Exceptions that may cross the wire, by name (anything else becomes PulsarTxnError).
_ERRORS = {name: getattr(errors, name) for name in errors.__all__}
_ERRORS.update(
    {
        "ValueError": ValueError,
        "TypeError": TypeError,
        "KeyError": KeyError,
        "SessionLost": SessionLost,
    }
)


def frame(args: dict, payload: bytes = b"") -> bytes:
    head = json.dumps(args, separators=(",", ":")).encode()
    return _LEN.pack(len(head)) + head + payload


def unframe(body, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> tuple[dict, memoryview]:
    """Parse a frame; anything malformed is a ValueError (the server answers it, changes
    nothing)."""
    view = memoryview(body)
    if len(view) > max_bytes:
        raise ValueError(f"request of {len(view)} bytes exceeds the limit of {max_bytes}")
    if len(view) < 4:
        raise ValueError("malformed request: shorter than its length prefix")
    (n,) = _LEN.unpack_from(view)
    if n > len(view) - 4:
        raise ValueError("malformed request: length prefix past the end")
    try:
        args = json.loads(bytes(view[4 : 4 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed request: {exc}") from None
    if not isinstance(args, dict):
        raise ValueError("malformed request: arguments must be a JSON object")
    return args, view[4 + n :]


def options(args: dict, known: frozenset) -> dict:
    """A request's options: a dict of known names only (an unknown one is an error)."""
    opts = args.get("options") or {}
    if not isinstance(opts, dict):
        raise TypeError(f"options must be a map, not {errors.excerpt(opts)}")
    for key in opts:
        if key not in known:
            raise TypeError(f"unknown option {errors.excerpt(key)}")
    return dict(opts)


def to_flight_error(exc: BaseException) -> flight.FlightServerError:
    name = type(exc).__name__
    if name not in _ERRORS:
        name = "PulsarTxnError"
    info = json.dumps({"type": name, "message": str(exc)}).encode()
    return flight.FlightServerError(f"{name}: {exc}", extra_info=info)


def from_flight_error(exc: flight.FlightError) -> BaseException:
    """The API.md exception a FlightError stands for."""
    if isinstance(exc, flight.FlightUnauthenticatedError):
        return errors.NotAuthorized(f"authentication failed: {exc}")
    info = getattr(exc, "extra_info", None)
    if info:
        try:
            data = json.loads(info)
            return error_named(data.get("type"), data.get("message", ""))
        except (ValueError, TypeError):
            pass
    return errors.PulsarTxnError(str(exc))


def error_named(name, message: str) -> BaseException:
    """The exception an error's name and message stand for (PulsarTxnError if unknown)."""
    return _ERRORS.get(name, errors.PulsarTxnError)(message)


def encode_message(msg: Message) -> bytes:
    head = {
        "id": msg.message_id().serialize().hex(),
        "props": msg.properties(),
        "key": msg.partition_key(),
        "topic": msg.topic_name(),
        "t": msg.publish_timestamp(),
        "r": msg.redelivery_count(),
    }
    if msg.event_timestamp() or msg.ordering_key() is not None:
        head["meta"] = [msg.event_timestamp(), _okey_hex(msg.ordering_key())]
    return frame(head, msg.data())


def _okey_hex(okey: str | None) -> str | None:
    return None if okey is None else okey.encode("utf-8", "surrogateescape").hex()


def _okey_str(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "surrogateescape")


def wire_metadata(meta: tuple[int, int, bytes | None]) -> list:
    """A send's stored metadata (event time, deliver at, ordering key bytes) as JSON."""
    return [meta[0], meta[1], None if meta[2] is None else meta[2].hex()]


def metadata_args(wire) -> dict:
    """The send arguments of wire_metadata's list; a malformed one is a ValueError."""
    if wire is None:
        return {}
    try:
        event_time, deliver_at, okey = wire
        okey = None if okey is None else bytes.fromhex(okey)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed send metadata: {errors.excerpt(wire)}") from exc
    return {
        "event_timestamp": event_time or None,
        "deliver_at": deliver_at or None,
        "ordering_key": okey,
    }


def decode_message(body) -> Message:
    """The message of a receive answer; a malformed one is a ValueError."""
    head, data = unframe(body, 1 << 62)
    try:
        props, key, topic, t, r = (head[k] for k in ("props", "key", "topic", "t", "r"))
        mid = MessageId.deserialize(bytes.fromhex(head["id"]))
        event_time, okey = head.get("meta") or (0, None)
        okey = None if okey is None else _okey_str(bytes.fromhex(okey))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"malformed message: {type(exc).__name__}: {exc}") from None
    if not (
        isinstance(props, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())
        and (key is None or isinstance(key, str))
        and isinstance(topic, str)
        and _is_int(t)
        and _is_int(r)
        and _is_int(event_time)
    ):
        raise ValueError(f"malformed message: bad field types in {errors.excerpt(head)}")
    return Message(bytes(data), props, key, mid, topic, t, r, None, event_time, okey)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def jsonable(value):
    """Admin results as JSON: TxnIDs and MessageIds become strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


DISPATCH_SCHEMA = None


def dispatch_schema():
    """Messages handed to a consumer, as a DoGet stream (one row per message)."""
    global DISPATCH_SCHEMA
    if DISPATCH_SCHEMA is None:
        DISPATCH_SCHEMA = pa.schema(
            [
                ("message_id", pa.binary()),
                ("value", pa.binary()),
                ("key", pa.string()),
                ("properties", pa.string()),  # JSON object
                ("topic", pa.string()),
                ("publish_time", pa.int64()),
                ("redelivery_count", pa.int32()),
                ("event_time", pa.int64()),  # 0: none
                ("ordering_key", pa.binary()),
            ]
        )
    return DISPATCH_SCHEMA


def messages_to_batch(msgs):
    ids, data, props, keys, topics, pubs, reds, events, okeys = message_fields(msgs)
    n = len(data)
    offsets = np.arange(0, (n + 1) * _ID_DTYPE.itemsize, _ID_DTYPE.itemsize, dtype=np.int32)
    return pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(ids)]),
            pa.array(data, pa.binary()),
            pa.array(keys, pa.string()),
            pa.array([None if p is None else json.dumps(p) for p in props], pa.string()),
            pa.array(topics, pa.string()),
            pa.array(np.frombuffer(pubs, np.int64)),
            pa.array(np.frombuffer(reds, np.int32)),
            pa.array(np.frombuffer(events, np.int64)),
            pa.array(
                [None if k is None else k.encode("utf-8", "surrogateescape") for k in okeys],
                pa.binary(),
            ),
        ],
        schema=dispatch_schema(),
    )


# A serialized MessageId (MessageId.serialize: "<2sqqiii") as a numpy record, for whole columns.
_ID_DTYPE = np.dtype(
    [
        ("magic", "S2"),
        ("ledger", "<i8"),
        ("entry", "<i8"),
        ("partition", "<i4"),
        ("index", "<i4"),
        ("size", "<i4"),
    ]
)


def _ids_from_array(col: pa.Array) -> list:
    """The five fields of each serialized MessageId of a binary column (ValueError for one
    that is not: MessageId.deserialize's rules, checked over the whole column)."""
    n = len(col)
    if not n:
        return []
    _, offsets, data = col.buffers()
    at = np.frombuffer(offsets, np.int32, n + 1, col.offset * 4)
    if (np.diff(at) != _ID_DTYPE.itemsize).any():
        raise ValueError("malformed dispatch batch: a message id of the wrong size")
    rows = np.frombuffer(data, _ID_DTYPE, n, int(at[0]))
    ledger, entry = rows["ledger"], rows["entry"]
    negative = (ledger < 0) | (entry < 0)
    if (rows["magic"] != b"M1").any() or (negative & ((ledger != -1) | (entry != -1))).any():
        raise ValueError("malformed dispatch batch: not a serialized MessageId")
    return list(
        zip(
            ledger.tolist(),
            entry.tolist(),
            rows["partition"].tolist(),
            rows["index"].tolist(),
            rows["size"].tolist(),
        )
    )


def message_batches(msgs, max_bytes: int):
    """`msgs` as dispatch batches of about `max_bytes` of payload each (one message larger
    than that is a batch of its own)."""
    start = size = 0
    for i, m in enumerate(msgs):
        n = len(m.data())
        if i > start and size + n > max_bytes:
            yield messages_to_batch(msgs[start:i])
            start, size = i, 0
        size += n
    if start < len(msgs) or not msgs:
        yield messages_to_batch(msgs[start:])


def table_batches(table, max_bytes: int):
    """`table` (a `value` column, maybe `key`) as record batches of about `max_bytes` of
    values and keys each (one row larger than that is a batch of its own)."""
    if table.num_rows and table.nbytes <= max_bytes:  # the usual case: one batch
        yield from table.combine_chunks().to_batches()
        return
    import pyarrow.compute as pc  # here: its import costs every process 80 ms

    sizes = pc.binary_length(table.column("value")).to_numpy(zero_copy_only=False)
    if "key" in table.schema.names:
        sizes = sizes + pc.binary_length(table.column("key")).fill_null(0).to_numpy(
            zero_copy_only=False
        )
    ends = np.cumsum(sizes, dtype=np.int64)
    start = 0
    while start < table.num_rows:
        base = ends[start - 1] if start else 0
        stop = max(int(np.searchsorted(ends, base + max_bytes, side="right")), start + 1)
        yield from table.slice(start, stop - start).combine_chunks().to_batches()
        start = stop
    if table.num_rows == 0:
        yield from table.to_batches()


def batch_to_messages(batch) -> list[Message]:
    """The messages of a dispatch batch; a batch not of the dispatch schema is a ValueError."""
    if not batch.schema.equals(dispatch_schema()):
        raise ValueError(f"malformed dispatch batch: schema {batch.schema}")
    cols = batch.columns
    if any(cols[i].null_count for i in _REQUIRED):
        raise ValueError("malformed dispatch batch: a missing or ill-typed field")
    ids = _ids_from_array(cols[0])
    props = [None if p is None else _properties(p) for p in cols[3].to_pylist()]
    okeys = [_okey_str(k) for k in cols[8].to_pylist()] if cols[8].null_count < len(ids) else None
    return messages_from_fields(
        ids,
        cols[1].to_pylist(),
        props,
        cols[2].to_pylist(),
        cols[4].to_pylist(),
        *(cols[i].to_numpy().tolist() for i in (5, 6, 7)),
        okeys or [None] * len(ids),
    )


_REQUIRED = (0, 1, 4, 5, 6, 7)  # message_id, value, topic, publish and event time, redeliveries


def _properties(text: str) -> dict:
    """A message's properties from their JSON (ValueError unless an object of strings)."""
    try:
        props = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"malformed dispatch batch: {type(exc).__name__}: {exc}") from None
    if not isinstance(props, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in props.items()
    ):
        raise ValueError("malformed dispatch batch: a missing or ill-typed field")
    return props
