"""A topic's producer on a cluster: one remote producer per partition, each at the broker
that owns its partition (following it when it restarts or is found elsewhere), under one
name. A partitioned topic's messages go to the partitions the embedded producer would pick
(a key's hash, else round robin), so the same messages land in the same partitions.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from .. import errors
from .._native import TxnID
from .._native.keywords import strict_class
from ..messaging.batch_send import _route as route_key
from ..messaging.message import MessageId
from ..messaging.producer import check_sequence_id
from ..messaging.send_options import check_callback
from ..messaging.topic_name import TopicName
from .batch_stream import StreamContext, check_usable
from .handles import RemoteTransaction
from .placed import Placed, quietly
from .producer import RemoteProducer

__all__ = ["ClusterBatchStream", "ClusterProducer", "route_plan"]


def route_plan(n: int, key_list, partitions: int, round_robin, chunk: int) -> dict:
    """The rows of a send_batch of `n` messages each partition takes, as the embedded
    producer routes them: by key (round robin for a row without one), or without keys in
    chunks of `chunk` rows, round robin from the next partition in turn."""
    if key_list is not None:
        routes = np.fromiter(
            (
                route_key(k, partitions) if k is not None else next(round_robin) % partitions
                for k in key_list
            ),
            dtype=np.int64,
            count=n,
        )
        plan = {i: np.flatnonzero(routes == i) for i in range(partitions)}
    else:
        starts = np.arange(0, n, chunk)
        owner = (next(round_robin) + np.arange(len(starts))) % partitions
        plan = {}
        for i in range(partitions):
            picked = [np.arange(s, min(s + chunk, n)) for s, o in zip(starts, owner) if o == i]
            if picked:
                plan[i] = np.concatenate(picked)
    return {i: rows for i, rows in plan.items() if len(rows)}


def _validate(content, properties, partition_key, sequence_id):
    """What the embedded producer checks before it picks a partition (so that a refused
    message does not move the round robin here either)."""
    if isinstance(content, (bytearray, memoryview)):
        content = bytes(content)
    if not isinstance(content, bytes):
        raise TypeError(f"content must be bytes, not {type(content).__name__}")
    if properties is not None and (
        not isinstance(properties, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items())
    ):
        raise TypeError(
            f"properties must be a dict of str to str, not {errors.excerpt(properties)}"
        )
    if partition_key is not None and not isinstance(partition_key, str):
        raise TypeError(f"partition_key must be a str, not {type(partition_key).__name__}")
    check_sequence_id(sequence_id)
    return content


class _PartProducer(Placed, RemoteProducer):
    """One partition's producer: a send re-sent at the owner after a failure is stored once
    (the same producer name and sequence id)."""

    def __init__(self, cluster, partition: str, producer_name, options, send_timeout) -> None:
        self._place(cluster, partition)
        RemoteProducer.__init__(self, None, partition, producer_name, options, send_timeout)

    def _deadline(self):
        return self._cluster._deadline

    def _send_many(self, items, txn, handle=None) -> list:
        return self._follow(lambda: RemoteProducer._send_many(self, items, txn, handle))

    def _flush(self) -> None:
        self._follow(lambda: RemoteProducer._flush(self))


@strict_class
class ClusterProducer:
    """``client.create_producer(topic)`` on a cluster: RemoteProducer's API, one producer
    per partition under one name (de-duplication is per partition and name)."""

    def __init__(
        self, cluster, topic: str, partitions: list[str], producer_name, options, send_timeout=0
    ):
        self._topic = topic
        self._cluster = cluster
        self._send_timeout_ms = send_timeout
        self._parts: list[_PartProducer] = []
        name = producer_name
        if name is None and len(partitions) > 1:
            # One name on every partition, unique in the cluster (a broker's own names are
            # unique only among its producers).
            name = f"pulsartxn-{uuid.uuid4().hex[:16]}"
        try:
            for partition in partitions:
                part = _PartProducer(cluster, partition, name, options, send_timeout)
                name = part.name
                self._parts.append(part)
        except BaseException:
            for part in self._parts:
                quietly(part.close)
            raise
        self.name = name
        self._round_robin = itertools.count()
        self._chunk = options.get("batching_max_messages") or 1000
        self._closed = False

    def topic(self) -> str:
        """The topic's full name (persistent://tenant/namespace/name), as the broker's."""
        return TopicName.parse(self._topic).full

    def producer_name(self) -> str:
        return self.name

    def last_sequence_id(self) -> int:
        return max(p.last_sequence_id() for p in self._parts)

    def is_connected(self) -> bool:
        return not self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise errors.AlreadyClosed(f"producer {self.name} is closed")

    def _part_for(self, partition_key) -> _PartProducer:
        n = len(self._parts)
        if n == 1:
            return self._parts[0]
        if partition_key is not None:
            return self._parts[route_key(partition_key, n)]
        return self._parts[next(self._round_robin) % n]

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
        """Send one message at its partition's owner; durable when it returns."""
        self._check_open()
        content = _validate(content, properties, partition_key, sequence_id)
        return self._part_for(partition_key).send(
            content,
            properties,
            partition_key,
            sequence_id,
            txn,
            ordering_key=ordering_key,
            event_timestamp=event_timestamp,
            deliver_after_ms=deliver_after_ms,
            deliver_at=deliver_at,
            deliver_after=deliver_after,
        )

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
        """Queue one message for its partition's owner; the future gives its MessageId."""
        self._check_open()
        content = _validate(content, properties, partition_key, sequence_id)
        check_callback(callback)
        return self._part_for(partition_key).send_async(
            content,
            callback,
            properties,
            partition_key,
            sequence_id,
            txn,
            ordering_key=ordering_key,
            event_timestamp=event_timestamp,
            deliver_after_ms=deliver_after_ms,
            deliver_at=deliver_at,
            deliver_after=deliver_after,
        )

    def _split(self, values, keys):
        """(values, keys, {partition: rows}) of a send_batch, routed as the embedded one."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if not isinstance(values, pa.Array):
            values = list(values)
            for v in values:
                if not isinstance(v, (bytes, bytearray, memoryview)):
                    raise TypeError(f"values must be bytes, not {type(v).__name__}")
            values = pa.array([bytes(v) for v in values], pa.binary())
        n = len(values)
        if keys is not None and len(keys) != n:
            raise ValueError(f"keys has {len(keys)} items for {n} values")
        if n == 0:
            return values, keys, {}
        key_list = None
        if keys is not None:
            if isinstance(keys, pa.ChunkedArray):
                keys = keys.combine_chunks()
            if not isinstance(keys, pa.Array):
                keys = pa.array(list(keys), pa.string())
            key_list = keys.to_pylist()
        plan = route_plan(n, key_list, len(self._parts), self._round_robin, self._chunk)
        return values, keys, plan

    def send_batch(
        self,
        values: Sequence[bytes] | pa.Array | pa.ChunkedArray,
        keys: Sequence[str | bytes | None] | pa.Array | None = None,
        txn: RemoteTransaction | TxnID | None = None,
    ) -> int:
        self._check_open()
        if len(self._parts) == 1:
            return self._parts[0].send_batch(values, keys, txn)
        values, keys, plan = self._split(values, keys)
        jobs = []
        for i, rows in plan.items():
            take = pa.array(rows)
            part_keys = None if keys is None else keys.take(take)
            jobs.append((self._parts[i], values.take(take), part_keys))
        if len(jobs) == 1:
            part, part_values, part_keys = jobs[0]
            return part.send_batch(part_values, part_keys, txn)
        # Each partition's share at once (their brokers write in parallel); every one is
        # waited for, and the first failure raised.
        threads = [_Call(part.send_batch, v, k, txn) for part, v, k in jobs]
        for t in threads:
            t.join()
        return sum(t.result() for t in threads)

    def batch_stream(self, txn: RemoteTransaction | TxnID | None = None) -> ClusterBatchStream:
        self._check_open()
        if len(self._parts) == 1:
            return self._parts[0].batch_stream(txn)
        return ClusterBatchStream(self, txn)

    def flush(self) -> None:
        """Every partition's flush, within one send timeout; the first Timeout is raised
        once they all ran."""
        timeout = self._send_timeout_ms / 1000.0
        deadline = self._cluster._deadline
        with deadline.until(time.monotonic() + timeout) if timeout else contextlib.nullcontext():
            _on_every(self._parts, lambda part: part.flush(), errors.Timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _on_every(self._parts, lambda part: part.close(), errors.PulsarTxnError)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _on_every(parts, call, caught) -> None:
    """`call(part)` on every part, each even if one before raised `caught`: the first such
    error is raised once all ran."""
    first = None
    for part in parts:
        try:
            call(part)
        except caught as exc:
            first = first or exc
    if first is not None:
        raise first


class ClusterBatchStream(StreamContext):
    """``batch_stream`` of a partitioned topic: each batch routed as a send_batch, onto a
    stream per partition opened at its first rows. To its user it is one stream, as
    ``BatchStream`` says: a failed call of any partition's ends it (the other partitions'
    streams are dropped; its transaction can only abort), one closed by a commit or its
    producer's close has closed it (no partition's is opened after), and a closed one takes
    no more batches."""

    def __init__(self, producer: ClusterProducer, txn) -> None:
        self._producer = producer
        self._txn = txn
        self._streams: dict = {}
        self._shape = None  # (values' type, keys' type or None), fixed by the first batch
        self._error: BaseException | None = None  # the failure that ended it
        self._closed = False
        self.count = 0

    def write(self, values: pa.Array, keys: pa.Array | None = None) -> None:
        self._check_usable()
        values, keys, plan = self._producer._split(values, keys)
        shape = (values.type, None if keys is None else keys.type)
        if self._shape is None:
            self._shape = shape
        elif shape != self._shape:  # refused before any partition takes a part of it
            raise ValueError(f"batch of {shape} differs from the stream's {self._shape}")
        for i, rows in plan.items():
            stream = self._streams.get(i)
            if stream is None:
                stream = self._streams[i] = self._producer._parts[i].batch_stream(self._txn)
            take = pa.array(rows)
            try:
                stream.write(values.take(take), None if keys is None else keys.take(take))
            except errors.PulsarTxnError as exc:
                if stream._closed_by is None:  # not closed by a commit meanwhile: failed
                    self._error = stream._error or exc
                    self.cancel()
                raise

    def close(self) -> int:
        """Close every partition's stream (each, even if one before raised: the first error
        is raised then); the messages stored."""
        if self._error is not None:
            self._check_usable()  # raises, naming the failure
        if self._closed:
            return self.count
        self._closed = True
        streams, self._streams = self._streams, {}
        first = None
        for stream in streams.values():
            try:
                self.count += stream.close()
            except errors.PulsarTxnError as exc:
                self._error = self._error or exc
                first = first or exc
        if first is not None:
            raise first
        return self.count

    def cancel(self) -> None:
        self._closed = True
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.cancel()

    def _check_usable(self) -> None:
        # After a failure the partitions' streams are cancelled and forgotten: none says why.
        closed_by = next((s._closed_by for s in self._streams.values() if s._closed_by), None)
        check_usable(closed_by, self._error, self._closed, self._producer._closed)


class _Call(threading.Thread):
    """fn(*args) in a thread of its own; result() waits and gives its value or raises."""

    def __init__(self, fn, *args) -> None:
        super().__init__(daemon=True)
        self._fn, self._args = fn, args
        self._value = self._error = None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - raised by result()
            self._error = exc

    def result(self):
        self.join()
        if self._error is not None:
            raise self._error
        return self._value
