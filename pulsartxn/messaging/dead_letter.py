"""Dead letter topics, moved broker-side: a message about to be delivered more than
``max_redeliver_count`` times goes to its dead letter topic instead, stored there and
acknowledged on its subscription in one LMDB write (no copy lost or doubled by a crash), the
same for every client. See docs/API.md, "Dead letter policy"."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

from .._native import AckSet, Pending, encode_entry
from ..errors import excerpt
from ..storage import WriteOp
from .topic_name import TopicName

REAL_TOPIC = "REAL_TOPIC"  # the properties Pulsar's client adds to a dead-lettered message
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"


@dataclass(frozen=True)
class DeadLetterPolicy:
    """pulsar-client's DeadLetterPolicy: after max_redeliver_count redeliveries a message goes
    to dead_letter_topic (default ``<topic>-<subscription>-DLQ``); initial_subscription_name
    is created there before the first message lands."""

    max_redeliver_count: int
    dead_letter_topic: str | None = None
    initial_subscription_name: str | None = None

    def __post_init__(self) -> None:
        n = self.max_redeliver_count
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_redeliver_count must be an int of at least 1, not {excerpt(n)}")
        for name in ("dead_letter_topic", "initial_subscription_name"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty str or None, not {excerpt(value)}")

    def to_wire(self) -> dict:
        return {
            "max_redeliver_count": self.max_redeliver_count,
            "dead_letter_topic": self.dead_letter_topic,
            "initial_subscription_name": self.initial_subscription_name,
        }

    @classmethod
    def from_wire(cls, value) -> DeadLetterPolicy:
        if not isinstance(value, dict) or set(value) - set(cls.__dataclass_fields__):
            raise ValueError(f"dead_letter_policy must be a DeadLetterPolicy, not {excerpt(value)}")
        return cls(**value)


ConsumerDeadLetterPolicy = DeadLetterPolicy  # pulsar-client-python's name for it


def dead_letter_topic(policy: DeadLetterPolicy, topic: str, subscription: str) -> str:
    """The policy's topic, or ``<topic>-<subscription>-DLQ`` (of a partitioned topic's base)."""
    if policy.dead_letter_topic is not None:
        return policy.dead_letter_topic
    return f"{TopicName.parse(topic).base.full}-{subscription}-DLQ"


def check_policy(policy) -> None:
    if policy is not None and not isinstance(policy, DeadLetterPolicy):
        raise TypeError(f"dead_letter_policy must be a DeadLetterPolicy, not {excerpt(policy)}")


class DeadLetter:
    """One consumer's dead letter policy at work on its subscriptions."""

    def __init__(self, policy: DeadLetterPolicy, topics, topic: str, subscription: str) -> None:
        self.max = policy.max_redeliver_count
        self.topic = dead_letter_topic(policy, topic, subscription)
        TopicName.parse(self.topic)  # InvalidTopicName now, not at the first move
        self.initial = policy.initial_subscription_name
        self._topics = topics
        self._partitions = None

    def divert(self, sub, out: list, start: int) -> list:
        """Take out of out[start:] the messages past max_redeliver_count (lock held): they are
        pending at nobody until moved, so that no consumer gets them. The (key, message)s."""
        moved, kept = [], []
        for m in out[start:]:
            if m.redelivery_count() > self.max:
                mid = m.message_id()
                key = (mid.entry_id(), mid.batch_index())
                sub._pending[key] = Pending(None, m.redelivery_count())
                moved.append((key, m))
            else:
                kept.append(m)
        if moved:
            out[start:] = kept
        return moved

    def move(self, sub, moved: list) -> None:
        """Move the diverted messages (no lock held): one write each, not waited for. If one
        cannot be queued (the topic refused, the broker closing), the rest go back to be
        delivered and the error is raised."""
        storage = sub.partition.storage
        for i, (key, msg) in enumerate(moved):
            try:
                if self._partitions is None:
                    _, parts = self._topics.resolve(self.topic)
                    if self.initial is not None:
                        for part in parts:
                            self._topics.subscription(part, self.initial, earliest=True)
                    self._partitions = parts
                storage.submit(self._op(sub, key, msg))
            except BaseException:
                with sub.lock:
                    for k, m in moved[i:]:
                        _give_back(sub, k, m.redelivery_count())
                raise

    def _op(self, sub, key, msg) -> WriteOp:
        parts = self._partitions
        target = parts[key[0] % len(parts)] if len(parts) > 1 else parts[0]
        mid = msg.message_id()
        src = sub.partition
        props = dict(msg.properties() or {})
        props[REAL_TOPIC] = src.topic
        props[ORIGIN_MESSAGE_ID] = (
            f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}:{mid.batch_index()}"
        )
        data = msg.data()
        entry = encode_entry(
            [data], [msg.partition_key()], [props], publish_time=int(time.time() * 1000)
        )
        append = target.append_op([entry], [1], len(data))
        size = mid.batch_size()
        batched = key[1] >= 0 and size > 1
        ack_set = None
        if batched:
            ack_set = AckSet(size)
            ack_set.set(key[1])
        token = ("dead-letter", key)
        cursors = storage_db(src.storage)

        def apply(lmdb_txn):
            first = append.apply(lmdb_txn)
            with sub.lock:
                # Until this write lands, every record of the cursor written holds the ack.
                sub.committing[token] = ([(src.ledger_id, key[0], ack_set)], None)
                record = None if sub.unsubscribed else sub.cursor_record()
            if record is not None:
                lmdb_txn.put(sub.key, record, db=cursors)
            return first

        def on_commit(first) -> None:
            append.on_commit(first)
            with sub.lock:
                sub.committing.pop(token, None)
                sub.cursor.ack(key[0], key[1], size)
                _drop_sentinel(sub, key)
                sub._redelivery_counts.pop(key, None)

        def on_abort() -> None:
            with sub.lock:
                sub.committing.pop(token, None)
                _give_back(sub, key, msg.redelivery_count())  # tried again at the next take

        return WriteOp(apply, nbytes=len(entry) + 64, on_commit=on_commit, on_abort=on_abort)


def _give_back(sub, key, count: int) -> None:
    """A move not made (lock held): the message is redelivered with the count it had."""
    if _drop_sentinel(sub, key):
        sub._redelivery_counts[key] = count - 1  # the redelivery adds one
        heapq.heappush(sub._redeliver, key)


def _drop_sentinel(sub, key) -> bool:
    p = sub._pending.get(key)
    if p is not None and p.consumer is None:
        del sub._pending[key]
        return True
    return False


def storage_db(storage):
    return storage.open_db(b"cursors")
