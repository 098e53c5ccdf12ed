"""Producers: routing over partitions, producer-side batching, de-duplication by sequence id.

A message waits in its partition's batch container until the container is full (count or
bytes), its publish delay passes, ``flush()`` is called or a synchronous ``send`` needs it; the
container then becomes one entry, appended through the group commit. Sequence ids give
broker-side de-duplication: a re-sent ``(producer_name, sequence_id)`` at or below the highest
one persisted is not stored again and answers with the MessageId it was stored under. A
transaction's messages wait in batches of their own (``txn_batches.py``).
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import timedelta
from functools import partial
from typing import Any, NoReturn

import pyarrow as pa

from .._native import PartitionProducer
from .._native.keywords import refused, strict_class
from ..errors import AlreadyClosed, MessageTooBig, excerpt
from ..txn.log import IN_PROCESS
from ..txn.transaction import Transaction
from .batch_send import BatchSends, _route
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


@strict_class
class Producer(TransactionBatches, BatchSends, metaclass=abc.ABCMeta):  # noqa: B024
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
        # The batching options were checked by create_producer (send_options.check_batching).
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
        # Sent at once, as Pulsar's client does for a synchronous send, and committed here.
        fut = part.add(content, properties, partition_key, sequence_id, True)
        if not fut.done():
            part.flush(True)  # a resend's original may wait in the open batch
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
