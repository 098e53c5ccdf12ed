"""Key_Shared and the dead letter policy on a cluster of 3 brokers (real ZooKeeper): each
partition spreads its keys at its owner broker, and a dead letter topic is served by the
broker of the subscription it takes messages from (refused elsewhere, not half-done)."""

from __future__ import annotations

import time
import uuid

import pytest

import pulsartxn
from pulsartxn import ConsumerType, DeadLetterPolicy, InitialPosition

EARLIEST = InitialPosition.Earliest


def drain(consumer, quiet_s: float = 0.5) -> list:
    out: list = []
    last = time.monotonic()
    while time.monotonic() - last < quiet_s:
        msgs = consumer.batch_receive(1000, 100)
        if msgs:
            out.extend(msgs)
            last = time.monotonic()
    return out


def test_key_shared_and_dead_letters_on_a_cluster(local_cluster):
    cluster = local_cluster(3)
    with pulsartxn.Client(cluster.service_url, reconnect_timeout_s=60) as client:
        topic = f"ks-{uuid.uuid4().hex[:8]}"
        client.create_topic(topic, partitions=3)
        consumers = [
            client.subscribe(
                topic, "s", subscription_type=ConsumerType.KeyShared, initial_position=EARLIEST
            )
            for _ in range(2)
        ]
        p = client.create_producer(topic)
        for i in range(300):
            p.send(b"%d" % i, partition_key=f"k{i % 30}")
        owner: dict = {}
        order: dict = {}
        for n, c in enumerate(consumers):
            for m in drain(c):
                assert owner.setdefault(m.partition_key(), n) == n
                order.setdefault(m.partition_key(), []).append(int(m.data()))
                c.acknowledge(m)
        assert sum(len(v) for v in order.values()) == 300
        assert all(v == sorted(v) for v in order.values())
        assert len(set(owner.values())) == 2

        source = f"dl-{uuid.uuid4().hex[:8]}"
        client.create_producer(source).send(b"x", properties={"p": "1"})
        refused = 0
        for i in range(40):  # a dead letter topic that lands on the source's broker
            try:
                c = client.subscribe(
                    source,
                    "s",
                    subscription_type=ConsumerType.Shared,
                    initial_position=EARLIEST,
                    negative_ack_redelivery_delay_ms=0,
                    dead_letter_policy=DeadLetterPolicy(1, dead_letter_topic=f"{source}-dlq{i}"),
                )
            except pulsartxn.InvalidConfiguration:
                refused += 1
                continue
            dlq = f"{source}-dlq{i}"
            break
        else:
            pytest.fail("no dead letter topic on the source's broker in 40 names")
        counts = []
        while True:
            try:
                m = c.receive(500)
            except pulsartxn.Timeout:
                break
            counts.append(m.redelivery_count())
            c.negative_acknowledge(m)
        assert counts == [0, 1]
        r = client.subscribe(dlq, "r", initial_position=EARLIEST)
        moved = drain(r)
        assert [(m.data(), m.properties()["p"]) for m in moved] == [(b"x", "1")]


def receive_n(consumer, n: int, within_s: float = 10.0) -> list:
    """The next n messages (fewer if they do not come within within_s)."""
    out: list = []
    deadline = time.monotonic() + within_s
    while len(out) < n and time.monotonic() < deadline:
        out.extend(consumer.batch_receive(n - len(out), 100))
    return out


def test_the_ack_timeout_on_a_cluster(local_cluster):
    """Partitions at different brokers redeliver what was not acknowledged in time, once per
    timeout, counted; a transactional ack holds its message against the timeout."""
    cluster = local_cluster(2, extra_args=("--min-ack-timeout-ms", "100"))
    with pulsartxn.Client(cluster.service_url, reconnect_timeout_s=60) as client:
        topic = f"at-{uuid.uuid4().hex[:8]}"
        client.create_topic(topic, partitions=4)
        p = client.create_producer(topic)
        for i in range(40):
            p.send(b"%d" % i)
        # Subscribed once all are stored, so that the 40 are handed out at once; and a
        # timeout that a busy machine (a CI run of three workers) does not outlast between
        # the hand-out and the receive, or between the timeout's redelivery and the 39 acks.
        c = client.subscribe(
            topic,
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=EARLIEST,
            unacked_messages_timeout_ms=4000,
        )
        first = receive_n(c, 40)
        assert sorted(int(m.data()) for m in first) == list(range(40))
        assert {m.redelivery_count() for m in first} == {0}
        txn = client.new_transaction()
        c.acknowledge(first[0], txn=txn)  # held for txn: not timed out
        again = receive_n(c, 39)  # after the timeout: the 39 others, counted once
        assert sorted(int(m.data()) for m in again) == sorted(int(m.data()) for m in first[1:])
        assert {m.redelivery_count() for m in again} == {1}
        for m in again:
            c.acknowledge(m)
        txn.commit()
        assert receive_n(c, 1, within_s=5.0) == []  # all acknowledged: nothing comes back
        parts = client.get_topic_partitions(topic)
        assert {client._owner("partition", t) for t in parts} == set(cluster.addresses)
