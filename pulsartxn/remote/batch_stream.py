"""A remote producer's batch stream: many send_batch calls on one DoPut stream, each batch's
messages taking sequence ids the producer reserved (see RemoteProducer.batch_stream)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from .. import errors
from ..server import protocol
from ..server.protocol import frame
from .bounded import Worker
from .handles import OperationTimedOut, RemoteTransaction, txn_str, unreachable

if TYPE_CHECKING:
    from .producer import RemoteProducer


def first_sequence(seq: int) -> pa.Buffer:
    """A send_batch batch's app metadata: the sequence id of its first message."""
    return pa.py_buffer(json.dumps({"first_sequence": seq}).encode())


_Stream = TypeVar("_Stream", bound="StreamContext")


class StreamContext:
    """``with`` a batch stream: closed when the block ends, cancelled when it raises."""

    def __enter__(self: _Stream) -> _Stream:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()


class BatchStream(StreamContext):
    """See ``RemoteProducer.batch_stream``."""

    def __init__(self, producer: RemoteProducer, txn) -> None:
        self._producer = producer
        self._txn = txn_str(txn)
        self._capability = producer._client._capability_of(self._txn)
        self._handle = txn if isinstance(txn, RemoteTransaction) else None
        self._writer = self._reader = None
        self._worker: Worker | None = None  # the stream's calls run there, once it opens
        self._failed: OperationTimedOut | None = None  # a call that timed out ended it
        self._committed = False  # its transaction's commit closed it
        self._schema = None
        self.count = 0  # messages stored, known once closed

    def write(self, values: pa.Array, keys: pa.Array | None = None) -> None:
        """Queue one batch (`values` binary, `keys` string or None; the first batch fixes
        whether the stream has keys). A broker that does not take it within the operation
        timeout (alive but silent: the stream's window is full) raises Timeout, and the stream
        is over: what it sent may be stored or not, and its transaction can only abort."""
        self._check_usable()
        cols, names = [values], ["value"]
        if keys is not None:
            cols.append(keys)
            names.append("key")
        batch = pa.RecordBatch.from_arrays(cols, names=names)
        if self._schema is not None and batch.schema != self._schema:
            raise ValueError(f"batch schema {batch.schema} differs from the stream's")
        try:
            if self._writer is None:
                self._open(batch.schema)
            with self._producer._on_the_wire():
                first = self._producer._reserve(batch.num_rows)
            writer = self._writer
            self._bounded(
                lambda: writer.write_with_metadata(batch, first_sequence(first)),
                "batch_stream write",
            )
        except flight.FlightUnavailableError as exc:
            raise unreachable(self._producer._client, exc) from None
        except flight.FlightError as exc:
            raise protocol.from_flight_error(exc) from None

    def _open(self, schema: pa.Schema) -> None:
        client = self._producer._client
        command = {
            "handle": self._producer._ensure(),
            "txn": self._txn,
            "capability": self._capability,
            "session": client._session,
        }
        descriptor = flight.FlightDescriptor.for_command(frame(command))
        opened: list = []

        def do_put() -> None:
            opened.append(client._flight.do_put(descriptor, schema, client._options))

        self._worker = Worker("pulsartxn-batch-stream")
        try:
            self._bounded(do_put, "batch_stream write")
        except BaseException:
            # A stream that opens after all (once the broker answers) is dropped then.
            self._worker.stop(lambda: opened and drop_writer(opened[0][0]))
            self._worker = None
            raise
        (self._writer, self._reader), self._schema = opened[0], schema
        if self._handle is not None:
            self._handle._streams.add(self)  # its commit closes it first

    def close(self) -> int:
        """End the stream; returns the messages stored once all of them are durable."""
        if self._committed:
            return self.count  # its transaction's commit closed it
        self._check_usable()
        if self._writer is None:
            return self.count
        writer, reader = self._writer, self._reader
        client = self._producer._client

        def finish():
            writer.done_writing()
            meta = reader.read()
            writer.close()
            return meta

        try:
            meta = self._bounded(finish, "batch_stream close")
        except flight.FlightUnavailableError as exc:
            self.cancel()
            raise unreachable(client, exc) from None
        except flight.FlightError as exc:
            self.cancel()
            raise protocol.from_flight_error(exc) from None
        self._writer = None
        self._worker.stop()
        if self._handle is not None:
            self._handle._streams.discard(self)
        out = json.loads(meta.to_pybytes())
        if self._handle is not None:
            self._handle._stored(out.get("partitions") or [])
        self.count = out["count"]
        return self.count

    def cancel(self) -> None:
        """Drop the stream (after an error: what was sent stays in the transaction)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if self._handle is not None:
            self._handle._streams.discard(self)
        if self._worker.stuck:
            # After the call still running there: the writer is used by one thread at a time.
            self._worker.stop(lambda: drop_writer(writer))
        else:
            drop_writer(writer)  # here: what was written reaches the broker before this returns
            self._worker.stop()

    def _bounded(self, fn, call: str):
        """fn() on the stream's worker within the operation timeout. One that outlasts it
        ends the stream (its writer is dropped once the call returns)."""
        client = self._producer._client
        try:
            return self._worker.call(fn, client._op_timeout_s, lambda: client._timed_out(call))
        except OperationTimedOut as exc:
            self._failed = exc
            if self._handle is not None:
                self._handle._send_failed(exc)  # what it holds of the stream is unknown
            self.cancel()
            raise

    def _close_for_commit(self) -> None:
        """Its transaction commits while it is open: close it, so that every batch written
        is in the transaction (as a commit waits for the sends before it); one that cannot
        be closed fails the transaction, which then aborts."""
        try:
            self.close()
        except errors.PulsarTxnError as exc:
            self._handle._send_failed(exc)
        self._committed = True

    def _check_usable(self) -> None:
        if self._committed:
            raise errors.AlreadyClosed("this batch stream was closed by its transaction's commit")
        if self._failed is not None:
            raise errors.AlreadyClosed(
                f"this batch stream ended when a call timed out: {self._failed}"
            )


def drop_writer(writer) -> None:
    """Close a stream's writer that failed (left to its destructor, Arrow logs the error)."""
    try:
        writer.close()
    except Exception:  # noqa: BLE001 - the caller's error matters more
        pass
