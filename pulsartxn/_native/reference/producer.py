"""Pure-Python twin of pulsartxn._native.producer: a producer's batch container on one partition.

A message waits in the container until it is full (count or bytes), the producer's publish
delay passes, ``flush()`` is called or a synchronous ``send`` needs it; the container then
becomes one entry, appended through the group commit. The messages of a batch share one
reentrant Condition and are completed in one pass; each message's Future makes its MessageId
when result() first asks for it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from ...messaging.message import MessageId
from . import entrylog

__all__ = ["PartitionProducer", "MessageFuture", "Batch"]

_PENDING = "PENDING"
_FINISHED = "FINISHED"


def _done(value=None, error: BaseException | None = None) -> Future:
    fut: Future = Future()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
    return fut


class MessageFuture(Future):
    """The Future of one message of a batch. The batch's messages share one Condition, and the
    whole batch is completed under it at once (creating a Condition per message would cost
    more than the rest of a send); the MessageId is made when result() first asks for it.
    Uses concurrent.futures.Future's state fields, as its own subclasses in the standard
    library do."""

    def __init__(self, batch: Batch, index: int) -> None:
        self._condition = batch.condition
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._batch = batch
        self._index = index

    # Made when first used: most futures never get a waiter or a callback.
    @property
    def _waiters(self):
        w = getattr(self, "_waiter_list", None)
        if w is None:
            w = self._waiter_list = []
        return w

    @property
    def _done_callbacks(self):
        c = getattr(self, "_callback_list", None)
        if c is None:
            c = self._callback_list = []
        return c

    def result(self, timeout=None):
        result = super().result(timeout)
        if result is None:
            result = self._result = self._batch.message_id(self._index)
        return result


def _complete(futures: list[Future], error: BaseException | None) -> None:
    """Finish a batch's futures in one pass under their shared condition."""
    if not futures:
        return
    cond = futures[0]._condition
    with cond:
        for f in futures:
            if f._state != _PENDING:
                continue  # cancelled by its caller
            if error is not None:
                f._exception = error
            f._state = _FINISHED
            for waiter in getattr(f, "_waiter_list", ()):
                if error is None:
                    waiter.add_result(f)
                else:
                    waiter.add_exception(f)
        cond.notify_all()
    for f in futures:
        if getattr(f, "_callback_list", None):
            f._invoke_callbacks()


class Batch:
    __slots__ = (
        "values",
        "keys",
        "props",
        "futures",
        "first_sequence",
        "nbytes",
        "started",
        "condition",
        "entry_id",
        "partition",
    )

    def __init__(self, first_sequence: int) -> None:
        self.values: list[bytes] = []
        self.keys: list | None = None  # created at the first keyed message
        self.props: list | None = None  # created at the first message with properties
        self.futures: list[Future] = []
        self.first_sequence = first_sequence
        self.nbytes = 0
        self.started = time.monotonic()
        # Reentrant, as a Future's own: wait() and as_completed() lock every future they watch.
        self.condition = threading.Condition()
        self.entry_id = -1
        self.partition = None

    def message_id(self, index: int) -> MessageId:
        p, n = self.partition, len(self.values)
        if n > 1:
            return MessageId(p.ledger_id, self.entry_id, p.index, index, n)
        return MessageId(p.ledger_id, self.entry_id, p.index)

    def contains(self, sequence_id: int) -> bool:
        return self.first_sequence <= sequence_id < self.first_sequence + len(self.values)


