"""The remote client's consumers: receives, batch receives as DoGet streams, acks."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight

from .._native import TxnID
from .._native.keywords import strict_class
from ..messaging.consumer import check_count
from ..messaging.listener import MessageListener
from ..messaging.message import Message, MessageId
from ..messaging.positions import check_position
from ..messaging.topic_name import TopicName
from ..server import protocol
from ..server.protocol import SessionLost, frame
from .handles import (
    Handle,
    OperationTimedOut,
    RemoteTransaction,
    mid_hex,
    txn_str,
)


@strict_class
class RemoteConsumer(Handle):
    """``client.subscribe(...)`` on a remote broker: receive and acknowledge messages."""

    _listener: MessageListener | None = None  # with a message_listener, it receives

    def __init__(self, client, topic, subscription, options) -> None:
        super().__init__(client)
        self._topic = topic
        self._subscription = subscription
        self._options = options
        self._ensure()

    def _create(self) -> int:
        info = self._client._create(
            "subscribe",
            {"topic": self._topic, "subscription": self._subscription, "options": self._options},
        )
        # A reconnect subscribes again under the same name.
        self._options = {**self._options, "consumer_name": info["name"]}
        return info["handle"]

    def topic(self) -> str:
        """The topic's full name (persistent://tenant/namespace/name), as the broker's."""
        return TopicName.parse(self._topic).full

    def consumer_name(self) -> str:
        return self._options["consumer_name"]

    def subscription_name(self) -> str:
        return self._subscription

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The server waits at most its MAX_WAIT_MS a call: a longer wait asks again."""
        if self._listener is not None:
            self._listener.refuse("receive")
        return self._wait_for_message("receive", timeout_millis)

    def batch_receive(
        self, max_num_messages: int = 1000, timeout_millis: int = 100
    ) -> list[Message]:
        """Dispatch as a DoGet stream of record batches of about 4 MiB each."""
        if self._listener is not None:
            self._listener.refuse("batch_receive")
        check_count("max_num_messages", max_num_messages, least=1)
        check_count("timeout_millis", timeout_millis, least=0)
        given = self._given_first("batch_receive", max_num_messages)
        if given:
            return given
        for attempt in (0, 1):
            handle = self._ensure()
            seen = self._generation  # not sent once the session was opened again (as _raw)
            try:
                table = self._batch_get(handle, seen, max_num_messages, timeout_millis)
            except SessionLost:
                if attempt:
                    raise
                self._client._reopen(seen)  # nothing when it was opened again since `seen`
                continue
            out = []
            for batch in table.to_batches():
                out.extend(protocol.batch_to_messages(batch))
            return out
        raise AssertionError("unreachable")

    def _batch_get(self, handle: int, seen: int, n: int, timeout_millis: int) -> pa.Table:
        """One batch_receive stream, numbered as the other delivering calls (see
        Handle._delivering) and re-sent as any call while the broker is unreachable: its
        number gets what its first attempt was given; one that raised unanswered leaves that
        to the next."""
        client = self._client
        args = {
            "op": "receive",
            "handle": handle,
            "max_num_messages": n,
            "timeout_millis": timeout_millis,
            "session": client._session,
        }
        with self._calls.numbered(seen, "batch_receive") as numbers:
            ticket = flight.Ticket(frame({**args, **numbers}))
            with client._wait.allow("receive", timeout_millis / 1000.0):
                return client._retrying(
                    "batch_receive", seen, lambda o: client._flight.do_get(ticket, o).read_all()
                )

    def _again(self, kind: str) -> list[Message]:
        if kind != "batch_receive":
            return super()._again(kind)
        table = self._batch_get(self._ensure(), self._generation, 1, 0)
        return [m for batch in table.to_batches() for m in protocol.batch_to_messages(batch)]

    def _ack(self, msg_or_id, txn, cumulative: bool) -> None:
        self._ensure()  # a closed consumer says so first, as the embedded one
        try:
            out = self._client._json(
                "ack",
                {
                    "id": mid_hex(msg_or_id),
                    "txn": txn_str(txn),
                    "capability": self._client._capability_of(txn_str(txn)),
                    "cumulative": cumulative,
                },
                owner=self,
            )
        except OperationTimedOut as exc:
            if isinstance(txn, RemoteTransaction):
                txn._send_failed(exc)  # the ack may be in it or not: it can only abort now
            raise
        if isinstance(txn, RemoteTransaction) and out.get("participant"):
            key = tuple(out["participant"])
            txn._ack_counts[key] = txn._ack_counts.get(key, 0) + 1

    def acknowledge(
        self, msg_or_id: Message | MessageId, txn: RemoteTransaction | TxnID | None = None
    ) -> None:
        self._ack(msg_or_id, txn, False)

    def acknowledge_cumulative(
        self, msg_or_id: Message | MessageId, txn: RemoteTransaction | TxnID | None = None
    ) -> None:
        self._ack(msg_or_id, txn, True)

    def negative_acknowledge(self, msg_or_id: Message | MessageId) -> None:
        self._ensure()
        self._client._call("nack", {"id": mid_hex(msg_or_id)}, owner=self)

    def redeliver_unacknowledged_messages(self) -> None:
        self._client._call("redeliver", {}, owner=self)
        self._forget_given()  # what a lost call was given is redelivered now

    def has_message_available(self) -> bool:
        return self._message_available()

    def get_last_message_id(self) -> MessageId:
        out = self._client._json("get_last_message_id", {}, owner=self)
        return MessageId(*out["id"])

    def get_last_message_ids(self) -> list[MessageId]:
        return [mid for mid, _ in self._lasts()]

    def _lasts(self) -> list[tuple[MessageId, int]]:
        """(last readable id, its publish time) of each partition, in partition order."""
        out = self._client._json("get_last_message_ids", {}, owner=self)
        return [(MessageId(*f), t) for f, t in zip(out["ids"], out["times"])]

    def seek(self, position: MessageId | int) -> None:
        """As the embedded consumer's seek."""
        check_position(position)
        if isinstance(position, MessageId):
            self._client._call("seek", {"id": position.serialize().hex()}, owner=self)
        else:
            self._client._call("seek", {"timestamp": position}, owner=self)
        self._forget_given()  # nothing given before the seek is given again

    def unsubscribe(self) -> None:
        # Run once: re-sent after its answer was lost, it must not find its handle gone.
        self._client._json_once("unsubscribe", {}, owner=self)
        self._closed = True

    def close(self) -> None:
        self._close_handle("close_consumer")
