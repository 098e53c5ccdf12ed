"""Pure-Python twin of pulsartxn._native.producer: a producer's batch container on one partition.

A message waits in the container until it is full (count or bytes), the producer's publish
delay passes, ``flush()`` is called or a synchronous ``send`` needs it; the container then
becomes one entry, appended through the group commit. Each message's future is a small object
over its batch's shared ``Outcome``: the batch is completed in one step, and the MessageId is
made when result() first asks for it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

from ..types import MAX_SEQUENCE_ID, sequences_used_up
from .entrycodec import encode_entry
from .outcome import MessageFuture, Outcome

__all__ = ["PartitionProducer", "Batch", "TxnBatch"]

# Ranges of dropped sequence ids a producer remembers per partition (the latest ones).
MAX_DROPPED = 1024


def _done(value=None, error: BaseException | None = None) -> Future:
    fut: Future = Future()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
    return fut


class Batch:
    """Messages waiting to become one entry; their futures share the batch's Outcome."""

    __slots__ = (
        "values",
        "keys",
        "props",
        "first_sequence",
        "nbytes",
        "started",
        "outcome",
        "resent",
    )

    def __init__(self, first_sequence: int) -> None:
        self.values: list[bytes] = []
        self.keys: list | None = None  # created at the first keyed message
        self.props: list | None = None  # created at the first message with properties
        self.first_sequence = first_sequence
        self.nbytes = 0
        self.started = time.monotonic()
        self.outcome = Outcome()
        self.resent = False  # holds sequence ids stored before in aborted entries

    def contains(self, sequence_id: int) -> bool:
        return self.first_sequence <= sequence_id < self.first_sequence + len(self.values)

    def waiting(self, sequence_id: int) -> MessageFuture | None:
        """The future of the message with this sequence id in this batch, or None."""
        if self.first_sequence <= sequence_id < self.first_sequence + len(self.values):
            return MessageFuture(self.outcome, sequence_id - self.first_sequence)
        return None

    def append(self, content: bytes, properties, key) -> int:
        """Add one message (its key and properties lists made at the first that has one);
        its index in the batch."""
        n = len(self.values)
        if key is not None and self.keys is None:
            self.keys = [None] * n
        if properties and self.props is None:
            self.props = [None] * n
        self.values.append(content)
        if self.keys is not None:
            self.keys.append(key)
        if self.props is not None:
            self.props.append(properties)
        self.nbytes += len(content)
        return n


class TxnBatch(Batch):
    """Messages of one transaction waiting to become one entry on one partition. ``sealed``
    once the batch is taken from its producer (sent or dropped): the send path then appends
    no more."""

    __slots__ = ("part", "txn", "inflight", "sealed")

    def __init__(self, part, txn, first_sequence: int) -> None:
        super().__init__(first_sequence)
        self.part = part
        self.txn = txn
        self.inflight: Future | None = None
        self.sealed = False

    def add(self, content: bytes, properties, key) -> MessageFuture:
        return MessageFuture(self.outcome, self.append(content, properties, key))

    def landed(self, entry_id: int) -> None:
        self.outcome.landed(self.part.partition, entry_id, len(self.values))

    def fail(self, exc: BaseException) -> None:
        self.outcome.failed(exc)


