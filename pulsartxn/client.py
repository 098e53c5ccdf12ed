"""The client API of API.md: producers, consumers, scans and transactions."""

from __future__ import annotations

import abc
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from ._native import TxnID
from ._native.keywords import strict_class
from .admin import Admin
from .errors import AlreadyClosed, ProducerBusy, excerpt
from .messaging.consumer import (
    Consumer,
    ConsumerType,
    InitialPosition,
    Isolation,
    check_count,
    check_subscribe_enums,
    resolve_subscription_type,
)
from .messaging.dead_letter import DeadLetter, DeadLetterPolicy, check_policy
from .messaging.listener import check_listener, start_listener
from .messaging.message import Message, MessageId
from .messaging.producer import Producer
from .messaging.reader import Reader, check_reader_args, reader_subscription
from .messaging.send_options import (
    BatchingType,
    CompressionType,
    check_batching,
    check_ms,
    check_producer_options,
)
from .messaging.topic_name import check_keyed_name
from .remote import ClusterClient, RemoteClient, RemoteConsumer, RemoteProducer, connect
from .remote.cluster_consumer import ClusterConsumer
from .remote.cluster_producer import ClusterProducer
from .remote.cluster_reader import ClusterReader
from .remote.handles import RemoteTransaction
from .remote.reader import RemoteReader
from .scan import _entry_bound, _scan
from .txn.log import IN_PROCESS
from .txn.transaction import Transaction, as_txn_id, txn_list


