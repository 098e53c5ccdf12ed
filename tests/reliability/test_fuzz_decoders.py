"""Random-bytes fuzzing of what decodes untrusted bytes: the entry codec (native and its twin,
which must agree) and the network protocol (request frames, receive answers, dispatch
batches, and a real server on 127.0.0.1 fed garbage actions).

tests/native/test_entrylog.py covers truncations, single bit flips and random bytes of one
entry; here: random edits of valid multi-message entries, headers, and agreement of the twins.
"""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pulsartxn
from pulsartxn._native import load
from pulsartxn.errors import CorruptEntry
from pulsartxn.messaging.message import MessageId
from pulsartxn.server import protocol
from pulsartxn.server.protocol import (
    batch_to_messages,
    decode_message,
    dispatch_schema,
    encode_message,
    frame,
    messages_to_batch,
    unframe,
)

NATIVE = load("native")
REFERENCE = load("reference")

message = st.tuples(
    st.binary(max_size=40),
    st.none() | st.binary(max_size=8),
    st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
    # metadata (FLAG_METADATA): event time, deliver at, ordering key
    st.none()
    | st.tuples(
        st.integers(-(1 << 63), (1 << 63) - 1),
        st.integers(0, 1 << 50),
        st.none() | st.binary(max_size=8),
    ),
)


@st.composite
def valid_entry(draw):
    msgs = draw(st.lists(message, min_size=1, max_size=6))
    return NATIVE.encode_entry(
        [m[0] for m in msgs],
        keys=[m[1] for m in msgs],
        properties=[m[2] for m in msgs],
        metadata=[m[3] for m in msgs] if draw(st.booleans()) else None,
        txn_msb=draw(st.integers(0, 3)),
        txn_lsb=draw(st.integers(0, 3)),
        sequence_id=draw(st.integers(0, 1 << 40)),
        publish_time=draw(st.integers(-(1 << 40), 1 << 40)),
        marker_type=draw(st.sampled_from([0, 0, 21, 22])),
    )


# An edit: (kind, position, byte); positions wrap around the entry's length.
edit = st.tuples(
    st.sampled_from(["set", "insert", "delete", "truncate", "u32"]),
    st.integers(0, 1 << 16),
    st.integers(0, 255),
)


def mutate(raw: bytes, edits) -> bytes:
    buf = bytearray(raw)
    for kind, pos, byte in edits:
        if not buf:
            buf.append(byte)
            continue
        pos %= len(buf)
        if kind == "set":
            buf[pos] = byte
        elif kind == "insert":
            buf.insert(pos, byte)
        elif kind == "delete":
            del buf[pos]
        elif kind == "truncate":
            del buf[pos:]
        elif pos + 4 <= len(buf):  # a length or count field made to lie
            struct.pack_into("<I", buf, pos, [0, 1, 0xFFFFFFFF, 0xFFFFFFFE, byte][byte % 5])
    return bytes(buf)


def outcome(impl, fn, *args, **kwargs):
    """("ok", comparable result) or ("corrupt", message); anything else propagates (a bug)."""
    try:
        result = fn(impl)(*args, **kwargs)
    except CorruptEntry as exc:
        return "corrupt", str(exc)
    return "ok", result


