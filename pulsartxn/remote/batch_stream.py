"""A remote producer's batch stream: many send_batch calls on one DoPut stream, each batch's
messages taking sequence ids the producer reserved (see RemoteProducer.batch_stream)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from ..server import protocol
from ..server.protocol import frame
from .bounded import bounded_call
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
            with self._producer._on_the_wire():
                first = self._producer._reserve(batch.num_rows)
            self._writer.write_with_metadata(batch, first_sequence(first))
        except flight.FlightUnavailableError as exc:
            raise unreachable(self._producer._client, exc) from None
        except flight.FlightError as exc:
            raise protocol.from_flight_error(exc) from None

    def close(self) -> int:
        """End the stream; returns the messages stored once all of them are durable."""
        if self._writer is None:
            return self.count
        writer, self._writer = self._writer, None
        reader, client = self._reader, self._producer._client

        def finish():
            writer.done_writing()
            meta = reader.read()
            writer.close()
            return meta

        try:
            meta = bounded_call(
                finish, client._op_timeout_s, lambda: client._timed_out("batch_stream close")
            )
        except OperationTimedOut as exc:
            if self._handle is not None:
                self._handle._send_failed(exc)  # what it holds of them is unknown
            raise
        except flight.FlightUnavailableError as exc:
            drop_writer(writer)
            raise unreachable(client, exc) from None
        except flight.FlightError as exc:
            drop_writer(writer)
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
            drop_writer(writer)


def drop_writer(writer) -> None:
    """Close a stream's writer that failed (left to its destructor, Arrow logs the error)."""
    try:
        writer.close()
    except Exception:  # noqa: BLE001 - the caller's error matters more
        pass
