"""A remote producer's batch stream: many send_batch calls on one DoPut stream, each batch's
messages taking sequence ids the producer reserved (see RemoteProducer.batch_stream)."""

from __future__ import annotations

import copy
import json
import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from .. import errors
from ..server import protocol
from ..server.protocol import frame
from .bounded import Worker
from .handles import RemoteTransaction, txn_str, unreachable

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


class OpenStreams:
    """The batch streams a client has open, by transaction (every connection's: a cluster
    client's streams to each broker too), and the transactions one of whose streams (or bulk
    sends: RemoteProducer.send_batch) failed. A
    commit of a transaction, through any handle or by its id, closes its open streams first
    (every batch written is then in it) and refuses it when one failed: what the broker holds
    of that stream is unknown to the client, as of a send that timed out."""

    MAX_FAILED = 1024  # failures remembered (a transaction left to its timeout is not ended)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, weakref.WeakSet] = {}
        self._failed: OrderedDict[str, BaseException] = OrderedDict()

    def add(self, txn: str, stream: BatchStream) -> None:
        with self._lock:
            self._open.setdefault(txn, weakref.WeakSet()).add(stream)

    def discard(self, txn: str, stream: BatchStream) -> None:
        with self._lock:
            streams = self._open.get(txn)
            if streams is not None:
                streams.discard(stream)
                if not streams:
                    del self._open[txn]

    def failed(self, txn: str, error: BaseException) -> None:
        with self._lock:
            self._failed.setdefault(txn, error)
            while len(self._failed) > self.MAX_FAILED:
                self._failed.popitem(last=False)

    def close_for_commit(self, txn: str) -> BaseException | None:
        """Close `txn`'s open streams; the failure of one of its streams, if any."""
        with self._lock:
            streams = list(self._open.get(txn, ()))
        for stream in streams:
            stream._close_for("its transaction's commit")
        with self._lock:
            return self._failed.get(txn)

    def ended(self, txn: str) -> None:
        """`txn` ended: nothing of it is remembered."""
        with self._lock:
            self._failed.pop(txn, None)


