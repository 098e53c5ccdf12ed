"""The remote client's producers: messages batched client-side, sent with explicit
sequence ids (a re-send after a reconnect is stored once), bulk sends as DoPut streams.
A send not stored within send_timeout_millis of its call fails with Timeout, as Pulsar's."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from .. import errors
from .._native import TxnID
from .._native.keywords import strict_class
from .._native.types import MAX_SEQUENCE_ID, sequences_used_up
from ..messaging.message import MessageId
from ..messaging.metadata import message_metadata
from ..messaging.producer import check_sequence_id
from ..messaging.send_options import check_callback, with_callback
from ..messaging.topic_name import TopicName
from ..server import protocol
from ..server.protocol import frame
from .batch_stream import BatchStream, first_sequence
from .handles import (
    CLOSE_TIMEOUT_S,
    TIMED_OUT,
    Handle,
    RemoteTransaction,
    SendTimedOut,
    txn_str,
    unreachable,
)

SEND_BATCH_BYTES = 8 << 20  # a send_batch goes out in record batches of about this many bytes


@strict_class
class RemoteProducer(Handle):
    def __init__(self, client, topic, producer_name, options, send_timeout_millis=0) -> None:
        super().__init__(client)
        self._send_timeout_ms = send_timeout_millis  # 0: none (retried up to reconnect)
        self._last_timeout: BaseException | None = None  # of the last send; flush() raises it
        self._topic = topic
        self._options = {k: v for k, v in options.items() if v is not None}
        self.name = producer_name
        self._seq_lock = threading.Lock()
        self._wire = threading.Lock()  # held by the call on the wire (see _on_the_wire)
        self._last_sequence = -1
        self._queue: list = []
        self._cond = threading.Condition()
        self._inflight = 0
        self._flushing = 0
        self._worker: threading.Thread | None = None
        self._streams: weakref.WeakSet = weakref.WeakSet()  # its batch streams still open
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
        info = self._client._create("create_producer", {"topic": self._topic, "options": opts})
        self.name = info["name"]
        with self._seq_lock:
            self._last_sequence = max(self._last_sequence, info["last_sequence"])
        return info["handle"]

    def topic(self) -> str:
        """The topic's full name (persistent://tenant/namespace/name), as the broker's."""
        return TopicName.parse(self._topic).full

    def producer_name(self) -> str:
        return self.name

    def last_sequence_id(self) -> int:
        """The highest sequence id this producer has assigned or the broker has stored."""
        with self._seq_lock:
            return self._last_sequence

    def _reserve(self, n: int) -> int:
        """The first of `n` sequence ids taken for a send_batch: every message a producer
        sends has an id of its own, or the broker takes a later one for a duplicate."""
        with self._seq_lock:
            first = self._last_sequence + 1
            if first + n - 1 > MAX_SEQUENCE_ID:
                raise sequences_used_up(self.name, self._topic)
            self._last_sequence += n
            return first

    def _next_seq(self, sequence_id):
        check_sequence_id(sequence_id)  # a refused id must not move the ids assigned after it
        with self._seq_lock:
            if sequence_id is None:
                sequence_id = self._last_sequence + 1
            self._last_sequence = max(self._last_sequence, sequence_id)
            return sequence_id

    def _send_many(self, items, txn, handle=None) -> list:
        msgs, payloads = [], []
        for content, props, key, seq, meta in items:
            msg = {"n": len(content), "props": props, "key": key, "seq": seq}
            if meta is not None:  # (event time, deliver at, ordering key): wire_metadata
                msg["meta"] = protocol.wire_metadata(meta)
            msgs.append(msg)
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
                results.append(protocol.error_named(err[0], err[1]))
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

    def send(
        self,
        content: bytes,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        sequence_id: int | None = None,
        txn: RemoteTransaction | TxnID | None = None,
        *,
        ordering_key: str | bytes | None = None,
        event_timestamp: int | None = None,
        deliver_after_ms: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> MessageId:
        """Send one message; durable when it returns (Timeout if not within the send timeout
        of this call)."""
        content = self._check(content)
        meta = message_metadata(
            ordering_key, event_timestamp, deliver_after_ms, deliver_at, deliver_after
        )
        handle = txn if isinstance(txn, RemoteTransaction) else None
        seq = None
        try:
            with self._sending(time.monotonic()):
                self._answered()
                with self._on_the_wire():
                    seq = self._next_seq(sequence_id)
                    (result,) = self._send_many(
                        [(content, properties, partition_key, seq, meta)], txn_str(txn), handle
                    )
        except TIMED_OUT as exc:
            what = "message" if seq is None else f"message {seq}"
            raise self._outcome(self._timed_out(what, exc, handle)) from None
        if isinstance(result, BaseException):
            raise result
        self._outcome(None)
        return result

    def _deadline(self):
        """The SendDeadline of the calls this producer makes."""
        return self._client._deadline

    @contextlib.contextmanager
    def _on_the_wire(self) -> Iterator[None]:
        """This producer's one call on the wire: sequence ids are taken inside, so the broker
        gets them in order (one below the highest it has is taken for a duplicate). Waits no
        longer than the send's deadline (SendTimedOut)."""
        left = self._deadline().left()
        if not self._wire.acquire(timeout=-1 if left is None else left):
            raise SendTimedOut("another send of this producer was not answered in time")
        try:
            yield
        finally:
            self._wire.release()

    def _sending(self, start: float):
        """The calls made in this block end by `start` + send_timeout_millis (SendTimedOut)."""
        if not self._send_timeout_ms:
            return contextlib.nullcontext()
        return self._deadline().until(start + self._send_timeout_ms / 1000.0)

    def _timed_out(self, what: str, cause, handle=None) -> errors.Timeout:
        """The Timeout of `what`; a transaction it was sent in can only abort now."""
        exc = errors.Timeout(
            f"producer {self.name}: {what} timed out (send_timeout_millis="
            f"{self._send_timeout_ms}): {cause}; it may have been stored all the same, and a "
            "re-send with the same sequence id is stored once"
        )
        if handle is not None:
            handle._send_failed(exc)
        return exc

    def _outcome(self, exc: BaseException | None) -> BaseException | None:
        """Record how the last send ended (its Timeout, or None once stored)."""
        with self._cond:
            self._last_timeout = exc
        return exc

    def send_async(
        self,
        content: bytes,
        callback: Callable[[Any, MessageId | None], None] | None = None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        sequence_id: int | None = None,
        txn: RemoteTransaction | None = None,
        *,
        ordering_key: str | bytes | None = None,
        event_timestamp: int | None = None,
        deliver_after_ms: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> Future:
        """Queued and sent in batches by a worker (whatever accumulates while one call is in
        flight goes in the next)."""
        content = self._check(content)
        check_callback(callback)
        meta = message_metadata(
            ordering_key, event_timestamp, deliver_after_ms, deliver_at, deliver_after
        )
        fut: Future = Future()
        if isinstance(txn, RemoteTransaction):
            txn._producers.add(self)
        if callback is not None:
            with_callback(fut, callback)
        check_sequence_id(sequence_id)
        with self._cond:
            if self._closed:
                raise errors.AlreadyClosed(f"producer {self.name} is closed")
            handle = txn if isinstance(txn, RemoteTransaction) else None
            self._queue.append(
                (
                    # Its sequence id (None: the next) is taken when it goes on the wire.
                    (content, properties, partition_key, sequence_id, meta),
                    txn_str(txn),
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
                try:
                    with self._sending(take[0][3]), self._on_the_wire():  # the oldest's timeout
                        take = [
                            ((c, p, k, self._next_seq(q), m), *rest)
                            for (c, p, k, q, m), *rest in take
                        ]
                        results = self._send_many([t[0] for t in take], txn, take[0][4])
                except TIMED_OUT as exc:
                    self._time_out(take, exc)
                    continue
                for (_, _, fut, _, _), res in zip(take, results):
                    if isinstance(res, BaseException):
                        fut.set_exception(res)
                    else:
                        fut.set_result(res)
                self._outcome(None)
            except BaseException as exc:  # noqa: BLE001 - every future of the call gets it
                for _, _, fut, _, _ in take:
                    if not fut.done():
                        fut.set_exception(exc)
            finally:
                with self._cond:
                    self._inflight -= 1
                    self._cond.notify_all()

    def _time_out(self, take: list, cause) -> None:
        """The oldest pending message timed out: it and every message queued after it fail
        (as Pulsar's producer fails its pending queue), so none lands after one that failed."""
        with self._cond:
            take = take + self._queue
            self._queue = []
            self._queued_bytes = 0
        last = None
        for (_, _, _, seq, _), _, fut, _, handle in take:
            what = "message" if seq is None else f"message {seq}"  # None: never on the wire
            last = self._timed_out(what, cause, handle)
            fut.set_exception(last)
        self._outcome(last)

    def send_batch(
        self,
        values: Sequence[bytes] | pa.Array | pa.ChunkedArray,
        keys: Sequence[str | bytes | None] | pa.Array | None = None,
        txn: RemoteTransaction | TxnID | None = None,
    ) -> int:
        """Store `values` (and their `keys`) as messages; the count once durable (Timeout
        if not within the send timeout: some of them may have been stored)."""
        handle = txn if isinstance(txn, RemoteTransaction) else None
        try:
            with self._sending(time.monotonic()):
                count = self._send_table(values, keys, txn)
        except TIMED_OUT as exc:
            raise self._outcome(self._timed_out("send_batch", exc, handle)) from None
        self._outcome(None)
        return count

    def _send_table(self, values, keys, txn) -> int:
        self._answered()
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
                "txn": txn_str(txn),
                "capability": self._client._capability_of(txn_str(txn)),
                "session": self._client._session,
            }
        )
        options = self._client._call_options()
        error: BaseException | None = None
        try:
            writer, reader = self._client._flight.do_put(
                flight.FlightDescriptor.for_command(command), table.schema, options
            )
            with self._on_the_wire():  # after the ids of sends on the wire before it
                first = self._reserve(table.num_rows)
            for batch in protocol.table_batches(table, SEND_BATCH_BYTES):
                writer.write_with_metadata(batch, first_sequence(first))
                first += batch.num_rows
            writer.done_writing()
            meta = reader.read()
            writer.close()
        except flight.FlightUnavailableError as exc:
            # Not re-sent: the broker may have stored some of it (a re-send takes new ids).
            error = unreachable(self._client, exc)
        except flight.FlightTimedOutError:
            error = self._client._unanswered("send_batch")
        except flight.FlightError as exc:
            error = protocol.from_flight_error(exc)
        if error is not None:
            if txn is not None:
                # What the broker holds of it is unknown (its slices are stored one by one,
                # and an answer can be lost): the transaction can only abort, as Pulsar's
                # whose send failed; a commit through any handle or by id says so.
                self._client._streams.failed(txn_str(txn), error)
                if isinstance(txn, RemoteTransaction):
                    txn._send_failed(error)
            raise error
        out = json.loads(meta.to_pybytes())
        if isinstance(txn, RemoteTransaction):
            txn._stored(out.get("partitions") or [])
        return out["count"]

    def batch_stream(self, txn: RemoteTransaction | TxnID | None = None) -> BatchStream:
        """Many ``send_batch`` calls on one DoPut stream: each batch goes out as it is written
        and the server stores each as one ``send_batch``, in order, while the caller prepares
        the next; ``close()`` waits until the last one is durable and returns the count."""
        self._answered()
        return BatchStream(self, txn)

    def flush(self) -> None:
        """Wait until every message sent so far is stored or failed; raises the Timeout of
        the last one sent if it timed out (once, as Pulsar's flush)."""
        try:
            with self._sending(time.monotonic()):
                self._flush()
        except TIMED_OUT as exc:
            raise errors.Timeout(
                f"producer {self.name}: flush timed out (send_timeout_millis="
                f"{self._send_timeout_ms}): {exc}"
            ) from None
        with self._cond:
            exc, self._last_timeout = self._last_timeout, None
        if exc is not None:
            raise exc

    def _flush(self) -> None:
        self._answered()
        if self._handle is not None and not self._closed:
            self._client._call("flush", {}, owner=self)

    def _answered(self) -> None:
        """Send what is queued and wait until every call is answered: then all of it is
        durable or failed (the broker answers a send_many once its messages are durable, so
        nothing of this producer waits there, and a send after this lands after them). Waits
        no longer than the thread's send deadline (SendTimedOut)."""
        deadline = self._deadline()
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._queue or self._inflight:
                    left = deadline.left()
                    self._cond.wait(0.5 if left is None else min(left, 0.5))
            finally:
                self._flushing -= 1

    def close(self) -> None:
        """Close its open batch streams (what was written to them is stored), send what is
        queued and close, within CLOSE_TIMEOUT_S: what the broker did not take by then fails
        (AlreadyClosed; a call on the wire ends with its own outcome)."""
        if self._closed:
            return
        try:
            with self._deadline().until(time.monotonic() + CLOSE_TIMEOUT_S):
                for stream in list(self._streams):
                    stream._close_for("its producer's close")
                self._flush()
        except errors.PulsarTxnError:
            pass  # the broker is down or silent: closed here, its session expires there
        handle = self._handle
        with self._cond:
            self._closed = True
            dropped, self._queue = self._queue, []
            self._queued_bytes = 0
            self._cond.notify_all()
        for _, _, fut, _, _ in dropped:
            fut.set_exception(
                errors.AlreadyClosed(f"producer {self.name} closed before the message was sent")
            )
        self._close_remote("close_producer", handle)
