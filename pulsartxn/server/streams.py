"""The server's streams: bulk produce (DoPut: record batches written as they come) and
dispatch and scans (DoGet: record batches of a bounded size). Part of ``BrokerServer``."""

from __future__ import annotations

import json
import weakref

import pyarrow as pa
import pyarrow.flight as flight

from .. import errors
from .._native.entryformat import READ_SCHEMA
from ..messaging.message import MessageId
from . import protocol
from .protocol import unframe

STREAM_INFLIGHT = 4  # send_batch writes of one DoPut stream in flight before the next waits
STREAM_BATCH_BYTES = 4 << 20  # payload bytes per record batch of a dispatch stream


class Streams:
    """DoPut and DoGet of ``BrokerServer`` (which defines the helpers they call)."""

    def do_put(self, context, descriptor, reader, writer):
        try:
            self._role(context)
            args, _ = unframe(descriptor.command, self.max_request_bytes)
            protocol.check_args("send_batch stream", args, protocol.PUT_ARGS)
            s = self.sessions.get(args)
            p = self._producer(s, args)
            txn = self.sessions.txn(s, args.get("txn"), capability=args.get("capability"))
            release = self.sessions.stream(s)
            try:
                out = self._stored(p, txn, reader, context)
            finally:
                release()
            writer.write(pa.py_buffer(json.dumps(out).encode()))
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise protocol.to_flight_error(exc) from None

    def _stored(self, p, txn, reader, context) -> dict:
        """A DoPut's batches, each stored as one send_batch as it comes; the answer."""
        total = 0
        size = 0
        stored: dict = {}
        # A stream's batches are written as they come (the writer thread commits one while
        # the next is read), and the answer waits until all are durable; a few in flight.
        inflight: list = []
        _check_columns(reader.schema.names)  # before anything of the stream is stored
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
                keys = batch.column("key") if "key" in batch.schema.names else None
                n, futures, t, parts = p._submit_batch(
                    batch.column("value"), keys, txn, False, first_sequence=_first(chunk)
                )
                total += n
                for topic, k in parts.items():
                    stored[topic] = stored.get(topic, 0) + k
                inflight.append((futures, t))
                while len(inflight) > STREAM_INFLIGHT:
                    p._wait_batches(*inflight.pop(0))
        finally:
            for futures, t in inflight:
                p._wait_batches(futures, t)
        if context.is_cancelled():  # its connection was closed: the broker is stopping
            raise flight.FlightUnavailableError("the broker is stopping")
        self._settle(txn)
        return {"count": total, "partitions": sorted(stored.items()) if txn else []}

    def do_get(self, context, ticket):
        try:
            self._role(context)
            args, _ = unframe(ticket.ticket, self.max_request_bytes)
            op = args.get("op")
            if op not in protocol.GET_ARGS:
                raise ValueError(f"unknown stream {errors.excerpt(op)}")
            protocol.check_args(f"{op} stream", args, protocol.GET_ARGS[op])
            s = self.sessions.get(args)
            if op == "receive":
                # Dispatch to a consumer: what batch_receive gives, as one record batch.
                consumer = self._consumer(s, args)
                n = args.get("max_num_messages", 1000)
                wait = capped_wait(args.get("timeout_millis", 100), self.max_wait_ms)
                with self.sessions.waiting(s):
                    msgs = self.replays.run(
                        consumer, args, lambda: consumer.batch_receive(n, wait), "batch_receive"
                    )
                # Streamed in batches of a bounded size (a message past it goes alone).
                return flight.GeneratorStream(
                    protocol.dispatch_schema(), protocol.message_batches(msgs, STREAM_BATCH_BYTES)
                )
            start, end = args.get("start"), args.get("end")
            if isinstance(start, str):
                start = MessageId.deserialize(bytes.fromhex(start))
            if isinstance(end, str):
                end = MessageId.deserialize(bytes.fromhex(end))
            release = self.sessions.stream(s)
            try:
                self._serve_topic(args["topic"], create=False)
                batches = s.client.scan(args["topic"], start, end)
            except BaseException:
                release()
                raise
            return flight.GeneratorStream(READ_SCHEMA(), _Releasing(batches, release))
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise protocol.to_flight_error(exc) from None


class _Releasing:
    """A stream's batches that release its slot once they end, fail, or are dropped unread
    (a client that cancels before reading)."""

    def __init__(self, batches, release) -> None:
        self._batches = iter(batches)
        self._done = weakref.finalize(self, release)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._batches)
        except BaseException:
            self._done()
            raise


SEND_BATCH_COLUMNS = ("value", "key")


def _check_columns(names) -> None:
    """A send_batch stream's columns: 'value', and 'key' or not; any other (a misspelt
    'keys', say) is refused rather than dropped without a word."""
    unknown = [n for n in names if n not in SEND_BATCH_COLUMNS]
    if unknown or "value" not in names or len(set(names)) != len(names):
        raise ValueError(
            f"send_batch batches take the columns 'value' (binary) and optionally 'key' "
            f"(string), not {list(names)}"
        )


def _first(chunk):
    """The sequence id a remote producer reserved for a streamed batch's first message (its
    app metadata), or None: the broker assigns them."""
    meta = chunk.app_metadata
    if meta is None or not meta.size:
        return None
    if meta.size > 64:
        raise ValueError("a send_batch batch's metadata is too long")
    try:
        return json.loads(meta.to_pybytes())["first_sequence"]
    except (ValueError, TypeError, KeyError):
        raise ValueError("malformed send_batch batch metadata") from None


def capped_wait(timeout_millis, cap: int):
    """A wait asked for (None: for ever), at most `cap` ms (bad values are the callee's to
    refuse)."""
    if timeout_millis is None:
        return cap
    if isinstance(timeout_millis, int) and not isinstance(timeout_millis, bool):
        return min(timeout_millis, cap)
    return timeout_millis
