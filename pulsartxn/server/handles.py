"""The remote client's handles: producers, consumers and transactions that live on the broker.

A producer or consumer is a server-side object of the client's session; when the session is
lost (the broker restarted) it is created again under the same name in the new one.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from concurrent.futures import Future
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.flight as flight

from .. import errors
from .._native import TxnID
from ..messaging.consumer import check_count
from ..messaging.message import Message, MessageId
from ..messaging.producer import check_sequence_id
from ..txn.state import TxnState
from ..txn.transaction import TransactionContext
from . import protocol
from .protocol import frame, unframe
from .service import SessionLost

if TYPE_CHECKING:
    from .remote import RemoteClient


def _txn_str(txn) -> str | None:
    if txn is None:
        return None
    if isinstance(txn, RemoteTransaction):
        return str(txn.id)
    if isinstance(txn, TxnID):
        return str(txn)
    if isinstance(txn, str):
        return str(TxnID.parse(txn))
    if isinstance(txn, int) and not isinstance(txn, bool):
        return str(TxnID.from_int(txn))
    raise TypeError(f"txn must be a Transaction or TxnID, not {type(txn).__name__}")


def _mid_hex(msg_or_id) -> str:
    if isinstance(msg_or_id, Message):
        msg_or_id = msg_or_id.message_id()
    if not isinstance(msg_or_id, MessageId):
        raise TypeError(f"expected a Message or MessageId, not {type(msg_or_id).__name__}")
    return msg_or_id.serialize().hex()


class _Handle:
    """A server-side object re-created in a new session when the old one is lost."""

    def __init__(self, client: RemoteClient) -> None:
        self._client = client
        self._handle = None
        self._generation = -1
        self._closed = False

    def _ensure(self) -> int:
        if self._closed:
            raise errors.AlreadyClosed(f"{type(self).__name__} is closed")
        if self._generation != self._client._generation or self._handle is None:
            generation = self._client._generation
            self._handle = self._create()
            self._generation = generation
        return self._handle

    # Subclasses define close(), which a with-block calls on exit.

    def _close_remote(self, action: str, handle) -> None:
        """Close the server-side object, if it belongs to the live session (one of a lost
        session went with it); the server's errors are not the caller's concern here."""
        if handle is not None and self._generation == self._client._generation:
            try:
                self._client._raw(action, {"handle": handle})
            except errors.PulsarTxnError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SEND_BATCH_BYTES = 8 << 20  # a send_batch goes out in record batches of about this many bytes


class BatchStream:
    """See ``RemoteProducer.batch_stream``."""

    def __init__(self, producer: RemoteProducer, txn) -> None:
        self._producer = producer
        self._txn = _txn_str(txn)
        self._capability = producer._client._capability_of(self._txn)
        self._handle = txn if isinstance(txn, RemoteTransaction) else None
        self._writer = self._reader = None
        self._schema = None
        self.count = 0  # messages stored, known once closed

    def write(self, values: pa.Array, keys: pa.Array | None = None) -> None:
        """Queue one batch (`values` binary, `keys` string or None; the first batch fixes
        whether the stream has keys)."""
        cols, names = [values], ["value"]
        if keys is not None:
            cols.append(keys)
            names.append("key")
        batch = pa.RecordBatch.from_arrays(cols, names=names)
        try:
            if self._writer is None:
                client = self._producer._client
                command = frame(
                    {
                        "handle": self._producer._ensure(),
                        "txn": self._txn,
                        "capability": self._capability,
                        "session": client._session,
                    }
                )
                self._schema = batch.schema
                self._writer, self._reader = client._flight.do_put(
                    flight.FlightDescriptor.for_command(command), batch.schema, client._options
                )
            elif batch.schema != self._schema:
                raise ValueError(f"batch schema {batch.schema} differs from the stream's")
            self._writer.write_batch(batch)
        except flight.FlightError as exc:
            raise protocol.from_flight_error(exc) from None

    def close(self) -> int:
        """End the stream; returns the messages stored once all of them are durable."""
        if self._writer is None:
            return self.count
        writer, self._writer = self._writer, None
        try:
            writer.done_writing()
            meta = self._reader.read()
            writer.close()
        except flight.FlightError as exc:
            raise protocol.from_flight_error(exc) from None
        out = json.loads(meta.to_pybytes())
        if self._handle is not None:
            self._handle._stored(out.get("partitions") or [])
        self.count = out["count"]
        return self.count

    def cancel(self) -> None:
        """Drop the stream (after an error: what was sent stays in the transaction)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the caller's error matters more
                pass

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()


