# cython: language_level=3
"""A producer's batch container on one partition: the per-message path of send_async.

Same behaviour as the twin (reference/producer.py); here the container's state is in C
fields, its lock is taken in C, and each message's future is a two-field C object over its
batch's shared ``Outcome`` (outcome.pyx), so a batch is completed in O(1). See
docs/internals.md, "Sends".
"""

cimport cython
from cpython.bytes cimport PyBytes_GET_SIZE
from libc.stdint cimport int64_t

from .outcome cimport Lock, MessageFuture, Outcome

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object op)

import time
from collections import deque
from concurrent.futures import Future

from .entrycodec import encode_entry
from .types import sequences_used_up

__all__ = ["PartitionProducer", "Batch", "TxnBatch"]

# Ranges of dropped sequence ids a producer remembers per partition (the latest ones).
MAX_DROPPED = 1024
cdef int64_t MAX_SEQUENCE_ID = 0x7FFFFFFFFFFFFFFF  # types.MAX_SEQUENCE_ID: last + 1 fits below


def _done(value=None, error=None):
    fut = Future()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
    return fut


cdef inline MessageFuture _future(Outcome outcome, Py_ssize_t index):
    """A message's future, untracked by the garbage collector (a caller may keep many): it
    refers to its batch's Outcome only, which refers back to futures with callbacks or waiters
    alone (tracked again, see outcome.pyx), so it cannot be part of a cycle."""
    cdef MessageFuture fut = MessageFuture.__new__(MessageFuture)
    fut._outcome = outcome
    fut._index = index
    PyObject_GC_UnTrack(fut)
    return fut


cdef class Batch:
    """Messages waiting to become one entry; their futures share the batch's Outcome."""

    cdef public list values
    cdef public object keys        # list, created at the first keyed message
    cdef public object props       # list, created at the first message with properties
    cdef public int64_t first_sequence
    cdef public Py_ssize_t nbytes
    cdef public double started
    cdef public Outcome outcome
    cdef public bint resent        # holds sequence ids stored before in aborted entries

    def __init__(self, int64_t first_sequence):
        self.values = []
        self.keys = None
        self.props = None
        self.first_sequence = first_sequence
        self.nbytes = 0
        self.started = time.monotonic()
        self.outcome = Outcome()
        self.resent = False

    def contains(self, int64_t sequence_id) -> bool:
        return self.first_sequence <= sequence_id < self.first_sequence + len(self.values)

    def waiting(self, int64_t sequence_id):
        """The future of the message with this sequence id in this batch, or None."""
        if self.first_sequence <= sequence_id < self.first_sequence + len(self.values):
            return _future(self.outcome, sequence_id - self.first_sequence)
        return None

    cdef Py_ssize_t append(self, bytes content, object properties, object key) except -1:
        """Add one message (its key and properties lists made at the first that has one);
        its index in the batch."""
        cdef Py_ssize_t n = len(self.values)
        if key is not None and self.keys is None:
            self.keys = [None] * n
        if properties and self.props is None:
            self.props = [None] * n
        self.values.append(content)
        if self.keys is not None:
            self.keys.append(key)
        if self.props is not None:
            self.props.append(properties)
        self.nbytes += PyBytes_GET_SIZE(content)
        return n


@cython.final
cdef class TxnBatch(Batch):
    """Messages of one transaction waiting to become one entry on one partition. ``sealed``
    once the batch is taken from its producer (sent or dropped): the send path then appends
    no more."""

    cdef public object part        # the PartitionProducer
    cdef public object txn         # the Transaction
    cdef public object inflight    # the future of its write, once sent
    cdef public bint sealed

    def __init__(self, part, txn, int64_t first_sequence):
        Batch.__init__(self, first_sequence)
        self.part = part
        self.txn = txn
        self.inflight = None
        self.sealed = False

    def add(self, bytes content not None, properties, key):
        return _future(self.outcome, self.append(content, properties, key))

    def landed(self, int64_t entry_id):
        self.outcome.landed(self.part.partition, entry_id, len(self.values))

    def fail(self, exc):
        self.outcome.failed(exc)


