"""A topic's reader on a cluster: one remote reader per partition at the broker that owns it
(following it), merged as a cluster consumer merges its partitions. What a fetcher took
ahead was read there (the reader moved on), so it is kept when a partition's reader is made
again: that one starts after the last message it read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from ..messaging.listener import MessageListener
from ..messaging.message import Message, MessageId
from ..messaging.positions import is_everywhere
from ..messaging.topic_name import TopicName
from .cluster_consumer import ClusterConsumer
from .placed import Placed
from .reader import RemoteReader

__all__ = ["ClusterReader"]


class _PartReader(Placed, RemoteReader):
    """One partition's reader, shaped as a cluster consumer's part (receive, batch_receive)."""

    def __init__(self, cluster, partition: str, start, options) -> None:
        self._place(cluster, partition)
        self.on_recreate = None
        RemoteReader.__init__(self, None, partition, start, options, None)

    def consumer_name(self) -> str:
        return self.reader_name()

    def receive(self, timeout_millis=None) -> Message:
        return self._follow(lambda: RemoteReader._read(self, timeout_millis))

    def batch_receive(self, max_num_messages=1000, timeout_millis=100) -> list[Message]:
        """What is there now, up to max_num_messages, in one call."""
        return self._follow(lambda: RemoteReader._read_many(self, max_num_messages))

    def has_message_available(self) -> bool:
        return self._follow(lambda: RemoteReader.has_message_available(self))

    def seek(self, position) -> None:
        self._follow(lambda: RemoteReader.seek(self, position))

    def _lasts(self) -> list[tuple[MessageId, int]]:
        return self._follow(lambda: RemoteReader._lasts(self))


class _ConsumersOnly:
    """A consumer's method that a reader does not offer (as Reader and RemoteReader)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        raise AttributeError(f"a reader has no {self.name}(): it is a consumer's")


class ClusterReader(ClusterConsumer):
    """``client.create_reader(topic, ...)`` on a cluster: RemoteReader's API over a reader per
    partition, at its owner."""

    receive = _ConsumersOnly()
    batch_receive = _ConsumersOnly()
    acknowledge = _ConsumersOnly()
    acknowledge_cumulative = _ConsumersOnly()
    negative_acknowledge = _ConsumersOnly()
    redeliver_unacknowledged_messages = _ConsumersOnly()
    unsubscribe = _ConsumersOnly()
    consumer_name = _ConsumersOnly()
    subscription_name = _ConsumersOnly()

    def __init__(
        self,
        cluster,
        topic: str,
        partitions: list[str],
        start: MessageId,
        options: dict,
        listener: Callable | None,
    ) -> None:
        self._start = start
        super().__init__(cluster, topic, partitions, "", dict(options))
        if listener is not None:  # the consumer's receive, from the listener's thread only
            self._listener = MessageListener(
                self,
                listener,
                partial(ClusterConsumer.receive, self),
                self._name,
                "reader_listener",
            )
            self._listener.start()

    def _part_type(self, cluster, partition: str, subscription: str, options: dict):
        opts = {k: v for k, v in options.items() if k != "consumer_name"}
        if options.get("consumer_name") is not None:
            opts["reader_name"] = options["consumer_name"]
        start = self._start
        index = TopicName.parse(partition).partition_index
        if not is_everywhere(start) and start.partition() != index:
            start = MessageId.earliest  # an id of another partition: from the start here
        return _PartReader(cluster, partition, start, opts)

    def _drop(self, i: int) -> None:
        """A partition's reader made again goes on after what it read: nothing is dropped."""

    def reader_name(self) -> str:
        return self._name

    def read_next(self, timeout_millis: int | None = None) -> Message:
        if self._listener is not None:
            self._listener.refuse("read_next")
        return ClusterConsumer.receive(self, timeout_millis)

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield self.read_next()
