"""Consumers: receive from one subscription over all partitions of a topic, and acknowledge."""

from __future__ import annotations

import abc
import enum
import itertools
import threading
import time
from typing import NoReturn

from .._native import TxnID
from .._native.keywords import refused, strict_class
from ..errors import (
    AlreadyClosed,
    InvalidConfiguration,
    InvalidMessageId,
    Timeout,
    TransactionConflict,
    excerpt,
)
from ..txn.log import IN_PROCESS
from ..txn.transaction import Transaction
from . import positions
from .listener import MessageListener
from .message import Message, MessageId
from .subscription import EXCLUSIVE, FAILOVER, KEY_SHARED, MULTI, SHARED, TYPE_NAMES, Subscription


def check_count(name: str, value: object, least: int, optional: bool = False) -> None:
    """ValueError unless `value` is an int (not a bool) of at least `least`, or None if
    `optional`; the text shows at most an excerpt of what was given."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a non-negative int" if least == 0 else f"an int of at least {least}"
        either = " or None" if optional else ""
        raise ValueError(f"{name} must be {kind}{either}, not {excerpt(value)}")


class ConsumerType(enum.Enum):
    Exclusive = EXCLUSIVE
    Shared = SHARED
    Failover = FAILOVER
    KeyShared = KEY_SHARED


class InitialPosition(enum.Enum):
    Latest = 0
    Earliest = 1


class Isolation(enum.Enum):
    READ_COMMITTED = 0
    READ_UNCOMMITTED = 1


# subscribe's enum arguments, checked alike by both clients and sent by name over the wire.
SUBSCRIBE_ENUMS = (
    ("subscription_type", ConsumerType),
    ("initial_position", InitialPosition),
    ("isolation", Isolation),
)


def check_subscribe_enums(**values) -> None:
    """TypeError unless each of SUBSCRIBE_ENUMS given is a member of its enum."""
    for name, kind in SUBSCRIBE_ENUMS:
        value = values[name]
        if not isinstance(value, kind):
            article = "an" if kind.__name__[0] in "AEIOU" else "a"
            raise TypeError(f"{name} must be {article} {kind.__name__}, not {excerpt(value)}")


def resolve_subscription_type(
    subscription_type: ConsumerType | None, consumer_type: ConsumerType | None
) -> ConsumerType:
    """subscribe's type: `subscription_type` or pulsar-client's name for it, `consumer_type`
    (not both); Exclusive when neither is given."""
    if subscription_type is not None and consumer_type is not None:
        raise TypeError(
            "subscribe() got both subscription_type and consumer_type (pulsar-client's name "
            "for it): give one"
        )
    chosen = consumer_type if consumer_type is not None else subscription_type
    if chosen is None:
        return ConsumerType.Exclusive
    if not isinstance(chosen, ConsumerType):
        name = "consumer_type" if consumer_type is not None else "subscription_type"
        raise TypeError(f"{name} must be a ConsumerType, not {excerpt(chosen)}")
    return chosen


_names = itertools.count()


@strict_class
class Consumer(metaclass=abc.ABCMeta):  # noqa: B024 - for register()
    """``client.subscribe(topic, subscription, ...)``: receive and acknowledge messages."""

    @classmethod
    def __subclasshook__(cls, sub):
        # A reader (it reads with read_next) is no consumer, even one built on a consumer's
        # code (the cluster's): isinstance(reader, Consumer) is False on every client.
        return False if callable(getattr(sub, "read_next", None)) else NotImplemented

    _listener: MessageListener | None = None  # with a message_listener, it receives

    def __init__(
        self,
        client,
        topic: str,
        subscription_name: str,
        subscriptions: list[Subscription],
        sub_type: int,
        consumer_name: str | None,
        negative_ack_redelivery_delay_ms: int,
        read_committed: bool = True,
        receiver_queue_size: int = 1000,
        max_bytes: int = 64 * 1024 * 1024,
        ack_timeout_ms: int | None = None,
        dead_letter=None,
    ) -> None:
        """ack_timeout_ms: unacknowledged messages come back after it (None: never);
        dead_letter: the consumer's dead_letter.DeadLetter, or None."""
        self._client = client
        self._topic = topic
        self._subscription_name = subscription_name
        self._subs = subscriptions
        self._by_partition = {s.partition.index: s for s in subscriptions}
        self._type = sub_type
        self._name = consumer_name or f"consumer-{next(_names)}"
        self._nack_delay = negative_ack_redelivery_delay_ms / 1000.0
        self._queue_size = receiver_queue_size  # messages one batch_receive takes at most
        self._max_bytes = max_bytes  # and bytes of message data (one larger goes alone)
        self._ack_timeout_s = (ack_timeout_ms or 0) / 1000.0
        self._dead_letter = dead_letter
        self._cond = threading.Condition()
        self._signal = 0  # wake-ups so far: a wait is skipped if one came since it parked
        self._parked = 0  # receives parked on the subscriptions, waiting for a wake-up
        self._roused = False  # a wake-up came since the last park: those parked will look
        self._next = 0
        self._closed = False
        # A network session's transactional acks are stored before they are answered: its
        # transactions outlive this process (an in-process client's die with it).
        self._store_acks = client._owner != IN_PROCESS
        attached = []
        try:
            for sub in subscriptions:
                sub.attach(self, sub_type, read_committed, self._ack_timeout_s, self._dead_letter)
                attached.append(sub)
        except BaseException:
            for sub in attached:
                sub.detach(self)
            raise

    # -- identity --------------------------------------------------------------------------

    def topic(self) -> str:
        return self._topic

    def subscription_name(self) -> str:
        return self._subscription_name

    def consumer_name(self) -> str:
        return self._name

    def _wake(self) -> None:
        with self._cond:
            self._signal += 1
            self._cond.notify_all()

    def _wake_parked(self) -> bool:
        """Wake the receives parked here; False when none is, or one was woken already."""
        with self._cond:
            if not self._parked or self._roused:
                return False
            self._roused = True
            self._signal += 1
            self._cond.notify_all()
            return True

    def _park(self) -> int:
        """Announce a wait to every subscription before a last poll; the signal to wait on."""
        with self._cond:
            self._parked += 1
            self._roused = False
            seen = self._signal
        for sub in self._subs:
            sub.park(self)
        return seen

    def _unpark(self, seen: int) -> None:
        """Leave without waiting (what was taken since `seen` is handed on, as _pass_on)."""
        with self._cond:
            self._parked -= 1
        self._pass_on(seen)

    def _pass_on(self, seen: int | None) -> None:
        """A wake-up taken since `seen` was meant for a message this receive may have left (it
        took another partition's, or was full): it goes on to a consumer parked where more is."""
        if seen is not None and self._signal != seen:
            for sub in self._subs:
                sub.pass_on()

    def _sleep(self, seen: int, wait: float | None) -> None:
        """Wait for a wake-up since `seen` (or `wait` seconds), then stop being parked."""
        with self._cond:
            try:
                if self._signal == seen and not self._closed:
                    self._cond.wait(wait)
            finally:
                self._parked -= 1

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed(f"consumer {self._name} of {self._subscription_name} is closed")

    # -- receiving -------------------------------------------------------------------------

    def _poll(self) -> Message | None:
        n = len(self._subs)
        start = self._next
        for i in range(n):
            sub = self._subs[(start + i) % n]
            msg = sub.take(self)
            if msg is not None:
                self._next = (start + i + 1) % n
                return msg
        return None

    def _poll_many(self, out: list, n: int, budget: int) -> tuple[int, bool]:
        """Messages available now into `out` until it holds n, partition after partition from
        the next in turn, within `budget` bytes (as Subscription.take_many): (budget left,
        whether the budget stopped it)."""
        subs = self._subs
        k = len(subs)
        start = self._next
        for i in range(k):
            before = len(out)
            nbytes, full = subs[(start + i) % k].take_many(self, out, n, budget)
            if len(out) > before:
                budget -= nbytes
                self._next = (start + i + 1) % k
            if full or len(out) >= n:
                return budget, full
        return budget, False

    def _gather(self, out: list, n: int, budget: int, deadline: float | None) -> None:
        """Take messages into `out` until it holds n or the next would pass `budget` bytes,
        waiting for them until `deadline` (None: for ever)."""
        seen = None
        while True:
            budget, full = self._poll_many(out, n, budget)
            if full or len(out) >= n:
                self._pass_on(seen)
                return
            self._check_open()
            if deadline is not None and time.monotonic() >= deadline:
                return
            # Parked before the last look (and the look at the negative acks' due times):
            # whatever comes after it wakes this receive.
            seen = self._park()
            try:
                budget, full = self._poll_many(out, n, budget)
                due = min(
                    (d for d in (s.next_due() for s in self._subs) if d is not None),
                    default=None,
                )
            except BaseException:
                self._unpark(seen)
                raise
            if full or len(out) >= n:
                self._unpark(seen)
                return
            now = time.monotonic()
            wait = None if deadline is None else max(0.0, deadline - now)
            if due is not None:
                wait = max(0.0, due - now) if wait is None else min(wait, max(0.0, due - now))
            self._sleep(seen, wait)

    def receive(self, timeout_millis: int | None = None, **unknown: NoReturn) -> Message:
        """The next message; raises Timeout when none arrives within timeout_millis."""
        if unknown:
            raise refused(Consumer.receive, unknown)
        if self._listener is not None:
            self._listener.refuse("receive")
        self._check_open()
        check_count("timeout_millis", timeout_millis, least=0, optional=True)
        msg = self._poll()
        if msg is not None:
            return msg
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        out: list[Message] = []
        self._gather(out, 1, 0, deadline)
        if out:
            return out[0]
        raise Timeout(f"no message on {self._topic} within {timeout_millis} ms")

    def batch_receive(
        self, max_num_messages: int = 1000, timeout_millis: int = 100
    ) -> list[Message]:
        """Up to max_num_messages, waiting at most timeout_millis for them to arrive. One call
        takes at most the receiver queue size and the broker's dispatch_max_bytes of message
        data (a larger message comes alone): callers loop for more."""
        if self._listener is not None:
            self._listener.refuse("batch_receive")
        self._check_open()
        check_count("max_num_messages", max_num_messages, least=1)
        check_count("timeout_millis", timeout_millis, least=0)
        deadline = time.monotonic() + timeout_millis / 1000.0
        out: list[Message] = []
        self._gather(out, min(max_num_messages, self._queue_size), self._max_bytes, deadline)
        return out

    def has_message_available(self) -> bool:
        self._check_open()
        return any(sub.has_available(self) for sub in self._subs)

    def get_last_message_id(self) -> MessageId:
        """The last message this consumer may read; on a partitioned topic, the one of all
        partitions published last (MessageId.earliest when none holds one)."""
        self._check_open()
        return positions.last_of(self._lasts())

    def get_last_message_ids(self) -> list[MessageId]:
        """The last message this consumer may read on each partition, in partition order
        (entry -1 on a partition that has none yet)."""
        self._check_open()
        return [mid for mid, _ in self._lasts()]

    def _lasts(self) -> list[tuple[MessageId, int]]:
        """(last readable id, its publish time) of each partition, in partition order."""
        self._check_open()
        return [positions.last_message(s.partition, s.read_committed) for s in self._subs]

    def seek(self, position: MessageId | int) -> None:
        """Reset the subscription to a MessageId (that message is delivered again; earliest
        and latest apply to every partition, another id to its own) or a publish time in ms
        (every partition: from the first message published at or after it)."""
        self._check_open()
        positions.check_position(position)
        self._seek(position, inclusive=True)

    def _seek(self, position: MessageId | int, inclusive: bool) -> None:
        if positions.is_everywhere(position):
            subs = self._subs
        else:
            part = positions.partition_of(position, [s.partition for s in self._subs], self._topic)
            subs = [self._by_partition[part.index]]
        positions.reset(subs, [positions.start_of(s.partition, position, inclusive) for s in subs])
        self._wake()

    # -- acknowledging ---------------------------------------------------------------------

    def _sub_for(self, msg_or_id) -> tuple[Subscription, MessageId]:
        if isinstance(msg_or_id, Message):
            mid = msg_or_id.message_id()
        elif isinstance(msg_or_id, MessageId):
            mid = msg_or_id
        else:
            raise TypeError(f"expected a Message or MessageId, not {type(msg_or_id).__name__}")
        sub = self._by_partition.get(mid.partition())
        if sub is None:
            raise InvalidMessageId(f"{mid!r} is not from {self._topic}")
        return sub, mid

    def acknowledge(
        self,
        msg_or_id: Message | MessageId,
        txn: Transaction | TxnID | None = None,
        **unknown: NoReturn,
    ) -> None:
        """Acknowledge; with txn, held for the transaction until it ends (a conflict with
        another transaction or an already acknowledged message raises TransactionConflict,
        and the transaction can then only abort)."""
        if unknown:
            raise refused(Consumer.acknowledge, unknown)
        self._acknowledge(msg_or_id, txn, cumulative=False)

    def acknowledge_cumulative(
        self, msg_or_id: Message | MessageId, txn: Transaction | TxnID | None = None
    ) -> None:
        self._acknowledge(msg_or_id, txn, cumulative=True)

    def _acknowledge(self, msg_or_id, txn, cumulative: bool) -> tuple[str, str] | None:
        """Either acknowledge; the (partition, subscription) a transactional one registered
        the transaction with (the network service settles it), None for a plain one."""
        self._check_open()
        if cumulative and self._type in MULTI:
            raise InvalidConfiguration(
                f"cumulative acknowledgement is not allowed on {TYPE_NAMES[self._type]} "
                f"subscription {self._subscription_name}"
            )
        sub, mid = self._sub_for(msg_or_id)
        if txn is None:
            sub.acknowledge(mid, cumulative=cumulative)
            return None
        return self._txn_ack(sub, mid, txn, cumulative=cumulative)

    def _txn_ack(self, sub, mid: MessageId, txn, cumulative: bool) -> tuple[str, str]:
        txn = self._client._txn_for(txn, "acknowledge in")
        entry_id, batch_index, batch_size = sub.partition.position_of(mid)
        name = (sub.partition.topic, sub.name)
        # The subscription's registration with the coordinator rides in the pending-ack log
        # write of these acks (or in the commit), not in a write of its own.
        registration = txn._stage_subscription(name)
        try:
            sub.pending_ack.ack(txn.id, entry_id, batch_index, batch_size, cumulative, registration)
        except TransactionConflict as exc:
            txn._failed(exc)
            raise
        with sub.lock:
            drained = sub.key_shared is not None and sub.key_shared.unblocked()
        if drained:
            sub.notify()  # the message left its consumer: a key draining may be free
        if registration is not None:
            txn._subscriptions.add(name)
        txn._ack_counts[name] = txn._ack_counts.get(name, 0) + 1
        if self._store_acks:
            sub.pending_ack.store(txn.id)
        return name

    def negative_acknowledge(self, msg_or_id: Message | MessageId) -> None:
        self._check_open()
        sub, mid = self._sub_for(msg_or_id)
        sub.negative_acknowledge(mid, self._nack_delay)

    def redeliver_unacknowledged_messages(self) -> None:
        self._check_open()
        for sub in self._subs:
            sub.redeliver_unacknowledged(self)

    # -- lifecycle -------------------------------------------------------------------------

    def unsubscribe(self) -> None:
        self._check_open()
        self._client._unsubscribe(self)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in self._subs:
            sub.detach(self)
            sub.wait_persisted()
        self._wake()
        self._client._consumer_closed(self)
        if self._listener is not None:
            self._listener.stop()

    def is_connected(self) -> bool:
        return not self._closed

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self):
        while True:
            yield self.receive()
