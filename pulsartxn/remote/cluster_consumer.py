"""A topic's consumer on a cluster: one remote consumer per partition, each at the broker
that owns its partition (following it), under one name; with several partitions, what a
fetcher per partition takes ahead is merged into one bounded queue.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import errors
from .._native import TxnID
from .._native.keywords import strict_class
from ..messaging import positions
from ..messaging.consumer import check_count
from ..messaging.listener import MessageListener
from ..messaging.message import Message, MessageId
from ..messaging.topic_name import TopicName
from .consumer import RemoteConsumer
from .handles import OperationTimedOut, RemoteTransaction
from .placed import Placed, quietly

__all__ = ["ClusterConsumer"]

# A fetcher's wait at its broker for a partition's next message: what a redelivery or an
# unsubscribe may wait for the fetchers to come back.
FETCH_WAIT_MS = 200


class _PartConsumer(Placed, RemoteConsumer):
    """One partition's consumer."""

    def __init__(self, cluster, partition: str, subscription: str, options) -> None:
        self._place(cluster, partition)
        self.on_recreate = None  # called when subscribed again (a new session or owner)
        self._created = False
        RemoteConsumer.__init__(self, None, partition, subscription, options)

    def _create(self) -> int:
        handle = RemoteConsumer._create(self)
        if self._created and self.on_recreate is not None:
            self.on_recreate()
        self._created = True
        return handle

    def receive(self, timeout_millis: int | None = None) -> Message:
        check_count("timeout_millis", timeout_millis, least=0, optional=True)
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0

        def once():
            left = None if deadline is None else max(int((deadline - time.monotonic()) * 1000), 0)
            return RemoteConsumer.receive(self, left)

        return self._follow(once)

    def batch_receive(
        self, max_num_messages: int = 1000, timeout_millis: int = 100
    ) -> list[Message]:
        return self._follow(
            lambda: RemoteConsumer.batch_receive(self, max_num_messages, timeout_millis)
        )

    def _ack(self, msg_or_id, txn, cumulative: bool) -> None:
        self._follow(lambda: RemoteConsumer._ack(self, msg_or_id, txn, cumulative))

    def negative_acknowledge(self, msg_or_id: Message | MessageId) -> None:
        self._follow(lambda: RemoteConsumer.negative_acknowledge(self, msg_or_id))

    def redeliver_unacknowledged_messages(self) -> None:
        self._follow(lambda: RemoteConsumer.redeliver_unacknowledged_messages(self))

    def has_message_available(self) -> bool:
        return self._follow(lambda: RemoteConsumer.has_message_available(self))

    def get_last_message_id(self) -> MessageId:
        return self._follow(lambda: RemoteConsumer.get_last_message_id(self))

    def unsubscribe(self) -> None:
        self._follow(lambda: RemoteConsumer.unsubscribe(self))

    def seek(self, position) -> None:
        self._follow(lambda: RemoteConsumer.seek(self, position))

    def _lasts(self) -> list[tuple[MessageId, int]]:
        return self._follow(lambda: RemoteConsumer._lasts(self))