class PartitionProducer:
    """A producer's state on one partition: its batch container and sequence ids."""

    def __init__(self, producer, partition, flusher, is_local_txn) -> None:
        self.producer = producer
        self.partition = partition
        self.lock = threading.Lock()
        self.last_sequence = partition.highest_sequence(producer.name)
        self.batch: Batch | None = None
        self.inflight: list[Batch] = []  # sent, not yet durable
        self.closed = False  # set by the producer's close()
        # (first, end) of sequence ids of aborted sends never written
        self.dropped: deque[tuple[int, int]] = deque(maxlen=MAX_DROPPED)
        self.watched = False  # the broker's flusher will look at this container again
        self._flusher = flusher  # watch(container): flushes batches past their publish delay
        self._is_local_txn = is_local_txn  # txn -> whether this container may batch it
        self._txn_last = None  # the transaction whose open batch here is _txn_batch
        self._txn_batch: TxnBatch | None = None

    def send_async(
        self,
        content,
        callback=None,
        properties=None,
        partition_key=None,
        sequence_id=None,
        txn=None,
        **more,
    ) -> Future:
        """Producer.send_async of a one-partition producer: the plain case here, the rest
        (validation, keys, properties, sequence ids, callbacks, errors, keywords it does not
        name: the producer's method says which it takes) in the producer."""
        producer = self.producer
        if more:
            return type(producer).send_async(
                producer, content, callback, properties, partition_key, sequence_id, txn, **more
            )
        if (
            type(content) is bytes
            and properties is None
            and partition_key is None
            and sequence_id is None
            and txn is None
            and callback is None
            and len(content) <= producer.max_message_size
            and not self.closed
        ):
            return self.add(content, None, None, None)
        if (
            txn is self._txn_last
            and txn is not None
            and type(content) is bytes
            and properties is None
            and partition_key is None
            and sequence_id is None
            and callback is None
            and len(content) <= producer.max_message_size
            and not self.closed
            and txn._final is None
        ):
            fut = self._txn_append(content, txn)
            if fut is not None:
                return fut
        return producer._send_async(content, properties, partition_key, sequence_id, txn, callback)

    def _txn_append(self, content: bytes, txn):
        """A plain message of `txn` into that transaction's open batch here (the one the
        producer's path opened last), when it takes it; None for the producer's path (no
        open batch, a full one, another transaction's, ...)."""
        producer = self.producer
        with self.lock:
            batch = self._txn_batch
            if batch is None or batch.sealed or self._txn_last is not txn:
                return None
            n = len(batch.values)
            if (
                n + 1 >= producer.batching_max_messages
                or batch.nbytes + len(content) > producer.batching_max_bytes
                or self.last_sequence >= MAX_SEQUENCE_ID
                or self.last_sequence + 1 != batch.first_sequence + n
            ):
                return None
            self.last_sequence += 1
            return batch.add(content, None, None)

    def txn_opened(self, txn, batch: TxnBatch) -> None:
        """The producer's path opened `batch` for `txn` here (lock held): the send path appends
        the transaction's next plain messages to it while it stays open. A producer with
        batching off opens none."""
        if self.producer.batching_enabled and self._is_local_txn(txn):
            self._txn_last = txn
            self._txn_batch = batch

    def txn_sealed(self, batch: TxnBatch) -> None:
        """`batch` is taken from the producer (sent or dropped; lock held): no more appends,
        and this container lets go of it and of its transaction."""
        batch.sealed = True
        if self._txn_batch is batch:
            self._txn_batch = None
            self._txn_last = None

    def add(self, content: bytes, properties, key, sequence_id, now: bool = False) -> Future:
        """Queue one message; `now`: its batch is sent at once and quietly, for a caller that
        commits it and waits itself (a synchronous send: no other thread is woken)."""
        producer = self.producer
        resent = False
        with self.lock:
            if sequence_id is None:
                if self.last_sequence >= MAX_SEQUENCE_ID:
                    raise sequences_used_up(producer.name, self.partition.topic)
                sequence_id = self.last_sequence + 1
            elif sequence_id <= self.last_sequence:
                dup = self._duplicate(sequence_id)
                if dup is not None:
                    return dup
                resent = True
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
            n = batch.append(content, properties, key)
            fut = MessageFuture(batch.outcome, n)
            if resent:
                batch.resent = True  # last_sequence stays: it never goes down
            else:
                self.last_sequence = sequence_id
            if now or not producer.batching_enabled or n + 1 >= producer.batching_max_messages:
                self._flush_locked(now)
            elif not self.watched:
                # Only a batch left open waits for the flusher (its publish delay).
                self.watched = True
                self._flusher.watch(self)
            return fut

    def waiting(self, sequence_id: int) -> MessageFuture | None:
        """The future of the message with this sequence id still in this container (sent and
        not yet durable, or in the open batch), or None (lock held)."""
        for batch in [*self.inflight, self.batch]:
            if batch is not None:
                fut = batch.waiting(sequence_id)
                if fut is not None:
                    return fut
        return None

    def was_dropped(self, sequence_id: int) -> bool:
        """Whether `sequence_id` was sent in a transaction that aborted before the batch
        holding it was written (the producer records those ranges in ``dropped``)."""
        return any(first <= sequence_id < end for first, end in list(self.dropped))

    def _duplicate(self, sequence_id: int) -> Future | None:
        """A resend's answer (lock held): the original's future or MessageId, or None when
        its send was aborted and it is to be stored anew."""
        fut = self.waiting(sequence_id)
        if fut is not None:
            return fut
        mid = self.partition.duplicate_of(self.producer.name, sequence_id)
        if mid is None or (mid.entry_id() < 0 and self.was_dropped(sequence_id)):
            return None
        return _done(mid)

    def flush(self, quiet: bool = False) -> list[Outcome]:
        """Send the waiting batch now; return the Outcome of every batch not yet ended
        (``wait()`` on them to wait until they are durable). `quiet`: the caller commits it
        itself (the writer thread is not woken)."""
        with self.lock:
            pending = [b.outcome for b in self.inflight]
            if self.batch is not None:
                pending.append(self.batch.outcome)
            self._flush_locked(quiet)
            return pending

    def flush_if_older(self, seconds: float) -> bool:
        """Flush a batch older than the producer's publish delay (the broker's flusher asks
        every `seconds`); True when nothing is left waiting."""
        with self.lock:
            # The flusher forgets this container when the answer is True: the next batch
            # asks it again (one watch() per idle period, not per batch).
            if self.batch is None:
                self.watched = False
                return True
            if time.monotonic() - self.batch.started >= self.producer.publish_delay:
                self.watched = False
                self._flush_locked()
                return True
            return False

    def _flush_locked(self, quiet: bool = False) -> None:
        batch = self.batch
        if batch is None:
            return
        self.batch = None
        producer = self.producer
        entry = encode_entry(
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
        outcome = batch.outcome
        outcome.partition = p
        outcome.count = n

        def published(entry_id: int) -> None:
            outcome.entry_id = entry_id
            # Settled before it leaves `inflight`: once flush() has returned, every future of
            # the batches it waited for is done.
            outcome.settle(None)
            self._landed(batch)

        op = p.append_op(
            [entry],
            [n],
            batch.nbytes,
            producer.name,
            batch.first_sequence,
            on_published=published,
            resend=batch.resent,
        )
        # Added before the write is submitted: a callback added to a future answered
        # already (by a group another thread commits) runs here, under self.lock.
        op.future.add_done_callback(lambda f: self._failed(f, batch))
        p.storage.submit(op, False, quiet)

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
        batch.outcome.settle(error)
        self._landed(batch)