@strict_class
class Client(metaclass=abc.ABCMeta):  # noqa: B024 - for register(), nothing abstract
    """``broker.client()`` (in process) or ``Client("pulsartxn://host:port")`` (network issue).

    The remote and cluster clients are registered subclasses: ``isinstance(c, Client)`` holds
    for all three, and they offer the same methods with the same signatures."""

    def __new__(
        cls,
        service_url: str | None = None,
        token: str | None = None,
        reconnect_timeout_s: float = 30.0,
        keepalive_s: float = 1.0,
        tls_trust_certs_file_path: str | None = None,
        operation_timeout_seconds: float = 30,
    ) -> Client:
        """``Client("pulsartxn://host:port", token=None)``: a remote client (the same API over
        the network service), of a cluster with ``pulsartxn://h1:p1,h2:p2,...`` (or one of its
        brokers); ``broker.client()`` gives the in-process one. A call a broker does not
        answer raises Timeout after `operation_timeout_seconds` (pulsar-client's), plus what
        the broker may wait for it (a receive's timeout, a commit's)."""
        if service_url is None:
            return super().__new__(cls)
        return connect(
            service_url,
            token,
            reconnect_timeout_s=reconnect_timeout_s,
            keepalive_s=keepalive_s,
            tls_trust_certs_file_path=tls_trust_certs_file_path,
            operation_timeout_seconds=operation_timeout_seconds,
        )

    @classmethod
    def _embedded(cls, broker, session: str | None = None) -> Client:
        self = cls.__new__(cls)
        self.broker = broker
        # Who owns the transactions it opens: this process, or the network session it serves.
        self._owner = IN_PROCESS if session is None else session
        self._lock = threading.Lock()
        self._closed = False
        self._producers: weakref.WeakSet = weakref.WeakSet()
        self._consumers: weakref.WeakSet = weakref.WeakSet()
        # The in-process transactions it began outside a group: its close aborts those still
        # open (nobody else holds them). Pruned of ended ones when it doubles past _PRUNE_AT.
        self._began: set = set()
        self._prune_at = _PRUNE_AT
        return self

    @property
    def admin(self) -> Admin:
        return self.broker.admin

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("client is closed")
        self.broker.check_open()

    def _txn_for(self, txn, op: str = "produce in") -> Transaction | None:
        """The Transaction a `txn=` argument names (a Transaction, or a TxnID / its str / int
        of one opened elsewhere), checked to be still open on this side for `op` (the words
        the coordinator uses too: "produce in", "acknowledge in")."""
        if txn is None:
            return None
        if type(txn) is not Transaction:  # a remote handle too: by its id
            txn = self.transaction(txn)
        elif txn._service is not self.broker.txn:
            raise ValueError(f"transaction {txn.id} belongs to another broker")
        txn._check_open(op)
        return txn

    # -- producers -------------------------------------------------------------------------

    def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        batching_enabled: bool = True,
        batching_max_messages: int | None = None,
        batching_max_allowed_size_in_bytes: int | None = None,
        batching_max_publish_delay_ms: float | None = None,
        send_timeout_millis: int = 30_000,
        block_if_queue_full: bool = False,
        max_pending_messages: int = 1000,
        compression_type: CompressionType = CompressionType.NONE,
        batching_type: BatchingType = BatchingType.Default,
        chunking_enabled: bool = False,
    ) -> Producer:
        """A producer on `topic`. pulsar-client's send_timeout_millis (only a remote send
        times out: here a send waits for the store), block_if_queue_full,
        max_pending_messages, compression_type, batching_type and chunking_enabled are
        checked and mean what docs/API.md ("Differences from pulsar-client") says."""
        check_producer_options(
            send_timeout_millis,
            block_if_queue_full,
            max_pending_messages,
            compression_type,
            batching_type,
            chunking_enabled,
        )
        check_batching(
            batching_enabled,
            batching_max_messages,
            batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms,
        )
        self._check_open()
        if producer_name is not None:
            check_keyed_name("producer_name", producer_name)
        cfg = self.broker.config
        if batching_max_messages is None:
            batching_max_messages = cfg.batching_max_messages
        if batching_max_allowed_size_in_bytes is None:
            batching_max_allowed_size_in_bytes = cfg.batching_max_bytes
        full, partitions = self.broker.topics.resolve(topic)
        if producer_name is not None:
            check_keyed_name("producer_name", producer_name, [p.topic for p in partitions])
        with self.broker.topics.lock:
            name = producer_name
            if name is not None:
                for part in partitions:
                    if name in part.producers:
                        raise ProducerBusy(f"producer {name} is already connected to {part.topic}")
            producer = Producer(
                self,
                full,
                partitions,
                name,
                batching_enabled,
                batching_max_messages,
                batching_max_allowed_size_in_bytes,
                cfg.batching_max_publish_delay_ms
                if batching_max_publish_delay_ms is None
                else batching_max_publish_delay_ms,
                cfg.max_message_size,
            )
            for part in partitions:
                if producer.name in part.producers:
                    raise ProducerBusy(
                        f"producer {producer.name} is already connected to {part.topic}"
                    )
            for part in partitions:
                part.producers[producer.name] = producer
        self._producers.add(producer)
        return producer

    def _producer_closed(self, producer: Producer) -> None:
        with self.broker.topics.lock:
            for part in producer._parts:
                if part.partition.producers.get(producer.name) is producer:
                    del part.partition.producers[producer.name]

    # -- consumers -------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        subscription_name: str,
        subscription_type: ConsumerType | None = None,
        initial_position: InitialPosition = InitialPosition.Latest,
        isolation: Isolation = Isolation.READ_COMMITTED,
        consumer_name: str | None = None,
        negative_ack_redelivery_delay_ms: int = 60_000,
        receiver_queue_size: int | None = None,
        unacked_messages_timeout_ms: int | None = None,
        dead_letter_policy: DeadLetterPolicy | None = None,
        consumer_type: ConsumerType | None = None,
        message_listener: Callable[[Consumer, Message], None] | None = None,
    ) -> Consumer:
        """A consumer of `subscription_name` on `topic` (Exclusive unless `subscription_type`,
        or pulsar-client's `consumer_type`, says otherwise; a new subscription starts at the
        Latest message unless `initial_position` says Earliest). receiver_queue_size: the most
        messages one batch_receive takes (default: the broker's, 1000), capped to the
        broker's max_receiver_queue_size. unacked_messages_timeout_ms: a message
        unacknowledged that long is redelivered (None or 0: never; else at least the broker's
        min_ack_timeout_ms, 10 s by default). dead_letter_policy: where a message redelivered
        too often goes instead. message_listener(consumer, message): called per message on a
        listener thread (receive() is then refused)."""
        subscription_type = resolve_subscription_type(subscription_type, consumer_type)
        check_listener(message_listener)
        self._check_open()
        check_keyed_name("subscription_name", subscription_name)
        if consumer_name is not None:
            check_keyed_name("consumer_name", consumer_name)
        check_subscribe_enums(
            subscription_type=subscription_type,
            initial_position=initial_position,
            isolation=isolation,
        )
        check_ms("negative_ack_redelivery_delay_ms", negative_ack_redelivery_delay_ms)
        cfg = self.broker.config
        if receiver_queue_size is None:
            receiver_queue_size = cfg.receiver_queue_size
        elif (
            isinstance(receiver_queue_size, bool)
            or not isinstance(receiver_queue_size, int)
            or receiver_queue_size < 1
        ):
            raise ValueError(
                f"receiver_queue_size must be a positive int, not {excerpt(receiver_queue_size)}"
            )
        check_ack_timeout(unacked_messages_timeout_ms, cfg.min_ack_timeout_ms)
        check_policy(dead_letter_policy)
        full, partitions = self.broker.topics.resolve(topic)
        check_keyed_name("subscription_name", subscription_name, [p.topic for p in partitions])
        dead_letter = None
        if dead_letter_policy is not None:
            dead_letter = DeadLetter(
                dead_letter_policy, self.broker.topics, full, subscription_name
            )
        earliest = initial_position is InitialPosition.Earliest
        topics = self.broker.topics
        with topics.lock:
            topics.room_for_subscription(partitions, subscription_name)
            subs = [topics.subscription(p, subscription_name, earliest) for p in partitions]
            consumer = Consumer(
                self,
                full,
                subscription_name,
                subs,
                subscription_type.value,
                consumer_name,
                negative_ack_redelivery_delay_ms,
                isolation is Isolation.READ_COMMITTED,
                min(receiver_queue_size, cfg.max_receiver_queue_size),
                cfg.dispatch_max_bytes,
                unacked_messages_timeout_ms,
                dead_letter,
            )
        self._consumers.add(consumer)
        if message_listener is not None:
            start_listener(consumer, message_listener)
        return consumer

    def _consumer_closed(self, consumer: Consumer) -> None:
        self._consumers.discard(consumer)

    def _unsubscribe(self, consumer: Consumer) -> None:
        with self.broker.topics.lock:
            # Checked and marked under every partition's subscription lock: an ack that comes
            # later finds the mark and is refused, none is taken after the check.
            with contextlib.ExitStack() as locks:
                for sub in consumer._subs:
                    locks.enter_context(sub.lock)
                for sub in consumer._subs:
                    sub.check_unsubscribe(consumer)
                for sub in consumer._subs:
                    sub.unsubscribed = True
            consumer.close()
            for sub in consumer._subs:
                self.broker.topics.delete(sub)

    # -- readers ---------------------------------------------------------------------------

    def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        reader_listener: Callable[[Reader, Message], None] | None = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        start_message_id_inclusive: bool = False,
        isolation: Isolation = Isolation.READ_COMMITTED,
    ) -> Reader:
        """A reader of every partition of `topic` from start_message_id (the first message
        after it, or it with start_message_id_inclusive): a non-durable subscription."""
        self._check_open()
        check_reader_args(start_message_id, reader_listener, is_read_compacted)
        check_count("receiver_queue_size", receiver_queue_size, least=1)
        if reader_name is not None:
            check_keyed_name("reader_name", reader_name)
        if subscription_role_prefix is not None:
            check_keyed_name("subscription_role_prefix", subscription_role_prefix)
        if not isinstance(isolation, Isolation):
            raise TypeError(f"isolation must be an Isolation, not {excerpt(isolation)}")
        return self._reader(
            topic,
            start_message_id,
            reader_listener,
            receiver_queue_size,
            reader_name,
            subscription_role_prefix,
            bool(start_message_id_inclusive),
            isolation,
        )

    def _reader(
        self, topic, start, listener, queue_size, name, prefix, inclusive, isolation, resume=None
    ) -> Reader:
        """A reader from `start` (a MessageId, or a publish time: a reconnect after a seek)."""
        cfg = self.broker.config
        full, partitions = self.broker.topics.resolve(topic)
        with self.broker.topics.lock:
            reader = Reader(
                self,
                full,
                partitions,
                start,
                inclusive,
                listener,
                min(queue_size, cfg.max_receiver_queue_size),
                cfg.dispatch_max_bytes,
                name,
                reader_subscription(prefix),
                isolation is Isolation.READ_COMMITTED,
                resume,
            )
        self._consumers.add(reader)
        return reader

    def get_topic_partitions(self, topic: str) -> list[str]:
        """The full names of a topic's partitions (itself when non-partitioned), as
        pulsar-client's; TopicNotFound if it does not exist."""
        self._check_open()
        return self.broker.topic_partitions(topic)

    # -- transactions ----------------------------------------------------------------------

    def new_transaction(
        self,
        timeout_ms: int | None = None,
        coordinator_id: int | None = None,
        group: str | None = None,
        group_capability: str | None = None,
    ) -> Transaction:
        """Begin a transaction. (`group_capability`: what a network session needs to join a
        group another holds; an in-process client is trusted and needs none.)"""
        self._check_open()
        meta = self.broker.txn.new_transaction(timeout_ms, coordinator_id, group, self._owner)
        if group is None and self._owner == IN_PROCESS:
            with self._lock:  # threads begin at once; a prune replaces the set
                closed = self._closed
                if not closed:
                    began = self._began
                    began.add(meta.txn_id)
                    if len(began) >= self._prune_at:
                        self._prune_began()
            if closed:
                # A close came in since the check above, and takes what it finds in the set
                # under the lock: this one is not there, so it is aborted here.
                self.broker.txn.abort_orphans([meta])
                raise AlreadyClosed("client is closed")
        return Transaction(self, self.broker.txn, meta.txn_id, counted=True)

    def _prune_began(self) -> None:
        """Forget the transactions this client began that have ended; the next pruning
        comes when what is left has doubled (at least _PRUNE_AT). Called under _lock."""
        live = self.broker.txn.live(self._began)
        self._began = live
        self._prune_at = max(_PRUNE_AT, 2 * len(live))

    def transaction(self, txn_id: TxnID | str | int, capability: str | None = None) -> Transaction:
        """A handle on an existing transaction by id (TxnID, its str or its int). (An
        in-process client is trusted: the `capability` a network session needs is not.)"""
        self._check_open()
        tid = as_txn_id(txn_id)
        service = self.broker.txn
        service.check_known(tid)  # CoordinatorNotFound / TransactionNotFound
        return Transaction(self, service, tid, counted=False)

    def commit_all(self, txns: Iterable[Transaction | TxnID]) -> None:
        """Commit the transactions as one atomic unit: one log record decides all of them;
        if any one is not OPEN, the call fails and nothing is committed."""
        self._check_open()
        txns = txn_list("txns", txns)
        expected = _flush_for_commit(txns)
        self.broker.txn.commit_all([as_txn_id(t) for t in txns], expected)

    def group_capability(self, group: str, capability: str | None = None) -> str | None:
        """A network session's capability on a group; an in-process client needs none."""
        _check_group(group)
        return None

    def commit_group(
        self,
        group: str,
        winners: Iterable[Transaction | TxnID],
        idempotency_key: tuple[str, int] | None = None,
        group_capability: str | None = None,
    ) -> dict:
        """Commit exactly `winners` and abort every other transaction labelled `group`, in one
        decision. With idempotency_key=(app_id, version), a key whose version was already
        decided for app_id is a no-op success (``{"duplicate": True}``)."""
        self._check_open()
        winners = txn_list("winners", winners)
        expected = _flush_for_commit(winners)
        return self.broker.txn.commit_group(
            group, [as_txn_id(t) for t in winners], idempotency_key, expected
        )

    def abort_group(self, group: str, group_capability: str | None = None) -> dict:
        """Abort every live transaction labelled `group`."""
        self._check_open()
        return self.broker.txn.abort_group(group)

    # -- scans -----------------------------------------------------------------------------

    def scan(
        self, topic: str, start: int | MessageId | None = None, end: int | MessageId | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Read-only, columnar read of a topic as pyarrow RecordBatches; moves no cursor.

        start/end: entry ids (end exclusive) applied to every partition, or MessageIds
        (their entry id, on their own partition). The end is fixed when the scan starts.
        """
        self._check_open()
        full, partitions = self.broker.topics.resolve(topic, create=False)
        bounds = []
        for part in partitions:
            # Read committed: up to the max read position, fixed now.
            stop = part.dispatch_end(True)
            lo = _entry_bound(start, part, part.first_entry_id)
            hi = _entry_bound(end, part, stop)
            bounds.append((part, lo, min(hi, stop)))
        return _scan(bounds)

    def create_topic(self, topic: str, partitions: int = 0) -> None:
        """Create `topic` with `partitions` partitions (0: non-partitioned)."""
        self._check_open()
        self.broker.create_topic(topic, partitions)

    def topic_partitions(self, topic: str) -> list[str]:
        """The partitions' names of `topic` (or [topic] when it is not partitioned)."""
        self._check_open()
        return self.broker.topic_partitions(topic)

    def close(self) -> None:
        """Close its producers (what they hold is sent) and consumers, then abort the
        transactions it began that are still open (as a network client's close does for its
        session's): nobody else holds them, and each holds its partitions' readers back until
        its timeout. Transactions of a group are left to their group's decision."""
        if self._closed:
            return
        self._closed = True
        for producer in list(self._producers):
            try:
                producer.close()
            except Exception:  # noqa: BLE001 - close everything we can
                pass
        for consumer in list(self._consumers):
            consumer.close()
        with self._lock:
            began, self._began = self._began, set()
        service = self.broker.txn
        if began and not service.closed:
            service.abort_orphans(service.owned(lambda m: m.txn_id in began))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_PRUNE_AT = 1024  # transactions an in-process client remembers before it forgets ended ones


def check_ack_timeout(value, least: int) -> None:
    """ValueError unless unacked_messages_timeout_ms is None, 0 or at least `least`."""
    check_count("unacked_messages_timeout_ms", value, least=0, optional=True)
    if value and value < least:
        raise ValueError(
            f"unacked_messages_timeout_ms must be 0, None or at least {least} (the broker's "
            f"min_ack_timeout_ms), not {value}"
        )


# One type family (docs/API.md): the network clients and their handles are registered as
# virtual subclasses, as they live in the remote layer, below this one; isinstance(x,
# pulsartxn.Producer) and so on hold for a handle of any client.
Client.register(RemoteClient)
Client.register(ClusterClient)
Producer.register(RemoteProducer)
Producer.register(ClusterProducer)
Consumer.register(RemoteConsumer)
Consumer.register(ClusterConsumer)
Reader.register(RemoteReader)
Reader.register(ClusterReader)
Transaction.register(RemoteTransaction)


def _check_group(group) -> None:
    if not isinstance(group, str) or not group:
        raise ValueError(f"group must be a non-empty str, not {excerpt(group)}")


def _flush_for_commit(txns) -> dict:
    """Handles' messages still waiting in producers are written before a decision commits
    them (as txn.commit() does); TxnID -> (acks, sends) of the handles that counted them."""
    expected = {}
    for t in txns:
        if type(t) is Transaction:
            t._flush_for_commit()
            counts = t._counts()
            if counts is not None:
                expected[t.id] = counts
    return expected


__all__ = [
    "Client",
    "Consumer",
    "ConsumerType",
    "InitialPosition",
    "Isolation",
    "Producer",
    "Reader",
    "Transaction",
]
