"""Twin of ``_native/message.pyx``: a received message."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...messaging.message import MessageId


class Message:
    """A received message. Its id may be given as the five fields of a MessageId (a tuple):
    the MessageId is then made when first asked for."""

    __slots__ = (
        "_data",
        "_properties",
        "_key",
        "_id",
        "_topic",
        "_publish_time",
        "_redelivery_count",
        "_txn",
    )

    def __init__(
        self,
        data: bytes,
        properties: dict,
        key: str | None,
        message_id: MessageId | tuple,
        topic: str,
        publish_time: int,
        redelivery_count: int = 0,
        txn=None,
    ) -> None:
        self._data = data
        self._properties = properties
        self._key = key
        self._id = message_id
        self._topic = topic
        self._publish_time = publish_time
        self._redelivery_count = redelivery_count
        self._txn = txn

    def data(self) -> bytes:
        return self._data

    def value(self) -> bytes:
        return self._data

    def properties(self) -> dict:
        return dict(self._properties) if self._properties else {}

    def partition_key(self) -> str | None:
        return self._key

    def message_id(self) -> MessageId:
        mid = self._id
        if type(mid) is tuple:
            # Delivered with the id's fields: made on first use (most messages never are).
            # Imported here: pulsartxn.messaging.message imports this package.
            from ...messaging.message import MessageId

            mid = self._id = MessageId(*mid)
        return mid

    def topic_name(self) -> str:
        return self._topic

    def publish_timestamp(self) -> int:
        return self._publish_time

    def redelivery_count(self) -> int:
        return self._redelivery_count

    def __repr__(self) -> str:
        return f"Message(topic={self._topic!r}, id={self.message_id()!r}, {len(self._data)} bytes)"
