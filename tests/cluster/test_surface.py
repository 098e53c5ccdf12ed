"""The surface of issue 25 on a cluster client, over a real ZooKeeper and three broker
processes: one type family, strict keywords, pulsar-client's spellings on a partitioned topic
spread over the brokers."""

from __future__ import annotations

import threading
import time

import pytest

import pulsartxn
from pulsartxn.remote import ClusterClient

pytest.importorskip("kazoo")


def test_the_cluster_client_speaks_as_a_pulsar_user_writes(local_cluster):
    cluster = local_cluster(3)
    with pulsartxn.Client(cluster.service_url, reconnect_timeout_s=60) as client:
        assert type(client) is ClusterClient and isinstance(client, pulsartxn.Client)
        client.create_topic("orders", partitions=3)
        assert len(client.get_topic_partitions("orders")) == 3
        with pytest.raises(TypeError, match="did you mean 'subscription_type'"):
            client.subscribe("orders", "s", subscriptoin_type=pulsartxn.ConsumerType.Shared)
        with pytest.raises(TypeError, match="did you mean 'topic'"):
            client.admin.topic_stats(topc="orders")
        assert isinstance(client.admin.cluster_transactions(0), list)

        producer = client.create_producer("orders")
        producer.send(b"before", partition_key="k0")
        got: list[bytes] = []
        done = threading.Event()

        def listener(consumer, msg):
            txn = client.new_transaction()
            consumer.acknowledge(msg, txn=txn)
            txn.commit()
            got.append(msg.data())
            if len(got) == 6:
                done.set()

        consumer = client.subscribe(  # Latest: "before" is not seen
            "orders",
            "audit",
            consumer_type=pulsartxn.ConsumerType.Shared,
            message_listener=listener,
        )
        sent = []
        for i in range(6):
            producer.send_async(
                b"m%d" % i, lambda res, mid: sent.append(res), partition_key=f"k{i}"
            )
        producer.flush()
        assert done.wait(30), got
        assert sorted(got) == [b"m%d" % i for i in range(6)]
        deadline = time.monotonic() + 10
        while len(sent) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sent == [pulsartxn.Result.Ok] * 6
        with pytest.raises(pulsartxn.InvalidConfiguration):
            consumer.receive(10)
        consumer.close()
        stats = client.admin.topic_stats("orders")["subscriptions"]["audit"]
        assert stats["unacked"] == 0 and stats["backlog"] == 0