class RemoteProducer(_Handle):
    def __init__(self, client, topic, producer_name, options) -> None:
        super().__init__(client)
        self._topic = topic
        self._options = {k: v for k, v in options.items() if v is not None}
        self.name = producer_name
        self._seq_lock = threading.Lock()
        self._last_sequence = -1
        self._queue: list = []
        self._cond = threading.Condition()
        self._inflight = 0
        self._flushing = 0
        self._worker: threading.Thread | None = None
        # Client-side batching, as the embedded producer batches: a batch is one call (and one
        # entry on the broker), sent when full, after the publish delay, or on flush().
        self._batching = options.get("batching_enabled", True)
        self._max_messages = options.get("batching_max_messages") or 1000
        self._max_bytes = options.get("batching_max_allowed_size_in_bytes") or 128 * 1024
        delay = options.get("batching_max_publish_delay_ms")
        self._delay = (1.0 if delay is None else delay) / 1000.0
        self._queued_bytes = 0
        self._ensure()

    def _create(self) -> int:
        opts = dict(self._options)
        if self.name is not None:
            opts["producer_name"] = self.name
        out = self._client._raw("create_producer", {"topic": self._topic, "options": opts})
        info = unframe(out[0], 1 << 62)[0]
        self.name = info["name"]
        with self._seq_lock:
            self._last_sequence = max(self._last_sequence, info["last_sequence"])
        return info["handle"]

    def topic(self) -> str:
        return self._topic

    def producer_name(self) -> str:
        return self.name

    def _next_seq(self, sequence_id):
        check_sequence_id(sequence_id)  # a refused id must not move the ids assigned after it
        with self._seq_lock:
            if sequence_id is None:
                sequence_id = self._last_sequence + 1
            self._last_sequence = max(self._last_sequence, sequence_id)
            return sequence_id

    def _send_many(self, items, txn, handle=None) -> list:
        msgs, payloads = [], []
        for content, props, key, seq in items:
            msgs.append({"n": len(content), "props": props, "key": key, "seq": seq})
            payloads.append(content)
        out = self._client._json(
            "send_many",
            {"messages": msgs, "txn": txn, "capability": self._client._capability_of(txn)},
            b"".join(payloads),
            owner=self,
        )
        if handle is not None:
            handle._stored(out.get("partitions") or [])
        results = []
        for mid, err in zip(out["ids"], out["errors"]):
            if err is not None:
                cls = protocol._ERRORS.get(err[0], errors.PulsarTxnError)
                results.append(cls(err[1]))
            else:
                results.append(MessageId.deserialize(bytes.fromhex(mid)))
        return results

    @staticmethod
    def _check(content):
        if isinstance(content, (bytearray, memoryview)):
            content = bytes(content)
        if not isinstance(content, bytes):
            raise TypeError(f"content must be bytes, not {type(content).__name__}")
        return content

    def send(self, content, properties=None, partition_key=None, sequence_id=None, txn=None):
        content = self._check(content)
        self.flush()
        seq = self._next_seq(sequence_id)
        handle = txn if isinstance(txn, RemoteTransaction) else None
        (result,) = self._send_many(
            [(content, properties, partition_key, seq)], _txn_str(txn), handle
        )
        if isinstance(result, BaseException):
            raise result
        return result

    def send_async(
        self,
        content,
        properties=None,
        partition_key=None,
        sequence_id=None,
        txn=None,
        callback=None,
    ) -> Future:
        """Queued and sent in batches by a worker (whatever accumulates while one call is in
        flight goes in the next)."""
        content = self._check(content)
        fut: Future = Future()
        if isinstance(txn, RemoteTransaction):
            txn.producers.add(self)
        if callback is not None:
            fut.add_done_callback(
                lambda f: callback(f.exception(), None if f.exception() else f.result())
            )
        with self._cond:
            if self._closed:
                raise errors.AlreadyClosed(f"producer {self.name} is closed")
            seq = self._next_seq(sequence_id)
            handle = txn if isinstance(txn, RemoteTransaction) else None
            self._queue.append(
                (
                    (content, properties, partition_key, seq),
                    _txn_str(txn),
                    fut,
                    time.monotonic(),
                    handle,
                )
            )
            self._queued_bytes += len(content)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True)
                self._worker.start()
            self._cond.notify_all()
        return fut

    def _ready(self) -> float:
        """0 when the head batch should go now, else how long to wait (lock held)."""
        q = self._queue
        if not q:
            return 0.5
        if (
            not self._batching
            or self._flushing
            or self._closed
            or len(q) >= self._max_messages
            or self._queued_bytes >= self._max_bytes
            or q[0][1] != q[-1][1]  # another transaction queued behind: send this one
        ):
            return 0.0
        return max(self._delay - (time.monotonic() - q[0][3]), 0.0)

    def _work(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._queue and self._closed:
                        return
                    wait = self._ready()
                    if self._queue and wait == 0.0:
                        break
                    self._cond.wait(wait)
                # One call per transaction (or none) at the head of the queue, in order.
                txn = self._queue[0][1]
                take = []
                limit = self._max_messages if self._batching else 1
                while self._queue and self._queue[0][1] == txn and len(take) < limit:
                    item = self._queue.pop(0)
                    self._queued_bytes -= len(item[0][0])
                    take.append(item)
                self._inflight += 1
            try:
                results = self._send_many([t[0] for t in take], txn, take[0][4])
                for (_, _, fut, _, _), res in zip(take, results):
                    if isinstance(res, BaseException):
                        fut.set_exception(res)
                    else:
                        fut.set_result(res)
            except BaseException as exc:  # noqa: BLE001 - every future of the call gets it
                for _, _, fut, _, _ in take:
                    fut.set_exception(exc)
            finally:
                with self._cond:
                    self._inflight -= 1
                    self._cond.notify_all()

    def send_batch(self, values, keys=None, txn=None) -> int:
        self.flush()
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            value_col = values
        else:
            values = list(values)
            for v in values:
                if not isinstance(v, (bytes, bytearray, memoryview)):
                    raise TypeError(f"values must be bytes, not {type(v).__name__}")
            value_col = pa.array(values, pa.binary())
        if keys is not None and len(keys) != len(value_col):
            raise ValueError(f"keys has {len(keys)} items for {len(value_col)} values")
        cols, names = [value_col], ["value"]
        if keys is not None:
            cols.append(keys if isinstance(keys, pa.Array) else pa.array(list(keys), pa.string()))
            names.append("key")
        table = pa.Table.from_arrays(cols, names=names)
        command = frame(
            {
                "handle": self._ensure(),
                "txn": _txn_str(txn),
                "capability": self._client._capability_of(_txn_str(txn)),
                "session": self._client._session,
            }
        )
        try:
            writer, reader = self._client._flight.do_put(
                flight.FlightDescriptor.for_command(command), table.schema, self._client._options
            )
            for batch in protocol.table_batches(table, SEND_BATCH_BYTES):
                writer.write_batch(batch)
            writer.done_writing()
            meta = reader.read()
            writer.close()
        except flight.FlightError as exc:
            raise protocol.from_flight_error(exc) from None
        out = json.loads(meta.to_pybytes())
        if isinstance(txn, RemoteTransaction):
            txn._stored(out.get("partitions") or [])
        return out["count"]

    def batch_stream(self, txn=None) -> BatchStream:
        """Many ``send_batch`` calls on one DoPut stream: each batch goes out as it is written
        and the server stores each as one ``send_batch``, in order, while the caller prepares
        the next; ``close()`` waits until the last one is durable and returns the count."""
        self.flush()
        return BatchStream(self, txn)

    def flush(self) -> None:
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._queue or self._inflight:
                    self._cond.wait(0.5)
            finally:
                self._flushing -= 1
        if self._handle is not None and not self._closed:
            self._client._call("flush", {}, owner=self)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        handle = self._handle
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._close_remote("close_producer", handle)


class RemoteConsumer(_Handle):
    def __init__(self, client, topic, subscription, options) -> None:
        super().__init__(client)
        self._topic = topic
        self._subscription = subscription
        self._options = options
        self._ensure()

    def _create(self) -> int:
        out = self._client._raw(
            "subscribe",
            {"topic": self._topic, "subscription": self._subscription, "options": self._options},
        )
        info = unframe(out[0], 1 << 62)[0]
        # A reconnect subscribes again under the same name.
        self._options = {**self._options, "consumer_name": info["name"]}
        return info["handle"]

    def topic(self) -> str:
        return self._topic

    def consumer_name(self) -> str:
        return self._options["consumer_name"]

    def subscription_name(self) -> str:
        return self._subscription

    def receive(self, timeout_millis=None) -> Message:
        """The server waits at most its MAX_WAIT_MS a call: a longer wait asks again."""
        check_count("timeout_millis", timeout_millis, least=0, optional=True)
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        while True:
            left = None if deadline is None else max(int((deadline - time.monotonic()) * 1000), 0)
            try:
                (body,) = self._client._call("receive", {"timeout_millis": left}, owner=self)
            except errors.Timeout:
                if deadline is None or time.monotonic() < deadline:
                    continue  # the server's wait ended before ours
                raise
            return protocol.decode_message(body)

    def batch_receive(self, max_num_messages=1000, timeout_millis=100) -> list[Message]:
        """Dispatch as a DoGet stream of record batches of about 4 MiB each."""
        check_count("max_num_messages", max_num_messages, least=1)
        check_count("timeout_millis", timeout_millis, least=0)
        client = self._client
        for attempt in (0, 1):
            ticket = frame(
                {
                    "op": "receive",
                    "handle": self._ensure(),
                    "max_num_messages": max_num_messages,
                    "timeout_millis": timeout_millis,
                    "session": client._session,
                }
            )
            try:
                table = client._flight.do_get(flight.Ticket(ticket), client._options).read_all()
            except flight.FlightError as exc:
                err = protocol.from_flight_error(exc)
                if isinstance(err, SessionLost) and not attempt:
                    client._reopen()
                    continue
                raise err from None
            out = []
            for batch in table.to_batches():
                out.extend(protocol.batch_to_messages(batch))
            return out
        raise AssertionError("unreachable")

    def _ack(self, msg_or_id, txn, cumulative: bool) -> None:
        out = self._client._json(
            "ack",
            {
                "id": _mid_hex(msg_or_id),
                "txn": _txn_str(txn),
                "capability": self._client._capability_of(_txn_str(txn)),
                "cumulative": cumulative,
            },
            owner=self,
        )
        if isinstance(txn, RemoteTransaction) and out.get("participant"):
            key = tuple(out["participant"])
            txn.ack_counts[key] = txn.ack_counts.get(key, 0) + 1

    def acknowledge(self, msg_or_id, txn=None) -> None:
        self._ack(msg_or_id, txn, False)

    def acknowledge_cumulative(self, msg_or_id, txn=None) -> None:
        self._ack(msg_or_id, txn, True)

    def negative_acknowledge(self, msg_or_id) -> None:
        self._client._call("nack", {"id": _mid_hex(msg_or_id)}, owner=self)

    def redeliver_unacknowledged_messages(self) -> None:
        self._client._call("redeliver", {}, owner=self)

    def has_message_available(self) -> bool:
        return self._client._json("has_message_available", {}, owner=self)["value"]

    def get_last_message_id(self) -> MessageId:
        out = self._client._json("get_last_message_id", {}, owner=self)
        return MessageId(*out["id"])

    def unsubscribe(self) -> None:
        self._client._call("unsubscribe", {}, owner=self)
        self._closed = True

    def close(self) -> None:
        if self._closed:
            return
        handle = self._handle
        self._closed = True
        self._close_remote("close_consumer", handle)


class RemoteTransaction(TransactionContext):
    def __init__(
        self, client: RemoteClient, txn_id: TxnID, counted: bool = True, capability=None
    ) -> None:
        self._client = client
        self.id = txn_id
        # The secret that lets another session end or use it: give it, with the id, to the
        # process that is to (client.transaction(id, capability=...)).
        self.capability = capability
        # Acks per (partition, subscription) and messages per partition made through this
        # handle; `counted`: it opened the transaction, so they are all of them (its commit
        # states them, and the broker checks it still holds them).
        self.ack_counts: dict = {}
        self.send_counts: dict = {}
        self.counted = counted
        self.producers: weakref.WeakSet = weakref.WeakSet()  # with queued sends of this txn

    def _stored(self, partitions) -> None:
        for name, n in partitions:
            self.send_counts[name] = self.send_counts.get(name, 0) + n

    @property
    def state(self) -> TxnState:
        out = self._client._json("txn_state", {"txn": str(self.id), "capability": self.capability})
        return TxnState(out["state"])

    def flush_for_commit(self) -> None:
        for producer in list(self.producers):
            producer.flush()  # everything sent in the transaction lands before its end

    def _end(self, commit: bool, timeout_ms) -> None:
        if commit:
            self.flush_for_commit()
        retries = self._client._retries
        try:
            self._client._json(
                "end",
                {
                    "txn": str(self.id),
                    "capability": self.capability,
                    "commit": commit,
                    "timeout_ms": timeout_ms,
                    "counted": self.counted,
                    "expected_acks": [[list(k), n] for k, n in self.ack_counts.items()],
                    "expected_sends": sorted(self.send_counts.items()),
                },
            )
        except errors.InvalidTxnStatus:
            # Re-sent after a lost connection, the first attempt may have gone through.
            wanted = TxnState.COMMITTED if commit else TxnState.ABORTED
            if self._client._retries == retries or self.state is not wanted:
                raise

    def commit(self, timeout_ms=None) -> None:
        self._end(True, timeout_ms)

    def abort(self, timeout_ms=None) -> None:
        self._end(False, timeout_ms)

    def __repr__(self) -> str:
        return f"RemoteTransaction({self.id})"
