"""What one consumer can make a subscription hold or do for it: a take is capped in messages
and bytes."""

from __future__ import annotations

import pytest

import pulsartxn
from pulsartxn import ConsumerType
from pulsartxn.messaging.subscription import READ_AHEAD_BYTES

QUEUE = 250  # the broker's receiver_queue_size in these tests
MAX_QUEUE = 600  # its max_receiver_queue_size
BUDGET = 100_000  # its dispatch_max_bytes


@pytest.fixture
def broker(tmp_path):
    """The `client` fixture's broker, with small dispatch bounds."""
    b = pulsartxn.Broker(
        tmp_path / "data",
        sync=False,
        receiver_queue_size=QUEUE,
        max_receiver_queue_size=MAX_QUEUE,
        dispatch_max_bytes=BUDGET,
    )
    yield b
    b.close()


def subscription(broker, topic: str, name: str = "s"):
    return broker._resolve(topic)[1][0].subscriptions[name]


def receive_all(consumer, n: int, timeout_ms: int = 2000) -> list[list]:
    """Batches of batch_receive until n messages came."""
    batches, got = [], 0
    while got < n:
        msgs = consumer.batch_receive(10**9, timeout_ms)
        assert msgs, f"{got} of {n} received"
        batches.append(msgs)
        got += len(msgs)
    return batches


# -- a take is capped --------------------------------------------------------------------------


def test_batch_receive_takes_at_most_the_receiver_queue_size(client):
    sent = [b"m%d" % i for i in range(1500)]
    client.create_producer("t").send_batch(sent)
    default = client.subscribe("t", "default")
    assert len(default.batch_receive(10**9, 1000)) == QUEUE
    own = client.subscribe("t", "own", receiver_queue_size=100)
    batches = receive_all(own, len(sent))
    assert [len(b) for b in batches] == [100] * 15
    assert [m.data() for b in batches for m in b] == sent
    capped = client.subscribe("t", "capped", receiver_queue_size=10**9)
    assert len(capped.batch_receive(10**9, 1000)) == MAX_QUEUE
    assert len(capped.batch_receive(7, 1000)) == 7
    for bad in (0, -1, True, 2.5, "10"):
        with pytest.raises(ValueError, match="receiver_queue_size"):
            client.subscribe("t", "bad", receiver_queue_size=bad)


def test_batch_receive_takes_at_most_the_byte_budget(client):
    """Within BUDGET bytes of message data a call, first delivery and redelivery alike; a
    message larger than the budget comes alone; every message once, in order."""
    sent = [b"%02d" % i + b"s" * 9_998 for i in range(25)] + [b"L" * 250_000]
    sent += [b"%02d" % i + b"m" * 29_998 for i in range(5)]
    producer = client.create_producer("t", batching_enabled=False)
    for value in sent:
        producer.send(value)
    first = client.subscribe("t", "s", subscription_type=ConsumerType.Shared)
    for holder in (first, client.subscribe("t", "s", subscription_type=ConsumerType.Shared)):
        batches = receive_all(holder, len(sent), 300)
        sizes = [sum(len(m.data()) for m in b) for b in batches]
        assert all(s <= BUDGET or len(b) == 1 for s, b in zip(sizes, batches)), sizes
        assert [len(b) for b in batches] == [10, 10, 5, 1, 3, 2]
        assert [m.data() for b in batches for m in b] == sent
        # The next consumer gets them as redeliveries, read again from the ledger.
        assert {m.redelivery_count() for b in batches for m in b} == {int(holder is not first)}
        holder.close()


def test_read_ahead_is_bounded_in_bytes(broker):
    client = broker.client()
    producer = client.create_producer("big", batching_enabled=False)
    sent = [bytes([i]) * (1 << 20) for i in range(24)]
    for value in sent:
        producer.send(value)
    consumer = client.subscribe("big", "s")
    sub = subscription(broker, "big")
    got = []
    while len(got) < len(sent):
        got.append(consumer.receive(5000).data())
        # 64 entries of 1 MiB would be read ahead at once without the byte bound.
        assert sum(len(payload[0]) for _, payload in sub._buffer) <= READ_AHEAD_BYTES
    assert got == sent
