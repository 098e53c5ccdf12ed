"""Producers: routing over partitions, producer-side batching, de-duplication by sequence id.

A message waits in its partition's batch container until the container is full (count or
bytes), its publish delay passes, ``flush()`` is called or a synchronous ``send`` needs it; the
container then becomes one entry, appended through the group commit. Sequence ids give
broker-side de-duplication: a re-sent ``(producer_name, sequence_id)`` at or below the highest
one persisted is not stored again and answers with the MessageId it was stored under. A
transaction's messages wait in batches of their own (``txn_batches.py``).
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import timedelta
from functools import partial
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa

from .._native import PartitionProducer, value_sizes
from .._native.keywords import refused, strict_class
from .._native.types import MAX_SEQUENCE_ID, sequences_used_up
from ..errors import AlreadyClosed, MessageTooBig, excerpt
from ..txn.log import IN_PROCESS
from ..txn.transaction import Transaction
from .message import MessageId
from .metadata import message_metadata, send_with_metadata
from .partition import Partition
from .send_options import check_callback, with_callback
from .txn_batches import TransactionBatches

_names = itertools.count()
# Explicit sequence ids stop at 2^62-1: the ids assigned after one have 2^62 of headroom below
# MAX_SEQUENCE_ID, so no producer name runs out of them.
MAX_EXPLICIT_SEQUENCE_ID = (1 << 62) - 1


def check_sequence_id(sequence_id) -> None:
    """An explicit sequence id (None: the producer assigns one) is an int in 0..2^62-1."""
    if sequence_id is not None and (
        isinstance(sequence_id, bool)
        or not isinstance(sequence_id, int)
        or not 0 <= sequence_id <= MAX_EXPLICIT_SEQUENCE_ID
    ):
        raise ValueError(
            "sequence_id must be an int in 0..2^62-1 (those above are the headroom of the "
            f"ids assigned after it), not {excerpt(sequence_id)}"
        )


def _is_local_txn(service, txn) -> bool:
    """`txn` is a Transaction of `service` (this broker's coordinators): one whose messages a
    partition's container may batch as they come."""
    return type(txn) is Transaction and txn._service is service


def _route(key: str | bytes, n: int) -> int:
    """Stable partition of a key: the same on every process and run (not Python's hash)."""
    raw = key.encode() if isinstance(key, str) else bytes(key)
    return zlib.crc32(raw) % n


@strict_class
class Producer(TransactionBatches):
    """``client.create_producer(topic, ...)``: send, send_async, send_batch, flush, close."""

    def __init__(
        self,
        client,
        topic: str,
        partitions: list[Partition],
        producer_name: str | None,
        batching_enabled: bool,
        batching_max_messages: int,
        batching_max_bytes: int,
        batching_max_publish_delay_ms: float,
        max_message_size: int,
    ) -> None:
        for what, value in (
            ("batching_max_messages", batching_max_messages),
            ("batching_max_allowed_size_in_bytes", batching_max_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} must be a positive int, not {excerpt(value)}")
        if (
            isinstance(batching_max_publish_delay_ms, bool)
            or not isinstance(batching_max_publish_delay_ms, (int, float))
            or batching_max_publish_delay_ms < 0
        ):
            raise ValueError(
                "batching_max_publish_delay_ms must be a non-negative number, "
                f"not {excerpt(batching_max_publish_delay_ms)}"
            )
        self.client = client
        self._topic = topic
        self.name = producer_name or f"pulsartxn-{client.broker.broker_id}-{next(_names)}"
        self.producer_id = client.broker.producer_id(self.name)
        self.batching_enabled = batching_enabled
        self.batching_max_messages = batching_max_messages
        self.batching_max_bytes = batching_max_bytes
        self.publish_delay = batching_max_publish_delay_ms / 1000.0
        self.max_message_size = max_message_size
        self._closed = False
        self._round_robin = itertools.count()
        self._init_txn_batches()
        broker = client.broker
        is_local = partial(_is_local_txn, broker.txn)
        self._parts: list[PartitionProducer] = [
            PartitionProducer(self, partition, partition.broker_flusher, is_local)
            for partition in partitions
        ]
        if len(self._parts) == 1:
            self.send_async = self._parts[0].send_async

    def topic(self) -> str:
        return self._topic

    def producer_name(self) -> str:
        return self.name

    def last_sequence_id(self) -> int:
        return max(p.last_sequence for p in self._parts)

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed(f"producer {self.name} on {self._topic} is closed")

    def _part_for(self, partition_key) -> PartitionProducer:
        if len(self._parts) == 1:
            return self._parts[0]
        if partition_key is not None:
            return self._parts[_route(partition_key, len(self._parts))]
        return self._parts[next(self._round_robin) % len(self._parts)]

    def _validate(
        self, content, properties, partition_key, sequence_id
    ) -> tuple[bytes, dict | None]:
        if isinstance(content, memoryview) or isinstance(content, bytearray):
            content = bytes(content)
        if not isinstance(content, bytes):
            raise TypeError(f"content must be bytes, not {type(content).__name__}")
        if len(content) > self.max_message_size:
            raise MessageTooBig(
                f"message of {len(content)} bytes exceeds max_message_size {self.max_message_size}"
            )
        if properties is not None:
            if not isinstance(properties, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
            ):
                raise TypeError(
                    f"properties must be a dict of str to str, not {excerpt(properties)}"
                )
        if partition_key is not None and not isinstance(partition_key, str):
            raise TypeError(f"partition_key must be a str, not {type(partition_key).__name__}")
        check_sequence_id(sequence_id)
        return content, properties or None

    def send_async(
        self,
        content: bytes,
        callback: Callable[[Any, MessageId | None], None] | None = None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        sequence_id: int | None = None,
        txn: Transaction | None = None,
        *,
        ordering_key: str | bytes | None = None,
        event_timestamp: int | None = None,
        deliver_after_ms: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
        **unknown: NoReturn,
    ) -> Future:
        """Queue one message; the future gives its MessageId once it is durable, and
        ``callback(Result.Ok, message_id)`` (or ``(exception, None)``) is called then.

        The future is a MessageFuture, a light handle on its batch's shared outcome rather than
        a Future subclass: ``isinstance(fut, concurrent.futures.Future)`` is True (through its
        ``__class__``); it has result, exception, done, add_done_callback, running, cancel
        (always False: a queued message is not taken back) and cancelled, and works with
        concurrent.futures.wait, as_completed and asyncio.wrap_future.

        A one-partition producer's instances answer this with their partition's native
        ``send_async`` (bound in __init__), which handles the plain case and calls
        ``_send_async`` for the rest."""
        if unknown:
            raise refused(Producer.send_async, unknown)
        if (
            ordering_key is None
            and event_timestamp is None
            and deliver_after_ms is None
            and deliver_at is None
            and deliver_after is None
        ):
            return self._send_async(content, properties, partition_key, sequence_id, txn, callback)
        return self._send_async(
            content,
            properties,
            partition_key,
            sequence_id,
            txn,
            callback,
            ordering_key=ordering_key,
            event_timestamp=event_timestamp,
            deliver_after_ms=deliver_after_ms,
            deliver_at=deliver_at,
            deliver_after=deliver_after,
        )

    def _send_async(
        self, content, properties, partition_key, sequence_id, txn, callback, **metadata
    ) -> Future:
        if self._closed:
            self._check_open()
        if callback is not None:
            check_callback(callback)
        if metadata:
            meta = message_metadata(**metadata)
            if meta is not None:
                fut = self._send_meta(content, properties, partition_key, sequence_id, txn, meta)
                return fut if callback is None else with_callback(fut, callback)
        if txn is not None:
            content, properties = self._validate(content, properties, partition_key, sequence_id)
            fut = self._txn_add(txn, content, properties, partition_key, sequence_id)
            return fut if callback is None else with_callback(fut, callback)
        if (
            type(content) is not bytes
            or properties is not None
            or partition_key is not None
            or sequence_id is not None
            or len(content) > self.max_message_size
        ):
            content, properties = self._validate(content, properties, partition_key, sequence_id)
        parts = self._parts
        if len(parts) == 1:
            part = parts[0]
        else:
            part = self._part_for(partition_key)
        fut = part.add(content, properties, partition_key, sequence_id)
        return fut if callback is None else with_callback(fut, callback)

    def send(
        self,
        content: bytes,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        sequence_id: int | None = None,
        txn: Transaction | None = None,
        *,
        ordering_key: str | bytes | None = None,
        event_timestamp: int | None = None,
        deliver_after_ms: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
        **unknown: NoReturn,
    ) -> MessageId:
        """Send one message; durable when it returns."""
        if unknown:
            raise refused(Producer.send, unknown)
        self._check_open()
        meta = message_metadata(
            ordering_key, event_timestamp, deliver_after_ms, deliver_at, deliver_after
        )
        if meta is not None:
            fut = self._send_meta(content, properties, partition_key, sequence_id, txn, meta)
            self._parts[0].partition.storage.wait(fut)
            return fut.result()
        content, properties = self._validate(content, properties, partition_key, sequence_id)
        if txn is not None:
            fut = self._txn_add(txn, content, properties, partition_key, sequence_id)
            self._txn_flush(txn)
            if not fut.done():
                # Its batch was sent when it filled (a lazy op): commit it now, here.
                self._parts[0].partition.storage.wait(fut)
            return fut.result()
        part = self._part_for(partition_key)
        fut = part.add(content, properties, partition_key, sequence_id)
        if not fut.done():
            part.flush(True)  # as Pulsar's client does for a synchronous send; committed here
            part.partition.storage.wait(fut)
        return fut.result()

    def send_batch(
        self,
        values: Sequence[bytes] | pa.Array | pa.ChunkedArray,
        keys: Sequence[str | bytes | None] | pa.Array | None = None,
        txn: Transaction | None = None,
    ) -> int:
        """Bulk send: a list of bytes or a pyarrow binary/string array; durable when it
        returns. In a transaction, durable by its commit: the batch rides in the commit's
        write (an in-process transaction dies with this process: nothing is gained by
        writing it sooner), or is written with the next group commit."""
        ride = txn is not None and self.client._owner == IN_PROCESS
        n, futures, txn, _ = self._submit_batch(values, keys, txn, quiet=True, ride=ride)
        if not ride:
            self._wait_batches(futures, txn)
        return n

    def _send_meta(self, content, properties, partition_key, sequence_id, txn, meta) -> Future:
        return send_with_metadata(self, content, properties, partition_key, sequence_id, txn, meta)

    def _submit_batch(self, values, keys, txn, quiet: bool, ride: bool = False):
        """send_batch without the wait: (count, futures of its writes, the Transaction,
        messages per partition). Quiet writes are committed by whoever waits for them; the
        server's streamed send_batch submits them for the writer thread and waits at the end
        of the stream. `ride`: a transaction's writes wait for its commit to take them."""
        self._check_open()
        n, sizes = _sizes(values)
        if keys is not None and len(keys) != n:
            raise ValueError(f"keys has {len(keys)} items for {n} values")
        if n and sizes.max() > self.max_message_size:
            i = int(sizes.argmax())
            raise MessageTooBig(
                f"message {i} of {int(sizes[i])} bytes exceeds max_message_size "
                f"{self.max_message_size}"
            )
        if n == 0:
            return 0, [], self.client._txn_for(txn), {}
        key_list = None
        if keys is not None:
            key_list = keys.to_pylist() if hasattr(keys, "to_pylist") else list(keys)
            for k in key_list:
                if k is not None and not isinstance(k, (str, bytes)):
                    raise TypeError(f"keys must be str, bytes or None, not {type(k).__name__}")
        txn = self.client._txn_for(txn)
        if txn is not None:
            self._txn_flush(txn)
        self.flush()  # keep order with messages already waiting in containers
        # Route: by key, or round robin over chunks of one batch each.
        if len(self._parts) == 1:
            plan = {0: np.arange(n)}
        elif key_list is not None:
            routes = np.fromiter(
                (
                    _route(k, len(self._parts))
                    if k is not None
                    else next(self._round_robin) % len(self._parts)
                    for k in key_list
                ),
                dtype=np.int64,
                count=n,
            )
            plan = {i: np.flatnonzero(routes == i) for i in range(len(self._parts))}
        else:
            chunk = self.batching_max_messages
            starts = np.arange(0, n, chunk)
            owner = (next(self._round_robin) + np.arange(len(starts))) % len(self._parts)
            plan = {}
            for i in range(len(self._parts)):
                picked = [np.arange(s, min(s + chunk, n)) for s, o in zip(starts, owner) if o == i]
                if picked:
                    plan[i] = np.concatenate(picked)
        plan = {i: rows for i, rows in plan.items() if len(rows)}
        for i, rows in plan.items():
            if self._parts[i].last_sequence + len(rows) > MAX_SEQUENCE_ID:
                raise sequences_used_up(self.name, self._parts[i].partition.topic)
        per_partition = {self._parts[i].partition.topic: len(rows) for i, rows in plan.items()}
        futures = []
        try:
            for i, rows in plan.items():
                futures.append(
                    self._send_rows(
                        self._parts[i], values, key_list, rows, n, sizes, txn, quiet, ride
                    )
                )
        except BaseException:
            self._wait_batches(futures, txn)  # a write's error first, as it is the cause
            raise
        return n, futures, txn, per_partition

    def _wait_batches(self, futures, txn) -> None:
        """Until the writes are durable; raise the first failure (a transaction's send
        failure leaves it able only to abort)."""
        errors = []
        for fut in futures:
            try:
                self._parts[0].partition.storage.wait(fut)
            except Exception as exc:  # noqa: BLE001 - the first one is raised below
                errors.append(exc)
        if errors:
            if txn is not None:
                txn._failed(errors[0])
            raise errors[0]

    def _send_rows(
        self,
        part: PartitionProducer,
        values,
        key_list,
        rows: np.ndarray,
        n: int,
        sizes: np.ndarray,
        txn=None,
        quiet: bool = True,
        ride: bool = False,
        **one,
    ) -> Future:
        """`one`: properties, metadata and sequence_id of a single message (_send_meta)."""
        if len(rows) == n:
            sub_values = values
            sub_keys = key_list
        else:
            if hasattr(values, "take"):
                sub_values = values.take(rows)
            else:
                sub_values = [values[int(i)] for i in rows]
            sub_keys = [key_list[int(i)] for i in rows] if key_list is not None else None
        buffer = part.partition.buffer
        staged = None
        if txn is not None:
            # The partition's registration with the coordinator rides in this write.
            staged = txn._stage_partition(part.partition.topic)
            try:
                buffer.begin_append(txn.id)
            except BaseException:
                if staged is not None:
                    staged[1](False)
                raise
        try:
            fut = self._submit_rows(
                part, sub_values, sub_keys, rows, sizes, txn, staged, quiet, ride, **one
            )
        except BaseException:
            if txn is not None:
                buffer.append_failed(txn.id)
                if staged is not None:
                    staged[1](False)
            raise
        if txn is not None:
            topic = part.partition.topic
            txn._send_counts[topic] = txn._send_counts.get(topic, 0) + len(rows)
            fut.add_done_callback(lambda f: f.exception() and buffer.append_failed(txn.id))
            if ride:  # nobody waits for it: a failure leaves the transaction able only to abort
                fut.add_done_callback(lambda f: f.exception() and txn._failed(f.exception()))
            if staged is not None:
                landed = staged[1]
                fut.add_done_callback(lambda f: landed(f.exception() is None))
        return fut

    def _submit_rows(
        self,
        part,
        sub_values,
        sub_keys,
        rows,
        sizes,
        txn,
        staged,
        quiet,
        ride=False,
        properties=None,
        metadata=None,
        sequence_id=None,
    ) -> Future:
        with part.lock:
            part._flush_locked()
            first_seq = part.last_sequence + 1 if sequence_id is None else sequence_id
            if first_seq + len(rows) - 1 > MAX_SEQUENCE_ID:  # sent by another thread meanwhile
                raise sequences_used_up(self.name, part.partition.topic)
            part.last_sequence = max(part.last_sequence, first_seq + len(rows) - 1)
            nbytes = int(sizes[rows].sum())
            op = part.partition.append_messages_op(
                sub_values,
                sub_keys,
                nbytes,
                len(rows),
                batch_size=self.batching_max_messages,
                producer=self.name,
                producer_id=self.producer_id,
                first_sequence=first_seq,
                publish_time=int(time.time() * 1000),
                txn_id=txn.id if txn is not None else None,
                properties=properties,
                metadata=metadata,
            )
            if staged is not None:
                op.prepend(staged[0])
            if txn is not None:
                op.durable = False  # durable by the transaction's commit
            if ride:
                op.held = True  # an in-process transaction's: it dies with the process anyway
                fut = part.partition.storage.submit(op, lazy=True)
                txn._riding.append((op, staged is not None, part.partition.topic))
                return fut
            # Quiet: send_batch commits it itself when it waits (no writer wake-up).
            return part.partition.storage.submit(op, quiet=quiet)

    def flush(self) -> None:
        """Send every waiting batch and wait until all are durable."""
        self._check_open()
        for txn in {b.txn for b in list(self._txn_batches.values())}:
            self._txn_flush(txn)
        pending = []  # the outcome of every batch not yet durable
        commits = self._parts[0].partition.storage.commits
        # Without fsync, the batches (and whatever was queued before them) are committed in
        # this thread unless a group is being committed: no hand-off to the writer thread.
        # With fsync, they queue for the writer, whose groups gather concurrent flushes.
        lead = not commits.synced
        for part in self._parts:
            pending.extend(part.flush(lead))
        if lead and pending:
            commits.wait_until(lambda: all(o.done for o in pending))
        for outcome in pending:
            outcome.wait()  # a failed batch is reported by its messages' futures

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        for part in self._parts:
            part.closed = True
        self.client._producer_closed(self)

    def is_connected(self) -> bool:
        return not self._closed

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sizes(values) -> tuple[int, np.ndarray]:
    """Count and per-message sizes of a list of bytes or a pyarrow binary/string array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array) and values.null_count:
        raise ValueError("values must not contain nulls")
    sizes = value_sizes(values)
    return len(sizes), sizes