def same_decoded(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "corrupt":
        return a[1] == b[1]
    return a[1].equals(b[1])


@given(valid_entry(), st.lists(edit, min_size=1, max_size=4), st.booleans())
def test_edited_entries_are_corrupt_or_decode_the_same_in_both_twins(raw, edits, verify):
    bad = mutate(raw, edits)
    native = outcome(NATIVE, lambda i: i.decode_entries, [11, 12], [raw, bad], verify=verify)
    twin = outcome(REFERENCE, lambda i: i.decode_entries, [11, 12], [raw, bad], verify=verify)
    assert same_decoded(native, twin), (native, twin)
    if bad == raw:
        assert native[0] == "ok"
        return
    if verify:
        # The checksum covers every byte but its own: any edit is caught, and named.
        assert native == ("corrupt", native[1]) and native[1].startswith("entry 12:"), native
    elif native[0] == "ok":
        # Unverified, an edit that still parses decodes consistently: the first entry is
        # intact and the counts add up.
        decoded = native[1]
        assert decoded.num_entries == 2
        assert decoded.message_count.tolist()[1] == decoded.num_messages - int(
            decoded.first_message[1]
        )
        assert (
            NATIVE.decode_entries([11], [raw]).values()
            == decoded.values()[: int(decoded.first_message[1])]
        )


@given(st.one_of(st.binary(max_size=120), valid_entry()), st.booleans())
def test_headers_of_random_bytes_agree_in_both_twins(raw, verify):
    native = outcome(NATIVE, lambda i: i.decode_header, raw, verify=verify)
    twin = outcome(REFERENCE, lambda i: i.decode_header, raw, verify=verify)
    assert native == twin
    if native[0] == "ok" and verify:
        assert native[1] == NATIVE.decode_header(raw)
        assert native[1].message_count == NATIVE.decode_entries([0], [raw]).num_messages


@given(st.lists(st.one_of(st.binary(max_size=80), valid_entry()), min_size=1, max_size=4))
def test_header_columns_of_random_bytes_agree(bufs):
    def run(impl):
        try:
            return ("ok", [c.tolist() for c in impl.header_columns(bufs)])
        except CorruptEntry as exc:
            return ("corrupt", str(exc))

    assert run(NATIVE) == run(REFERENCE)


# -- the network protocol ------------------------------------------------------------------

json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
json_args = st.dictionaries(st.text(max_size=8), json_value, max_size=6)


@given(st.binary(max_size=200))
def test_unframe_of_random_bytes_is_a_frame_or_a_value_error(body):
    try:
        args, payload = unframe(body, 150)
    except ValueError as exc:
        assert "request" in str(exc)
        return
    assert isinstance(args, dict) and len(body) <= 150
    assert frame(args, bytes(payload)) == frame(json.loads(body[4 : len(body) - len(payload)]))


@given(json_args, st.binary(max_size=50), st.lists(edit, max_size=3))
def test_frames_round_trip_and_edited_frames_never_crash(args, payload, edits):
    body = frame(args, payload)
    got, rest = unframe(body)
    assert got == args and bytes(rest) == payload
    try:
        got, rest = unframe(mutate(body, edits))
    except ValueError:
        return
    assert isinstance(got, dict)


def _message(data=b"v", **head):
    fields = {
        "id": MessageId(3, 7, 1, -1, 0).serialize().hex(),
        "props": {"a": "b"},
        "key": "k",
        "topic": "persistent://public/default/t",
        "t": 123,
        "r": 0,
    }
    fields.update(head)
    return frame(fields, data)


def test_receive_answers_round_trip():
    msg = decode_message(_message(b"payload"))
    assert msg.data() == b"payload" and msg.properties() == {"a": "b"}
    again = decode_message(encode_message(msg))
    assert again.data() == b"payload" and again.message_id() == msg.message_id()
    batch = messages_to_batch([msg, again])
    assert [m.message_id() for m in batch_to_messages(batch)] == [msg.message_id()] * 2
    # The metadata of a message sent with it travels both ways (a key not UTF-8 too).
    meta = decode_message(_message(b"m", meta=[42, b"\xffk".hex()]))
    assert (meta.event_timestamp(), meta.ordering_key()) == (42, "\udcffk")
    for got in (
        decode_message(encode_message(meta)),
        *batch_to_messages(messages_to_batch([meta])),
    ):
        assert (got.event_timestamp(), got.ordering_key()) == (42, "\udcffk")


@given(
    st.sampled_from(["id", "props", "key", "topic", "t", "r", "meta"]),
    json_value,
    st.booleans(),
)
def test_malformed_receive_answers_are_value_errors(field, value, drop):
    body = _message(**{field: value}) if not drop else None
    if drop and field == "meta":
        body = _message()  # optional: a message without metadata
    elif drop:
        fields = json.loads(_message()[4:-1])
        del fields[field]
        body = frame(fields, b"v")
    try:
        msg = decode_message(body)
    except ValueError as exc:
        assert "malformed" in str(exc)
        return
    # Accepted: every field has its type.
    assert isinstance(msg.properties(), dict) and isinstance(msg.topic_name(), str)
    assert isinstance(msg.message_id(), MessageId)


@given(st.binary(max_size=120))
def test_random_receive_answers_are_value_errors(body):
    try:
        decode_message(body)
    except ValueError:
        pass


@given(
    st.lists(
        st.tuples(
            st.binary(max_size=30),
            st.none() | st.text(max_size=12),
            st.none() | st.text(max_size=4),
            st.none() | st.integers(-5, 5),
            st.none() | st.integers(-5, 5),  # event time
            st.none() | st.binary(max_size=6),  # ordering key, maybe not UTF-8
        ),
        min_size=1,
        max_size=5,
    )
)
def test_dispatch_batches_with_garbage_fields_are_value_errors(rows):
    schema = dispatch_schema()
    batch = pa.RecordBatch.from_pydict(
        {
            "message_id": [r[0] for r in rows],
            "value": [b"x" for _ in rows],
            "key": [r[2] for r in rows],
            "properties": [r[1] for r in rows],
            "topic": ["t" for _ in rows],
            "publish_time": [r[3] for r in rows],
            "redelivery_count": [0 for _ in rows],
            "event_time": [r[4] for r in rows],
            "ordering_key": [r[5] for r in rows],
        },
        schema=schema,
    )
    try:
        msgs = batch_to_messages(batch)
    except ValueError as exc:
        assert "malformed" in str(exc) or "message id" in str(exc).lower()
        return
    assert len(msgs) == len(rows)


def test_dispatch_batches_round_trip_whole_and_sliced():
    """Messages through a dispatch batch come back as they were, from a slice of a batch too
    (a column at an offset); an id of the right size that is no MessageId is refused."""
    msgs = [
        pulsartxn.Message(
            f"v{i}".encode(),
            {"i": str(i)} if i % 2 else None,
            None if i % 3 else f"k{i}",
            (5, i, 2, i % 4 - 1, 4) if i % 2 else MessageId(5, i, 2, -1, 0),
            "persistent://public/default/t",
            1000 + i,
            i % 3,
            None,
            i if i % 4 == 0 else 0,
            "\udcffo" if i % 5 == 0 else None,
        )
        for i in range(12)
    ]

    def fields(m):
        return (
            m.data(),
            m.properties(),
            m.partition_key(),
            m.message_id(),
            m.topic_name(),
            m.publish_timestamp(),
            m.redelivery_count(),
            m.event_timestamp(),
            m.ordering_key(),
        )

    batch = messages_to_batch(msgs)
    assert [fields(m) for m in batch_to_messages(batch)] == [fields(m) for m in msgs]
    assert [fields(m) for m in batch_to_messages(batch.slice(5, 4))] == [
        fields(m) for m in msgs[5:9]
    ]
    assert batch_to_messages(batch.slice(3, 0)) == []
    for bad in (b"M2" + bytes(28), b"M1" + struct.pack("<qq", -1, 3) + bytes(12)):
        ids = [m.message_id().serialize() for m in msgs[:2]] + [bad]
        forged = pa.RecordBatch.from_arrays(
            [pa.array(ids), *batch.slice(0, 3).columns[1:]], schema=dispatch_schema()
        )
        with pytest.raises(ValueError, match="malformed"):
            batch_to_messages(forged)


def test_a_dispatch_batch_of_another_schema_is_a_value_error():
    with pytest.raises(ValueError, match="schema"):
        batch_to_messages(pa.RecordBatch.from_pydict({"value": [b"x"]}))


# -- a real server fed garbage -------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from pulsartxn.server.service import BrokerServer

    broker = pulsartxn.Broker(tmp_path_factory.mktemp("fuzz") / "data", sync=False)
    server = BrokerServer(broker, "127.0.0.1", 0, max_request_bytes=4096)
    raw = flight.FlightClient(f"grpc://127.0.0.1:{server.port}")
    actions = sorted(a.type for a in raw.list_actions())
    yield broker, server, raw, actions
    raw.close()
    server.shutdown_sessions()
    server.shutdown()
    broker.close()


KNOWN = (set(protocol._ERRORS) | {"SessionLost"}) - {"PulsarTxnError"}
SESSION = "fuzz-session-1"


def _call(raw, action, body):
    """None on success, else the error class name the server sent back."""
    try:
        list(raw.do_action(flight.Action(action, body), flight.FlightCallOptions(timeout=30)))
    except flight.FlightServerError as exc:
        return json.loads(exc.extra_info)["type"]
    return None


def _still_serving(raw):
    assert _call(raw, "hello", frame({"version": 1, "session": SESSION})) is None
    assert _call(raw, "keepalive", frame({"session": SESSION})) is None


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), body=st.binary(max_size=64))
def test_garbage_action_bodies_get_an_error_and_change_nothing(served, data, body):
    broker, _, raw, actions = served
    action = data.draw(st.sampled_from(actions + ["no_such_action"]))
    before = broker.topics.known()
    error = _call(raw, action, body)
    if action not in ("hello", "close_session"):
        # Random bytes carry no session (or no frame at all): refused, nothing changed.
        assert error in ("ValueError", "SessionLost"), (action, body, error)
    assert broker.topics.known() == before
    _still_serving(raw)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), args=json_args, payload=st.binary(max_size=8))
