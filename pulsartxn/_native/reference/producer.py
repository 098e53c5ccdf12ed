"""Pure-Python twin of pulsartxn._native.producer: a producer's batch container on one partition.

A message waits in the container until it is full (count or bytes), the producer's publish
delay passes, ``flush()`` is called or a synchronous ``send`` needs it; the container then
becomes one entry, appended through the group commit. Each message's future is a small object
over its batch's shared ``Outcome``: the batch is completed in one step, and the MessageId is
made when result() first asks for it.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from ...messaging.message import MessageId
from . import entrylog

__all__ = ["PartitionProducer", "MessageFuture", "Outcome", "Batch", "TxnBatch", "Lock"]

# The states concurrent.futures.wait() and as_completed() read from a future's _state.
_RUNNING = "RUNNING"
_FINISHED = "FINISHED"
LOGGER = logging.getLogger("concurrent.futures")  # where Future reports a failing callback

Lock = threading.Lock


def _done(value=None, error: BaseException | None = None) -> Future:
    fut: Future = Future()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
    return fut


class Outcome:
    """What happened to one batch, shared by the futures of its messages: durable (with its
    entry id) or failed (with the error). The futures wait on its one Condition."""

    __slots__ = ("condition", "done", "error", "partition", "entry_id", "count", "watched")

    def __init__(self) -> None:
        # Reentrant, as a Future's own: wait() and as_completed() lock every future they watch.
        self.condition = threading.Condition()
        self.done = False
        self.error: BaseException | None = None
        self.partition = None
        self.entry_id = -1
        self.count = 0
        self.watched: list[MessageFuture] | None = None  # futures with waiters or callbacks

    def message_id(self, index: int) -> MessageId:
        p = self.partition
        if self.count > 1:
            return MessageId(p.ledger_id, self.entry_id, p.index, index, self.count)
        return MessageId(p.ledger_id, self.entry_id, p.index)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the batch is durable or has failed; TimeoutError after `timeout` s."""
        with self.condition:
            if not self.done:
                self.condition.wait(timeout)
            if not self.done:
                raise FutureTimeout()

    def landed(self, partition, entry_id: int, count: int) -> None:
        """The batch of `count` messages is durable as entry `entry_id` of `partition`:
        answer its futures (batches made outside this module: transactional ones)."""
        self.partition = partition
        self.entry_id = entry_id
        self.count = count
        self.settle(None)

    def failed(self, error: BaseException) -> None:
        """The batch was not written: its futures raise `error`."""
        self.settle(error)

    def settle(self, error: BaseException | None) -> None:
        """End the batch: one flag for every future, then the waiters and callbacks of the
        futures that have any."""
        with self.condition:
            if self.done:
                return
            self.error = error
            self.done = True
            watched, self.watched = self.watched, None
            for f in watched or ():
                for waiter in f._waiter_list or ():
                    if error is None:
                        waiter.add_result(f)
                    else:
                        waiter.add_exception(f)
            self.condition.notify_all()
        for f in watched or ():
            f._run_callbacks()