cdef class PartitionProducer:
    """A producer's state on one partition: its batch container and sequence ids."""

    cdef public object producer
    cdef public object partition
    cdef public Lock lock
    cdef public int64_t last_sequence
    cdef public Batch batch
    cdef public list inflight
    cdef public bint closed
    cdef public object dropped  # (first, end) of aborted sends never written, a deque
    cdef bint watched  # the broker's flusher will look at this container again
    cdef Py_ssize_t max_messages, max_bytes, max_message_size
    cdef bint batching
    cdef double publish_delay
    cdef object flusher       # watch(container): flushes batches past their publish delay
    cdef object is_local_txn  # txn -> whether this container may batch it (this broker's)
    cdef object txn_last     # the transaction whose open batch here is txn_batch
    cdef TxnBatch txn_batch

    def __init__(self, producer, partition, flusher, is_local_txn):
        self.producer = producer
        self.partition = partition
        self.lock = Lock()
        self.last_sequence = partition.highest_sequence(producer.name)
        self.batch = None
        self.inflight = []  # sent, not yet durable
        self.closed = False  # set by the producer's close()
        self.dropped = deque(maxlen=MAX_DROPPED)
        self.watched = False
        self.max_messages = producer.batching_max_messages
        self.max_bytes = producer.batching_max_bytes
        self.max_message_size = producer.max_message_size
        self.batching = producer.batching_enabled
        self.publish_delay = producer.publish_delay
        self.flusher = flusher
        self.is_local_txn = is_local_txn
        self.txn_last = None
        self.txn_batch = None

    def send_async(self, content, callback=None, properties=None, partition_key=None,
                   sequence_id=None, txn=None, **more):
        """Producer.send_async of a one-partition producer: the plain case here, the rest
        (validation, keys, properties, sequence ids, callbacks, errors, keywords it does not
        name: the producer's method says which it takes) in the producer."""
        if more:
            return type(self.producer).send_async(self.producer, content, callback, properties,
                                                  partition_key, sequence_id, txn, **more)
        if (
            type(content) is bytes
            and properties is None
            and partition_key is None
            and sequence_id is None
            and txn is None
            and callback is None
            and PyBytes_GET_SIZE(content) <= self.max_message_size
            and not self.closed
        ):
            return self._add(<bytes>content, None, None, -1, False)
        if (
            txn is self.txn_last
            and txn is not None
            and type(content) is bytes
            and properties is None
            and partition_key is None
            and sequence_id is None
            and callback is None
            and PyBytes_GET_SIZE(content) <= self.max_message_size
            and not self.closed
            and txn._final is None
        ):
            fut = self._txn_append(<bytes>content, txn)
            if fut is not None:
                return fut
        return self.producer._send_async(content, properties, partition_key, sequence_id, txn,
                                         callback)

    cdef object _txn_append(self, bytes content, object txn):
        """A plain message of `txn` into that transaction's open batch here (the one the
        producer's path opened last), when it takes it; None for the producer's path (no
        open batch, a full one, another transaction's, ...)."""
        cdef Py_ssize_t n, size = PyBytes_GET_SIZE(content)
        cdef TxnBatch batch
        self.lock.take()
        try:
            batch = self.txn_batch
            if batch is None or batch.sealed or self.txn_last is not txn:
                return None
            n = len(batch.values)
            if (
                n + 1 >= self.max_messages
                or batch.nbytes + size > self.max_bytes
                or self.last_sequence >= MAX_SEQUENCE_ID
                or self.last_sequence + 1 != batch.first_sequence + n
            ):
                return None
            batch.append(content, None, None)
            self.last_sequence += 1
            return _future(batch.outcome, n)
        finally:
            self.lock.give()

    def txn_opened(self, txn, TxnBatch batch):
        """The producer's path opened `batch` for `txn` here (lock held): the send path appends
        the transaction's next plain messages to it while it stays open. A producer with
        batching off opens none."""
        if self.batching and self.is_local_txn(txn):
            self.txn_last = txn
            self.txn_batch = batch

    def txn_sealed(self, TxnBatch batch):
        """`batch` is taken from the producer (sent or dropped; lock held): no more appends,
        and this container lets go of it and of its transaction."""
        batch.sealed = True
        if self.txn_batch is batch:
            self.txn_batch = None
            self.txn_last = None

    def add(self, bytes content not None, properties, key, sequence_id, bint now=False):
        """Queue one message; `now`: its batch is sent at once and quietly, for a caller that
        commits it and waits itself (a synchronous send: no other thread is woken)."""
        if sequence_id is None:
            return self._add(content, properties, key, -1, False, now)
        return self._add(content, properties, key, sequence_id, True, now)

    cdef object _add(self, bytes content, object properties, object key, int64_t sequence_id,
                     bint explicit, bint now=False):
        cdef Batch batch
        cdef MessageFuture fut
        cdef Py_ssize_t n, size = PyBytes_GET_SIZE(content)
        cdef bint resent = False
        self.lock.take()
        try:
            if not explicit:
                if self.last_sequence >= MAX_SEQUENCE_ID:
                    raise sequences_used_up(self.producer.name, self.partition.topic)
                sequence_id = self.last_sequence + 1
            elif sequence_id <= self.last_sequence:
                dup = self._duplicate(sequence_id)
                if dup is not None:
                    return dup
                resent = True
            batch = self.batch
            if batch is not None:
                n = len(batch.values)
                if (
                    n >= self.max_messages
                    or batch.nbytes + size > self.max_bytes
                    or sequence_id != batch.first_sequence + n
                ):
                    self._flush()
                    batch = None
            if batch is None:
                batch = Batch(sequence_id)
                self.batch = batch
            n = batch.append(content, properties, key)
            fut = _future(batch.outcome, n)
            if resent:
                batch.resent = True  # last_sequence stays: it never goes down
            else:
                self.last_sequence = sequence_id
            if now or not self.batching or n + 1 >= self.max_messages:
                self._flush(now)
            elif not self.watched:
                # Only a batch left open waits for the flusher (its publish delay).
                self.watched = True
                self.flusher.watch(self)
            return fut
        finally:
            self.lock.give()

    def waiting(self, int64_t sequence_id):
        """The future of the message with this sequence id still in this container (sent and
        not yet durable, or in the open batch), or None (lock held)."""
        for batch in [*self.inflight, self.batch]:
            if batch is not None:
                fut = (<Batch>batch).waiting(sequence_id)
                if fut is not None:
                    return fut
        return None

    def was_dropped(self, int64_t sequence_id):
        """Whether `sequence_id` was sent in a transaction that aborted before the batch
        holding it was written (the producer records those ranges in ``dropped``)."""
        for first, end in list(self.dropped):
            if first <= sequence_id < end:
                return True
        return False

    cdef object _duplicate(self, int64_t sequence_id):
        """A resend's answer (lock held): the original's future or MessageId, or None when
        its send was aborted and it is to be stored anew."""
        fut = self.waiting(sequence_id)
        if fut is not None:
            return fut
        mid = self.partition.duplicate_of(self.producer.name, sequence_id)
        if mid is None or (mid.entry_id() < 0 and self.was_dropped(sequence_id)):
            return None
        return _done(mid)

    def flush(self, quiet=False):
        """Send the waiting batch now; return the Outcome of every batch not yet ended
        (``wait()`` on them to wait until they are durable). `quiet`: the caller commits it
        itself (the writer thread is not woken)."""
        self.lock.take()
        try:
            pending = [(<Batch>b).outcome for b in self.inflight]
            if self.batch is not None:
                pending.append(self.batch.outcome)
            self._flush(quiet)
            return pending
        finally:
            self.lock.give()

    def flush_if_older(self, seconds):
        """Flush a batch older than the producer's publish delay (the broker's flusher asks
        every `seconds`); True when nothing is left waiting."""
        self.lock.take()
        try:
            # The flusher forgets this container when the answer is True: the next batch
            # asks it again (one watch() per idle period, not per batch).
            if self.batch is None:
                self.watched = False
                return True
            if time.monotonic() - self.batch.started >= self.publish_delay:
                self.watched = False
                self._flush()
                return True
            return False
        finally:
            self.lock.give()

    def _flush_locked(self):
        self._flush()

    cdef int _flush(self, bint quiet=False) except -1:
        if self.batch is None:
            return 0
        cdef Batch batch = self.batch
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
        cdef Outcome outcome = batch.outcome
        outcome.partition = p
        outcome.count = n

        def published(entry_id):
            outcome.entry_id = entry_id
            # Settled before it leaves `inflight`: once flush() has returned, every future of
            # the batches it waited for is done.
            outcome.settle(None)
            self._landed(batch)

        op = p.append_op([entry], [n], batch.nbytes, producer.name, batch.first_sequence,
                         on_published=published, resend=batch.resent)
        # Added before the write is submitted: a callback added to a future answered
        # already (by a group another thread commits) runs here, under self.lock.
        op.future.add_done_callback(lambda f: self._failed(f, batch))
        p.storage.submit(op, False, quiet)
        return 0

    def _landed(self, batch):
        self.lock.take()
        try:
            self.inflight.remove(batch)
        except ValueError:
            pass
        finally:
            self.lock.give()

    def _failed(self, fut, batch):
        error = fut.exception()
        if error is None:
            return
        (<Batch>batch).outcome.settle(error)
        self._landed(batch)