@strict_class
class ClusterConsumer:
    """``client.subscribe(topic, ...)`` on a cluster: RemoteConsumer's API over a consumer
    per partition (one name on all). With several partitions, a fetcher per partition takes
    up to receiver_queue_size messages ahead into a queue that receives draw from in arrival
    order (as Pulsar's receiver queue); what is taken ahead and not handed out is dispatched
    to this consumer and unacknowledged, so the broker hands it out again when it closes,
    and a redelivery drops it here first."""

    _listener: MessageListener | None = None  # with a message_listener, it receives
    _part_type: Callable[..., Any] = _PartConsumer  # a reader's parts are readers

    def __init__(self, cluster, topic: str, partitions: list[str], subscription, options):
        self._topic = topic
        self._subscription = subscription
        self._parts: list[_PartConsumer] = []
        opts = dict(options)
        try:
            for partition in partitions:
                part = self._part_type(cluster, partition, subscription, opts)
                opts["consumer_name"] = part.consumer_name()
                self._parts.append(part)
        except BaseException:
            for part in self._parts:
                quietly(part.close)
            raise
        self._name = opts["consumer_name"]
        self._queue_size = options.get("receiver_queue_size") or 1000
        self._closed = False
        self._cond = threading.Condition()
        self._queue: collections.deque = collections.deque()  # (partition index, message)
        self._held = [0] * len(self._parts)  # messages of each partition in the queue
        self._generations = [0] * len(self._parts)  # times each was subscribed again
        self._fetching = 0  # fetches under way
        self._paused = 0  # redeliveries and unsubscribes waiting for no fetch under way
        self._error: BaseException | None = None  # a fetcher's, raised by the next receive
        if len(self._parts) > 1:
            for i, part in enumerate(self._parts):
                part.on_recreate = functools.partial(self._drop, i)
            for i in range(len(self._parts)):
                threading.Thread(
                    target=self._fetch, args=(i,), name="pulsartxn-fetch", daemon=True
                ).start()

    def topic(self) -> str:
        """The topic's full name (persistent://tenant/namespace/name), as the broker's."""
        return TopicName.parse(self._topic).full

    def consumer_name(self) -> str:
        return self._name

    def subscription_name(self) -> str:
        return self._subscription

    def is_connected(self) -> bool:
        return not self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise errors.AlreadyClosed(f"consumer {self._name} of {self._subscription} is closed")

    # -- fetching ----------------------------------------------------------------------------

    def _fetch(self, i: int) -> None:
        part = self._parts[i]
        cond = self._cond
        delay = 0.05
        while True:
            with cond:
                while not self._closed and (self._paused or self._held[i] >= self._queue_size):
                    cond.wait()
                if self._closed:
                    return
                room = self._queue_size - self._held[i]
                self._fetching += 1
            # Each message with the generation of the consumer it came from: one made again
            # since hands it out again, so that copy goes (as _drop).
            msgs: list[tuple[int, Message]] = []
            error = None
            try:
                try:
                    msg = part.receive(FETCH_WAIT_MS)
                    msgs.append((self._generations[i], msg))
                except OperationTimedOut:
                    raise  # its broker does not answer: a fault, not an empty wait
                except errors.Timeout:
                    pass
                if msgs and room > 1:
                    more = part.batch_receive(room - 1, 0)
                    msgs.extend((self._generations[i], m) for m in more)
            except errors.AlreadyClosed:
                if not self._closed:
                    error = errors.AlreadyClosed(f"consumer of {part.topic()} was closed")
            except Exception as exc:  # noqa: BLE001 - handed to the next receive
                error = exc
            with cond:
                self._fetching -= 1
                if not self._closed:
                    now = self._generations[i]
                    kept = [(i, m) for g, m in msgs if g == now]
                    self._queue.extend(kept)
                    self._held[i] += len(kept)
                    if error is not None:
                        self._error = error
                cond.notify_all()
                if error is not None and not self._closed:
                    cond.wait(delay)  # then try again (a lasting fault is raised meanwhile)
                    delay = min(delay * 2, 1.0)
                else:
                    delay = 0.05

    def _drop(self, i: int) -> None:
        """Partition i's consumer was made again (its broker restarted, or the session was
        lost): what it had taken ahead is handed out again there, so the copies here go."""
        with self._cond:
            self._generations[i] += 1
            if self._held[i]:
                self._queue = collections.deque(e for e in self._queue if e[0] != i)
                self._held[i] = 0
                self._cond.notify_all()

    def _take(self, n: int) -> list[Message]:
        """Up to n messages from the queue (the condition held)."""
        out = []
        while self._queue and len(out) < n:
            i, msg = self._queue.popleft()
            self._held[i] -= 1
            out.append(msg)
        if out:
            self._cond.notify_all()
        return out

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _pause(self) -> None:
        """Stop the fetchers, and wait until what their calls under way were handed has
        landed here (the condition held; undone by _resume)."""
        self._paused += 1
        while self._fetching:
            self._cond.wait()

    def _quiesce(self) -> None:
        """Stop the fetchers and drop what they took ahead (the condition held; undone by
        _resume)."""
        self._pause()
        self._queue.clear()
        self._held = [0] * len(self._parts)

    def _resume(self) -> None:
        with self._cond:
            self._paused -= 1
            self._cond.notify_all()

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, timeout_millis: int | None = None) -> Message:
        if self._listener is not None:
            self._listener.refuse("receive")
        self._check_open()
        if len(self._parts) == 1:
            return self._parts[0].receive(timeout_millis)
        check_count("timeout_millis", timeout_millis, least=0, optional=True)
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        with self._cond:
            while True:
                self._check_open()
                got = self._take(1)
                if got:
                    return got[0]
                self._raise_error()
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise errors.Timeout(f"no message on {self._topic} within {timeout_millis} ms")
                self._cond.wait(wait)

    def batch_receive(
        self, max_num_messages: int = 1000, timeout_millis: int = 100
    ) -> list[Message]:
        """Up to max_num_messages (at most receiver_queue_size), waiting at most
        timeout_millis for them."""
        if self._listener is not None:
            self._listener.refuse("batch_receive")
        self._check_open()
        if len(self._parts) == 1:
            return self._parts[0].batch_receive(max_num_messages, timeout_millis)
        check_count("max_num_messages", max_num_messages, least=1)
        check_count("timeout_millis", timeout_millis, least=0)
        n = min(max_num_messages, self._queue_size)
        deadline = time.monotonic() + timeout_millis / 1000.0
        with self._cond:
            while len(self._queue) < n and not self._closed and self._error is None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                self._cond.wait(wait)
            self._check_open()
            out = self._take(n)
            if not out:
                self._raise_error()
            return out

    def has_message_available(self) -> bool:
        """A message taken ahead here, or one a partition's broker has not handed out. The
        fetchers stop first and what they are being handed lands (within FETCH_WAIT_MS): a
        broker counts what it handed out as taken, so asking it while its answer was on the
        way said no."""
        self._check_open()
        with self._cond:
            self._pause()
            queued = bool(self._queue)
        try:
            return queued or any(part.has_message_available() for part in self._parts)
        finally:
            self._resume()

    def get_last_message_id(self) -> MessageId:
        """As the embedded consumer's: on several partitions, the one published last."""
        self._check_open()
        return positions.last_of([last for part in self._parts for last in part._lasts()])

    def get_last_message_ids(self) -> list[MessageId]:
        self._check_open()
        return [mid for part in self._parts for mid, _ in part._lasts()]

    def seek(self, position: MessageId | int) -> None:
        """Each partition's broker resets its cursor (a MessageId: its partition's only);
        what was taken ahead here is dropped first."""
        self._check_open()
        positions.check_position(position)
        if len(self._parts) == 1:
            self._parts[0].seek(position)
            return
        chosen = range(len(self._parts))
        if not positions.is_everywhere(position):
            chosen = [self._parts.index(self._part_of(position))]
        with self._cond:
            # The fetchers stop; only what the sought partitions took ahead is dropped.
            self._pause()
            self._queue = collections.deque(e for e in self._queue if e[0] not in chosen)
            for i in chosen:
                self._held[i] = 0
        try:
            for i in chosen:
                self._parts[i].seek(position)
        finally:
            self._resume()

    # -- acknowledging -----------------------------------------------------------------------

    def _part_of(self, msg_or_id) -> _PartConsumer:
        if isinstance(msg_or_id, Message):
            mid = msg_or_id.message_id()
        elif isinstance(msg_or_id, MessageId):
            mid = msg_or_id
        else:
            raise TypeError(f"expected a Message or MessageId, not {type(msg_or_id).__name__}")
        if len(self._parts) == 1:
            return self._parts[0]
        index = mid.partition()
        if not 0 <= index < len(self._parts):
            raise errors.InvalidMessageId(f"{mid!r} is not from {self._topic}")
        return self._parts[index]

    def acknowledge(
        self, msg_or_id: Message | MessageId, txn: RemoteTransaction | TxnID | None = None
    ) -> None:
        self._check_open()
        self._part_of(msg_or_id).acknowledge(msg_or_id, txn)

    def acknowledge_cumulative(
        self, msg_or_id: Message | MessageId, txn: RemoteTransaction | TxnID | None = None
    ) -> None:
        self._check_open()
        self._part_of(msg_or_id).acknowledge_cumulative(msg_or_id, txn)

    def negative_acknowledge(self, msg_or_id: Message | MessageId) -> None:
        self._check_open()
        self._part_of(msg_or_id).negative_acknowledge(msg_or_id)

    def redeliver_unacknowledged_messages(self) -> None:
        """What was taken ahead is dropped here, then every partition's broker hands out
        again all this consumer has not acknowledged."""
        self._check_open()
        if len(self._parts) == 1:
            self._parts[0].redeliver_unacknowledged_messages()
            return
        with self._cond:
            self._quiesce()
        try:
            for part in self._parts:
                part.redeliver_unacknowledged_messages()
        finally:
            self._resume()

    # -- lifecycle ---------------------------------------------------------------------------

    def unsubscribe(self) -> None:
        self._check_open()
        with self._cond:
            self._quiesce()
        try:
            for part in self._parts:
                part.unsubscribe()
        except BaseException:
            self._resume()
            raise
        with self._cond:
            self._closed = True
            self._paused -= 1
            self._cond.notify_all()
        for part in self._parts:
            quietly(part.close)

    def close(self) -> None:
        if self._closed:
            return
        with self._cond:
            self._closed = True
            self._queue.clear()  # dispatched here and unacknowledged: handed out again
            self._cond.notify_all()
        for part in self._parts:
            quietly(part.close)
        if self._listener is not None:
            self._listener.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
