"""Readers: a non-durable subscription over every partition of a topic, started at a chosen
position, as Pulsar's Reader. Its cursor is never written, it is not among the topic's
subscriptions (stats, unsubscribe), and it holds nothing back. See docs/API.md, "Reading"."""

from __future__ import annotations

import abc
import secrets
from collections.abc import Callable, Iterator

from .._native.keywords import strict_class
from ..errors import AlreadyClosed, InvalidConfiguration
from . import positions
from .consumer import Consumer
from .cursor import Cursor
from .listener import MessageListener
from .message import Message, MessageId
from .partition import Partition
from .subscription import EXCLUSIVE, Subscription


def reader_subscription(prefix: str | None) -> str:
    """A reader's subscription name: unique, as Pulsar's ("reader-" and random hex)."""
    return f"{prefix or 'reader'}-{secrets.token_hex(5)}"


def check_reader_args(start_message_id, reader_listener, is_read_compacted) -> None:
    """create_reader's checks that both clients make before anything is created."""
    if not isinstance(start_message_id, MessageId):
        raise TypeError(
            f"start_message_id must be a MessageId, not {type(start_message_id).__name__}"
        )
    if reader_listener is not None and not callable(reader_listener):
        raise TypeError("reader_listener must be callable (reader, message)")
    if is_read_compacted:
        raise InvalidConfiguration(
            "is_read_compacted=True: pulsartxn keeps no compacted view of a topic"
        )


@strict_class
class Reader(metaclass=abc.ABCMeta):  # noqa: B024 - for register()
    """client.create_reader(topic, start_message_id, ...): read_next() from the start on,
    every partition, read committed unless told otherwise."""

    def __init__(
        self,
        client,
        topic: str,
        partitions: list[Partition],
        start: MessageId | int,
        inclusive: bool,
        listener: Callable | None,
        queue_size: int,
        max_bytes: int,
        name: str | None,
        subscription: str,
        read_committed: bool,
        resume: dict[int, tuple[MessageId, bool]] | None = None,
    ) -> None:
        """`resume`: partition index -> (id, inclusive) to start there instead (a remote
        reader reconnected: after the last it read, or where it sought)."""
        self._topic = topic
        self._inclusive = inclusive
        self._subscription = subscription
        if not positions.is_everywhere(start):
            positions.partition_of(start, partitions, topic)  # InvalidMessageId if foreign
        subs = []
        for part in partitions:
            mark, partial = _start_on(part, start, inclusive)
            if resume and part.index in resume:
                mark, partial = positions.start_of(part, *resume[part.index])
            cursor = Cursor(mark)
            if partial is not None:
                cursor.ack_cumulative(*partial)
            sub = Subscription(part, subscription, cursor)
            sub.durable = False
            subs.append(sub)
        self._subs = subs
        self._consumer = Consumer(
            client,
            topic,
            subscription,
            subs,
            EXCLUSIVE,
            name or subscription,
            60_000,
            read_committed,
            queue_size,
            max_bytes,
        )
        for sub in subs:
            with sub.partition.lock:
                sub.partition.readers[subscription] = sub
        self._listener = None
        if listener is not None:
            self._listener = MessageListener(
                self, listener, self._read, self.reader_name(), "reader_listener"
            )
            self._listener.start()

    def topic(self) -> str:
        return self._topic

    def reader_name(self) -> str:
        return self._consumer.consumer_name()

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; raises Timeout when none comes within timeout_millis."""
        if self._listener is not None:
            self._listener.refuse("read_next")
        return self._read(timeout_millis)

    def _read(self, timeout_millis: int | None) -> Message:
        msg = self._consumer.receive(timeout_millis)
        # The cursor follows what was read (never stored): a seek or a reconnect moves it.
        self._consumer.acknowledge_cumulative(msg)
        return msg

    def _read_many(self, n: int, timeout_millis: int = 0) -> list[Message]:
        """Up to n messages there within timeout_millis (a remote cluster reader's fetch)."""
        msgs = self._consumer.batch_receive(n, timeout_millis)
        last = {m.message_id().partition(): m for m in msgs}  # each partition's, in order
        for msg in last.values():
            self._consumer.acknowledge_cumulative(msg)
        return msgs

    def has_message_available(self) -> bool:
        return self._consumer.has_message_available()

    def seek(self, position: MessageId | int) -> None:
        """Read again from a MessageId (the first message after it, or it with
        start_message_id_inclusive; earliest and latest apply to every partition, another
        id to its own) or from a publish time in ms (every partition)."""
        self._check_open()
        positions.check_position(position)
        self._consumer._seek(position, self._inclusive)

    def get_last_message_id(self) -> MessageId:
        return self._consumer.get_last_message_id()

    def get_last_message_ids(self) -> list[MessageId]:
        return self._consumer.get_last_message_ids()

    def _lasts(self) -> list[tuple[MessageId, int]]:
        self._check_open()
        return self._consumer._lasts()

    def is_connected(self) -> bool:
        return self._consumer.is_connected()

    def _check_open(self) -> None:
        if not self._consumer.is_connected():
            raise AlreadyClosed(f"reader of {self._topic} is closed")

    def close(self) -> None:
        if not self._consumer.is_connected():
            return
        self._consumer.close()
        for sub in self._subs:
            with sub.partition.lock:
                sub.partition.readers.pop(self._subscription, None)
        if self._listener is not None:
            self._listener.stop()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield self.read_next()


def _start_on(part: Partition, start, inclusive: bool):
    """Where a reader starts on `part`: `start` when it applies there; a MessageId of
    another partition leaves this one at the earliest (nothing is skipped unseen)."""
    if positions.is_everywhere(start) or start.partition() == part.index:
        return positions.start_of(part, start, inclusive)
    return positions.start_of(part, MessageId.earliest, True)
