"""The remote client's readers: the server's reader over a handle, re-created after a lost
session where it stood (after the last message read on each partition, or where it sought);
a listener runs on a thread of this process."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from .. import errors
from .._native.keywords import strict_class
from ..messaging import positions
from ..messaging.consumer import Isolation, check_count
from ..messaging.listener import MessageListener
from ..messaging.message import Message, MessageId
from ..messaging.reader import check_reader_args
from ..messaging.topic_name import check_keyed_name
from ..server import protocol
from .handles import Handle


def reader_options(
    start_message_id,
    reader_listener,
    receiver_queue_size,
    reader_name,
    subscription_role_prefix,
    is_read_compacted,
    start_message_id_inclusive,
    isolation,
) -> dict:
    """create_reader's options as they travel, checked first as the embedded client does."""
    check_reader_args(start_message_id, reader_listener, is_read_compacted)
    check_count("receiver_queue_size", receiver_queue_size, least=1)
    for key, value in (
        ("reader_name", reader_name),
        ("subscription_role_prefix", subscription_role_prefix),
    ):
        if value is not None:
            check_keyed_name(key, value)
    if not isinstance(isolation, Isolation):
        raise TypeError(f"isolation must be an Isolation, not {errors.excerpt(isolation)}")
    return {
        "receiver_queue_size": receiver_queue_size,
        "reader_name": reader_name,
        "subscription_role_prefix": subscription_role_prefix,
        "start_message_id_inclusive": bool(start_message_id_inclusive),
        "isolation": isolation.name,
    }


@strict_class
class RemoteReader(Handle):
    def __init__(
        self, client, topic: str, start: MessageId, options: dict, listener: Callable | None
    ) -> None:
        super().__init__(client)
        self._topic = topic
        self._start: MessageId | int = start
        self._options = options
        self._inclusive = options["start_message_id_inclusive"]
        # partition index -> (id, inclusive): where a re-created reader starts there.
        self._resume: dict[int, tuple[MessageId, bool]] = {}
        self._lock = threading.Lock()
        self._listener = None
        self._ensure()
        if listener is not None:
            self._listener = MessageListener(
                self, listener, self._read, self.reader_name(), "reader_listener"
            )
            self._listener.start()

    def _create(self) -> int:
        with self._lock:
            start, resume = self._start, dict(self._resume)
        args: dict[str, object] = {
            "topic": self._topic,
            "options": self._options,
            "resume": {str(i): [m.serialize().hex(), inc] for i, (m, inc) in resume.items()},
        }
        if isinstance(start, MessageId):
            args["start"] = start.serialize().hex()
        else:
            args["start_time"] = start
        info = self._client._create("create_reader", args)
        self._options = {**self._options, "reader_name": info["name"]}
        self._full_topic = info["topic"]
        return info["handle"]

    def topic(self) -> str:
        return self._full_topic

    def reader_name(self) -> str:
        return self._options["reader_name"]

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; raises Timeout when none comes within timeout_millis."""
        if self._listener is not None:
            self._listener.refuse("read_next")
        return self._read(timeout_millis)

    def _read(self, timeout_millis: int | None) -> Message:
        msg = self._wait_for_message("read_next", timeout_millis)
        mid = msg.message_id()
        with self._lock:
            self._resume[mid.partition()] = (mid, False)
        return msg

    def _read_many(self, n: int) -> list[Message]:
        """Up to n messages there now, in one call (a cluster reader's fetch)."""
        out = self._given_first("read_many", n) or [
            protocol.decode_message(body)
            for body in self._delivering("read_many", {"max_num_messages": n})
        ]
        if out:
            with self._lock:
                for msg in out:
                    mid = msg.message_id()
                    self._resume[mid.partition()] = (mid, False)
        return out

    def has_message_available(self) -> bool:
        return self._message_available()

    def seek(self, position: MessageId | int) -> None:
        """As the embedded Reader's seek."""
        positions.check_position(position)
        if isinstance(position, MessageId):
            self._client._call("seek", {"id": position.serialize().hex()}, owner=self)
        else:
            self._client._call("seek", {"timestamp": position}, owner=self)
        self._forget_given()  # nothing read before the seek is given again
        with self._lock:
            if not isinstance(position, MessageId) or positions.is_everywhere(position):
                self._start, self._resume = position, {}
            else:
                self._resume[position.partition()] = (position, self._inclusive)

    def get_last_message_id(self) -> MessageId:
        return MessageId(*self._client._json("get_last_message_id", {}, owner=self)["id"])

    def get_last_message_ids(self) -> list[MessageId]:
        return [mid for mid, _ in self._lasts()]

    def _lasts(self) -> list[tuple[MessageId, int]]:
        """(last readable id, its publish time) of each partition, in partition order."""
        out = self._client._json("get_last_message_ids", {}, owner=self)
        return [(MessageId(*f), t) for f, t in zip(out["ids"], out["times"])]

    def close(self) -> None:
        self._close_handle("close_consumer")

    def __enter__(self) -> RemoteReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield self.read_next()