class BatchStream(StreamContext):
    """See ``RemoteProducer.batch_stream``. Any call of it that fails ends it: later calls
    raise AlreadyClosed naming the failure, and its transaction can only abort."""

    def __init__(self, producer: RemoteProducer, txn) -> None:
        self._producer = producer
        self._txn = txn_str(txn)
        self._capability = producer._client._capability_of(self._txn)
        self._handle = txn if isinstance(txn, RemoteTransaction) else None
        self._registry = producer._client._streams
        self._writer = self._reader = None
        self._worker: Worker | None = None  # the stream's calls run there, once it opens
        self._error: BaseException | None = None  # the failure that ended it
        self._closed_by: str | None = None  # a commit or its producer's close closed it
        self._closed = False  # close() ended it: it takes no more batches
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
        if self._writer is None:
            self._open(batch.schema)
        with self._producer._on_the_wire():
            first = self._producer._reserve(batch.num_rows)
        writer = self._writer
        _, error = self._bounded(
            lambda: writer.write_with_metadata(batch, first_sequence(first)),
            "batch_stream write",
        )
        if error is not None:
            del writer, batch  # what is raised keeps this frame: not the call's writer
            raise error

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
        _, error = self._bounded(do_put, "batch_stream write")
        if error is not None:
            # A stream that opens after all (once the broker answers) is dropped then.
            worker, self._worker = self._worker, None
            worker.stop(lambda: opened and drop_writer(opened[0][0]))
            raise error
        (self._writer, self._reader), self._schema = opened[0], schema
        self._producer._streams.add(self)  # its close closes it first
        if self._txn is not None:
            self._registry.add(self._txn, self)  # its transaction's commit closes it first

    def close(self) -> int:
        """End the stream; returns the messages stored once all of them are durable."""
        if self._closed_by is not None:
            return self.count  # its transaction's commit or its producer's close closed it
        if self._closed and self._error is None:
            return self.count  # closed or cancelled already
        self._check_usable()
        if self._writer is None:
            self._closed = True
            return self.count
        writer, reader = self._writer, self._reader

        def finish():
            writer.done_writing()
            meta = reader.read()
            writer.close()
            return meta

        meta, error = self._bounded(finish, "batch_stream close")
        if error is not None:
            del writer, reader  # what is raised keeps this frame: not the call's writer
            raise error
        worker = self._worker
        self._let_go()
        worker.stop()
        self._closed = True
        out = json.loads(meta.to_pybytes())
        if self._handle is not None:
            self._handle._stored(out.get("partitions") or [])
        self.count = out["count"]
        return self.count

    def cancel(self) -> None:
        """Drop the stream (after an error: what was sent stays in the transaction)."""
        self._closed = True
        writer, worker = self._writer, self._worker
        if writer is None:
            return
        self._let_go()
        if worker.stuck:
            # After the call still running there: the writer is used by one thread at a time.
            worker.stop(lambda: drop_writer(writer))
        else:
            drop_writer(writer)  # here: what was written reaches the broker before this returns
            worker.stop()

    def _let_go(self) -> None:
        """Forget the open stream: nothing here keeps its writer or reader (a DoPut a
        server's stop waits for) alive, and no registry holds it (writer open)."""
        self._writer = self._reader = self._worker = None
        self._producer._streams.discard(self)
        if self._txn is not None:
            self._registry.discard(self._txn, self)

    def _bounded(self, fn, call: str) -> tuple:
        """(fn()'s value, None), fn() run on the stream's worker within the operation timeout
        (and the thread's send deadline: a producer's close); else (None, the error for the
        caller to raise). A call that fails or outlasts its limit ends the stream (its writer
        is dropped once the call returns) and fails its transaction.

        The error is made here, out of every except block, and returned rather than raised:
        raised from this frame, it would keep `fn` (and the writer it holds) alive until the
        garbage collector broke the cycle, and the broker's stop waited for that call."""
        client = self._producer._client
        limit = client._op_timeout_s
        try:
            left = client._deadline.left()
            if left is not None:
                limit = min(limit, left)
            return self._worker.call(fn, limit, lambda: client._timed_out(call)), None
        except flight.FlightUnavailableError as exc:
            error: BaseException = unreachable(client, exc)
        except flight.FlightError as exc:
            error = protocol.from_flight_error(exc)
        except errors.PulsarTxnError as exc:
            error = detached(exc, str(exc))
        if self._writer is not None:  # the open stream's call failed (an open that failed
            self._fail(error)  # sent nothing: a later write opens it again)
        return None, error

    def _fail(self, error: BaseException) -> None:
        """A call failed: the stream is over, and its transaction can only abort."""
        text = str(error)
        self._error = detached(
            error, text if text.startswith("batch_stream") else f"batch_stream: {text}"
        )
        if self._txn is not None:
            self._registry.failed(self._txn, self._error)
        if self._handle is not None:
            self._handle._send_failed(self._error)  # what it holds of the stream is unknown
        self.cancel()

    def _close_for(self, why: str) -> None:
        """Its transaction commits or its producer closes while it is open: close it, so
        that every batch written is stored (as a commit and a close wait for the sends before
        them). One that cannot be closed has failed its transaction (_fail)."""
        try:
            self.close()
        except errors.PulsarTxnError:
            return
        self._closed_by = why

    def _check_usable(self) -> None:
        check_usable(self._closed_by, self._error, self._closed, self._producer._closed)


def check_usable(closed_by, error, closed: bool, producer_closed: bool) -> None:
    """AlreadyClosed, saying why, unless a stream in this state takes more calls (a cluster
    stream keeps the same rules for its partitions' streams as one)."""
    if closed_by is not None:
        raise errors.AlreadyClosed(f"this batch stream was closed by {closed_by}")
    if error is not None:
        raise errors.AlreadyClosed(f"this batch stream ended when a call failed: {error}")
    if closed:
        raise errors.AlreadyClosed("this batch stream is closed")
    if producer_closed:
        raise errors.AlreadyClosed("this batch stream's producer is closed")


def detached(error: BaseException, text: str) -> BaseException:
    """A copy of `error` saying `text`, without its traceback: kept, it keeps no frame alive
    (nor, through them, a stream's writer and the call at the broker)."""
    try:
        out = copy.copy(error)
        out.args = (text,)
    except Exception:  # noqa: BLE001 - one that cannot be copied is told by its message
        out = errors.PulsarTxnError(text)
    out.__traceback__ = out.__context__ = out.__cause__ = None
    return out


def drop_writer(writer) -> None:
    """Close a stream's writer that failed (left to its destructor, Arrow logs the error)."""
    try:
        writer.close()
    except Exception:  # noqa: BLE001 - the caller's error matters more
        pass
