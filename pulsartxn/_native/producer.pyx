# cython: language_level=3
"""A producer's batch container on one partition: the per-message path of send_async.

Same behaviour as the twin (reference/producer.py): a message waits in the container until it
is full (count or bytes), the producer's publish delay passes, ``flush()`` is called or a
synchronous ``send`` needs it; the container then becomes one entry, appended through the
group commit. Here the container's state is in C fields and each message's Future is built
without running Future.__init__ (no Condition per message: the batch shares one).
"""

cimport cython
from libc.stdint cimport int64_t

import threading
import time
from concurrent.futures import Future

from pulsartxn.messaging.message import MessageId

from .entrylog import encode_entry

_PENDING = "PENDING"
_FINISHED = "FINISHED"

__all__ = ["PartitionProducer", "MessageFuture", "Batch"]


def _done(value=None, error=None):
    fut = Future()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
    return fut


class MessageFuture(Future):
    """The Future of one message of a batch; its MessageId is made on the first result().

    Its waiter and callback lists are made when first used: most futures never get either,
    and two fewer objects per message is less work for the cyclic garbage collector."""

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
        result = Future.result(self, timeout)
        if result is None:
            result = self._result = (<Batch>self._batch).message_id(self._index)
        return result


cdef object _new_future(Batch batch, Py_ssize_t index):
    # Plain attribute stores keep CPython's inline instance values: touching __dict__ here would
    # make a dict object per message for the garbage collector to walk.
    cdef object fut = MessageFuture.__new__(MessageFuture)
    fut._condition = batch.condition
    fut._state = _PENDING
    fut._result = None
    fut._exception = None
    fut._batch = batch
    fut._index = index
    return fut


cdef void _complete(list futures, object error) except *:
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
            waiters = getattr(f, "_waiter_list", None)
            if waiters:
                for waiter in waiters:
                    if error is None:
                        waiter.add_result(f)
                    else:
                        waiter.add_exception(f)
        cond.notify_all()
    for f in futures:
        if getattr(f, "_callback_list", None):
            f._invoke_callbacks()


cdef class Batch:
    cdef public list values
    cdef public object keys        # list, created at the first keyed message
    cdef public object props       # list, created at the first message with properties
    cdef public list futures
    cdef public int64_t first_sequence
    cdef public Py_ssize_t nbytes
    cdef public double started
    cdef public object condition
    cdef public int64_t entry_id
    cdef public object partition

    def __init__(self, int64_t first_sequence):
        self.values = []
        self.keys = None
        self.props = None
        self.futures = []
        self.first_sequence = first_sequence
        self.nbytes = 0
        self.started = time.monotonic()
        # Reentrant, as a Future's own: wait() and as_completed() lock every future they watch.
        self.condition = threading.Condition()
        self.entry_id = -1
        self.partition = None

    def message_id(self, Py_ssize_t index):
        p = self.partition
        cdef Py_ssize_t n = len(self.values)
        if n > 1:
            return MessageId(p.ledger_id, self.entry_id, p.index, index, n)
        return MessageId(p.ledger_id, self.entry_id, p.index)

    def contains(self, sequence_id) -> bool:
        return self.first_sequence <= sequence_id < self.first_sequence + len(self.values)


