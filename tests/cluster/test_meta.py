"""Message metadata and delayed delivery on the cluster client: a transaction's messages with
ordering keys, event times and delivery times on partitions owned by different brokers."""

from __future__ import annotations

import time
import uuid
import zlib

import pytest

import pulsartxn
from pulsartxn import ConsumerType, InitialPosition

PARTITIONS = 4


def test_metadata_and_delayed_delivery_across_brokers(local_cluster):
    cluster = local_cluster(2, num_coordinators=2)
    with pulsartxn.Client(cluster.service_url, reconnect_timeout_s=60) as client:
        topic = f"t-{uuid.uuid4().hex[:8]}"
        client.create_topic(topic, partitions=PARTITIONS)
        owners = {client._owner("partition", p) for p in client.topic_partitions(topic)}
        assert len(owners) == 2, "the partitions spread over both brokers"
        keys: dict[int, str] = {}
        i = 0
        while len(keys) < PARTITIONS:  # a partition key per partition (crc32 % n)
            keys.setdefault(zlib.crc32(f"k{i}".encode()) % PARTITIONS, f"k{i}")
            i += 1
        consumer = client.subscribe(
            topic,
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=InitialPosition.Earliest,
        )
        producer = client.create_producer(topic)
        due = int(time.time() * 1000) + 1000
        with client.new_transaction() as txn:
            for p, key in keys.items():
                producer.send(
                    b"d%d" % p, partition_key=key, txn=txn, deliver_at=due, ordering_key=f"o{p}"
                )
                producer.send_async(
                    b"n%d" % p, partition_key=key, txn=txn, event_timestamp=1000 + p
                ).result(timeout=30)
        got = {}
        deadline = time.monotonic() + 15
        while len(got) < 2 * PARTITIONS and time.monotonic() < deadline:
            for m in consumer.batch_receive(100, 200):
                got[m.data()] = (m, int(time.time() * 1000))
                consumer.acknowledge(m)
        assert sorted(got) == sorted([b"d%d" % p for p in keys] + [b"n%d" % p for p in keys])
        for p in keys:
            delayed, at = got[b"d%d" % p]
            assert delayed.ordering_key() == f"o{p}" and at >= due
            now, _ = got[b"n%d" % p]
            assert now.event_timestamp() == 1000 + p and now.ordering_key() is None
        with pytest.raises(pulsartxn.Timeout):
            consumer.receive(300)