class PartitionProducer:
    """A producer's state on one partition: its batch container and sequence ids."""

    def __init__(self, producer, partition) -> None:
        self.producer = producer
        self.partition = partition
        self.lock = threading.Lock()
        self.last_sequence = partition.dedup_highest.get(producer.name, -1)
        self.batch: Batch | None = None
        self.inflight: list[Batch] = []  # sent, not yet durable

    def send_async(
        self,
        content,
        properties=None,
        partition_key=None,
        sequence_id=None,
        txn=None,
        callback=None,
    ) -> Future:
        """Producer.send_async of a one-partition producer: the plain case here, the rest
        (validation, keys, properties, sequence ids, callbacks, errors) in the producer."""
        producer = self.producer
        if (
            type(content) is bytes
            and properties is None
            and partition_key is None
            and sequence_id is None
            and txn is None
            and callback is None
            and len(content) <= producer.max_message_size
            and not producer._closed
        ):
            return self.add(content, None, None, None)
        return producer._send_async(content, properties, partition_key, sequence_id, txn, callback)

    def add(self, content: bytes, properties, key, sequence_id) -> Future:
        producer = self.producer
        with self.lock:
            if sequence_id is None:
                sequence_id = self.last_sequence + 1
            elif sequence_id <= self.last_sequence:
                return self._duplicate(sequence_id)
            batch = self.batch
            if batch is not None and (
                len(batch.values) >= producer.batching_max_messages
                or batch.nbytes + len(content) > producer.batching_max_bytes
                or sequence_id != batch.first_sequence + len(batch.values)
            ):
                self._flush_locked()
                batch = None
            if batch is None:
                batch = self.batch = Batch(sequence_id)
                producer.client.broker._flusher.watch(self)
            n = len(batch.values)
            if key is not None and batch.keys is None:
                batch.keys = [None] * n
            if properties and batch.props is None:
                batch.props = [None] * n
            batch.values.append(content)
            if batch.keys is not None:
                batch.keys.append(key)
            if batch.props is not None:
                batch.props.append(properties)
            fut = MessageFuture(batch, n)
            batch.futures.append(fut)
            batch.nbytes += len(content)
            self.last_sequence = sequence_id
            if not producer.batching_enabled or n + 1 >= producer.batching_max_messages:
                self._flush_locked()
            return fut

    def _duplicate(self, sequence_id: int) -> Future:
        for batch in [*self.inflight, self.batch]:
            if batch is not None and batch.contains(sequence_id):
                return batch.futures[sequence_id - batch.first_sequence]
        found = self.partition.lookup_sequence(self.producer.name, sequence_id)
        if found is None:
            # Below the highest persisted but never stored (a gap): Pulsar answers -1:-1.
            return _done(MessageId(-1, -1, self.partition.index))
        entry_id, n, batch_index = found
        return _done(self._message_id(entry_id, n, batch_index))

    def _message_id(self, entry_id: int, n: int, batch_index: int) -> MessageId:
        p = self.partition
        return MessageId(
            p.ledger_id, entry_id, p.index, batch_index if n > 1 else -1, n if n > 1 else 0
        )

    def flush(self) -> None:
        with self.lock:
            self._flush_locked()

    def flush_if_older(self, seconds: float) -> bool:
        """Flush a batch older than the producer's publish delay (the broker's flusher asks
        every `seconds`); True when nothing is left waiting."""
        with self.lock:
            if self.batch is None:
                return True
            if time.monotonic() - self.batch.started >= self.producer.publish_delay:
                self._flush_locked()
                return True
            return False

    def _flush_locked(self) -> None:
        batch = self.batch
        if batch is None:
            return
        self.batch = None
        producer = self.producer
        entry = entrylog.encode_entry(
            batch.values,
            batch.keys,
            batch.props,
            producer_id=producer.producer_id,
            sequence_id=batch.first_sequence,
            publish_time=int(time.time() * 1000),
        )
        n = len(batch.values)
        p = self.partition
        self.inflight.append(batch)

        batch.partition = p

        def published(entry_id: int) -> None:
            batch.entry_id = entry_id
            self._landed(batch)
            _complete(batch.futures, None)
            batch.futures = []  # the futures keep the batch, not the other way: no cycle

        op = p.append_op(
            [entry],
            [n],
            batch.nbytes,
            producer.name,
            batch.first_sequence,
            on_published=published,
        )
        fut = p.storage.submit(op)
        fut.add_done_callback(lambda f: self._failed(f, batch))

    def _landed(self, batch: Batch) -> None:
        with self.lock:
            try:
                self.inflight.remove(batch)
            except ValueError:
                pass

    def _failed(self, fut: Future, batch: Batch) -> None:
        error = fut.exception()
        if error is None:
            return
        self._landed(batch)
        _complete(batch.futures, error)
        batch.futures = []