cdef class PartitionProducer:
    """A producer's state on one partition: its batch container and sequence ids."""

    cdef public object producer
    cdef public object partition
    cdef public object lock
    cdef public int64_t last_sequence
    cdef public object batch
    cdef public list inflight
    cdef Py_ssize_t max_messages, max_bytes, max_message_size
    cdef bint batching
    cdef double publish_delay
    cdef object flusher

    def __init__(self, producer, partition):
        self.producer = producer
        self.partition = partition
        self.lock = threading.Lock()
        self.last_sequence = partition.dedup_highest.get(producer.name, -1)
        self.batch = None
        self.inflight = []
        self.max_messages = producer.batching_max_messages
        self.max_bytes = producer.batching_max_bytes
        self.max_message_size = producer.max_message_size
        self.batching = producer.batching_enabled
        self.publish_delay = producer.publish_delay
        self.flusher = producer.client.broker._flusher

    def send_async(self, content, properties=None, partition_key=None, sequence_id=None,
                   txn=None, callback=None):
        """Producer.send_async of a one-partition producer: the plain case here, the rest
        (validation, keys, properties, sequence ids, callbacks, errors) in the producer."""
        if (
            type(content) is bytes
            and properties is None
            and partition_key is None
            and sequence_id is None
            and txn is None
            and callback is None
            and len(<bytes>content) <= self.max_message_size
            and not self.producer._closed
        ):
            return self._add(<bytes>content, None, None, -1, False)
        return self.producer._send_async(content, properties, partition_key, sequence_id, txn,
                                         callback)

    def add(self, bytes content, properties, key, sequence_id):
        if sequence_id is None:
            return self._add(content, properties, key, -1, False)
        return self._add(content, properties, key, sequence_id, True)

    cdef object _add(self, bytes content, object properties, object key, int64_t sequence_id,
                     bint explicit):
        cdef Batch batch
        cdef Py_ssize_t n, size = len(content)
        with self.lock:
            if not explicit:
                sequence_id = self.last_sequence + 1
            elif sequence_id <= self.last_sequence:
                return self._duplicate(sequence_id)
            batch = self.batch
            if batch is not None and (
                len(batch.values) >= self.max_messages
                or batch.nbytes + size > self.max_bytes
                or sequence_id != batch.first_sequence + len(batch.values)
            ):
                self._flush_locked()
                batch = None
            if batch is None:
                batch = Batch(sequence_id)
                self.batch = batch
                self.flusher.watch(self)
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
            fut = _new_future(batch, n)
            batch.futures.append(fut)
            batch.nbytes += size
            self.last_sequence = sequence_id
            if not self.batching or n + 1 >= self.max_messages:
                self._flush_locked()
            return fut

    def _duplicate(self, sequence_id):
        cdef Batch b
        for batch in [*self.inflight, self.batch]:
            if batch is not None and (<Batch>batch).contains(sequence_id):
                b = <Batch>batch
                return b.futures[sequence_id - b.first_sequence]
        found = self.partition.lookup_sequence(self.producer.name, sequence_id)
        if found is None:
            # Below the highest persisted but never stored (a gap): Pulsar answers -1:-1.
            return _done(MessageId(-1, -1, self.partition.index))
        entry_id, n, batch_index = found
        p = self.partition
        return _done(MessageId(p.ledger_id, entry_id, p.index, batch_index if n > 1 else -1,
                               n if n > 1 else 0))

    def flush(self):
        with self.lock:
            self._flush_locked()

    def flush_if_older(self, seconds):
        """Flush a batch older than the producer's publish delay (the broker's flusher asks
        every `seconds`); True when nothing is left waiting."""
        with self.lock:
            if self.batch is None:
                return True
            if time.monotonic() - (<Batch>self.batch).started >= self.publish_delay:
                self._flush_locked()
                return True
            return False

    def _flush_locked(self):
        if self.batch is None:
            return
        cdef Batch batch = <Batch>self.batch
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
        batch.partition = p

        def published(entry_id):
            batch.entry_id = entry_id
            self._landed(batch)
            _complete(batch.futures, None)
            batch.futures = []  # the futures keep the batch, not the other way: no cycle

        op = p.append_op([entry], [n], batch.nbytes, producer.name, batch.first_sequence,
                         on_published=published)
        fut = p.storage.submit(op)
        fut.add_done_callback(lambda f: self._failed(f, batch))

    def _landed(self, batch):
        with self.lock:
            try:
                self.inflight.remove(batch)
            except ValueError:
                pass

    def _failed(self, fut, batch):
        error = fut.exception()
        if error is None:
            return
        self._landed(batch)
        _complete((<Batch>batch).futures, error)
        (<Batch>batch).futures = []