class MessageFuture:
    """The future of one message: ``result()`` gives its MessageId once it is durable.

    Implements what callers use of concurrent.futures.Future (result, exception, done,
    add_done_callback, cancel, cancelled, running) and the fields concurrent.futures.wait()
    and as_completed() read, and reports ``concurrent.futures.Future`` as its ``__class__``,
    so ``isinstance(fut, Future)`` holds (as for a unittest.mock spec); ``type(fut)`` is this
    class. A queued message cannot be taken back: cancel() is False and running() is True
    until the batch ends."""

    __slots__ = ("_outcome", "_index", "_message_id", "_waiter_list", "_callbacks", "_watched")

    def __init__(self, outcome: Outcome, index: int) -> None:
        self._outcome = outcome
        self._index = index
        self._message_id = None
        self._waiter_list: list | None = None
        self._callbacks: list | None = None
        self._watched = False

    @property
    def __class__(self):  # noqa: PLE0101 - isinstance(fut, Future), as the native one
        return Future

    def _watch(self) -> None:
        # Called under the outcome's condition.
        outcome = self._outcome
        if self._watched or outcome.done:
            return
        if outcome.watched is None:
            outcome.watched = []
        outcome.watched.append(self)
        self._watched = True

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, None  # each runs once
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:
                LOGGER.exception("exception calling callback for %r", self)

    def result(self, timeout: float | None = None) -> MessageId:
        outcome = self._outcome
        if not outcome.done:
            outcome.wait(timeout)
        if outcome.error is not None:
            raise outcome.error
        if self._message_id is None:
            self._message_id = outcome.message_id(self._index)
        return self._message_id

    def exception(self, timeout: float | None = None) -> BaseException | None:
        outcome = self._outcome
        if not outcome.done:
            outcome.wait(timeout)
        return outcome.error

    def done(self) -> bool:
        return self._outcome.done

    def running(self) -> bool:
        return not self._outcome.done

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def add_done_callback(self, fn) -> None:
        """Call fn(future) when the message is durable or has failed (now, if it has)."""
        outcome = self._outcome
        with outcome.condition:
            if not outcome.done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                self._watch()
                return
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    # What concurrent.futures.wait() and as_completed() use, under _condition.
    @property
    def _condition(self):
        return self._outcome.condition

    @property
    def _state(self) -> str:
        return _FINISHED if self._outcome.done else _RUNNING

    @property
    def _waiters(self) -> list:
        with self._outcome.condition:
            if self._waiter_list is None:
                self._waiter_list = []
            self._watch()
        return self._waiter_list

    def __repr__(self) -> str:
        outcome = self._outcome
        if not outcome.done:
            return f"<MessageFuture at {id(self):#x} state=running>"
        if outcome.error is not None:
            return (
                f"<MessageFuture at {id(self):#x} state=finished raised "
                f"{type(outcome.error).__name__}>"
            )
        return f"<MessageFuture at {id(self):#x} state=finished returned MessageId>"


class Batch:
    """Messages waiting to become one entry; their futures share the batch's Outcome."""

    __slots__ = ("values", "keys", "props", "first_sequence", "nbytes", "started", "outcome")

    def __init__(self, first_sequence: int) -> None:
        self.values: list[bytes] = []
        self.keys: list | None = None  # created at the first keyed message
        self.props: list | None = None  # created at the first message with properties
        self.first_sequence = first_sequence
        self.nbytes = 0
        self.started = time.monotonic()
        self.outcome = Outcome()

    def contains(self, sequence_id: int) -> bool:
        return self.first_sequence <= sequence_id < self.first_sequence + len(self.values)

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

    def __init__(self, producer, partition) -> None:
        self.producer = producer
        self.partition = partition
        self.lock = threading.Lock()
        self.last_sequence = partition.dedup_highest.get(producer.name, -1)
        self.batch: Batch | None = None
        self.inflight: list[Batch] = []  # sent, not yet durable
        self.closed = False  # set by the producer's close()
        self.watched = False  # the broker's flusher will look at this container again
        self._txn_last = None  # the transaction whose open batch here is _txn_batch
        self._txn_batch: TxnBatch | None = None

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
                or self.last_sequence + 1 != batch.first_sequence + n
            ):
                return None
            self.last_sequence += 1
            return batch.add(content, None, None)

    def txn_opened(self, txn, batch: TxnBatch) -> None:
        """The producer's path opened `batch` for `txn` here (lock held): the send path appends
        the transaction's next plain messages to it while it stays open. A producer with
        batching off opens none."""
        from ...txn.transaction import Transaction

        producer = self.producer
        if (
            producer.batching_enabled
            and type(txn) is Transaction
            and txn._service is producer.client.broker.txn
        ):
            self._txn_last = txn
            self._txn_batch = batch

    def txn_sealed(self, batch: TxnBatch) -> None:
        """`batch` is taken from the producer (sent or dropped; lock held): no more appends,
        and this container lets go of it and of its transaction."""
        batch.sealed = True
        if self._txn_batch is batch:
            self._txn_batch = None
            self._txn_last = None

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
                if not self.watched:
                    self.watched = True
                    producer.client.broker._flusher.watch(self)
            n = batch.append(content, properties, key)
            fut = MessageFuture(batch.outcome, n)
            self.last_sequence = sequence_id
            if not producer.batching_enabled or n + 1 >= producer.batching_max_messages:
                self._flush_locked()
            return fut

    def _duplicate(self, sequence_id: int) -> Future:
        for batch in [*self.inflight, self.batch]:
            if batch is not None and batch.contains(sequence_id):
                return MessageFuture(batch.outcome, sequence_id - batch.first_sequence)
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
        )
        fut = p.storage.submit(op, False, quiet)
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
        batch.outcome.settle(error)
        self._landed(batch)