def test_ill_typed_arguments_get_a_named_error(served, data, args, payload):
    """Within a session, arguments of any shape: a success or an error of a named class (no
    internal error such as an AttributeError, which would travel as a bare PulsarTxnError)."""
    broker, _, raw, actions = served
    _still_serving(raw)
    action = data.draw(st.sampled_from([a for a in actions if a != "close_session"]))
    args = {**args, "session": SESSION}
    extra = data.draw(
        st.dictionaries(
            st.sampled_from(["topic", "handle", "txn", "id", "messages", "options", "commit"]),
            json_value,
            max_size=3,
        )
    )
    args.update(extra)
    error = _call(raw, action, frame(args, payload))
    assert error is None or error in KNOWN, (action, args, error)
    _still_serving(raw)


BAD_VALUES = [None, True, -1, 2**70, "", "x", [], {}, [None], {"a": None}]
ARG_NAMES = ["topic", "handle", "txn", "id", "messages", "options", "commit", "subscription"]


def test_every_action_with_each_argument_ill_typed(served):
    """Systematically: every action, each argument name alone set to each bad value."""
    broker, _, raw, actions = served
    _still_serving(raw)
    failures = []
    for action in actions:
        if action == "close_session":
            continue
        for name in ARG_NAMES:
            for value in BAD_VALUES:
                args = {"session": SESSION, name: value}
                error = _call(raw, action, frame(args))
                if error is not None and error not in KNOWN:
                    failures.append((action, args, error))
        _still_serving(raw)
    assert failures == []
