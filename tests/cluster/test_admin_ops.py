"""The admin's topic and subscription calls on a cluster: each partition's at its owner, put
together as one broker would answer; list_topics from every live broker."""

from __future__ import annotations

import json

import pytest

import pulsartxn
from pulsartxn.cli import main

FULL = "persistent://public/default/"


def test_a_partitioned_topic_across_brokers(local_cluster, capsys):
    cluster = local_cluster(2, num_coordinators=2)
    client = pulsartxn.Client(cluster.service_url)
    try:
        client.create_topic("ca", partitions=4)
        producer = client.create_producer("ca")
        for i in range(8):
            producer.send(b"%d" % i, partition_key=str(i))
        admin = client.admin
        assert {"topic": FULL + "ca", "partitions": 4} in admin.list_topics()
        admin.create_subscription("ca", "s", "earliest")
        assert admin.list_subscriptions("ca") == ["s"]
        assert len(admin.peek("ca", "s", 10)) == 8
        assert admin.skip("ca", "s", 3) == 3
        assert len(admin.peek("ca", "s", 10)) == 5
        stats = admin.partitioned_stats("ca", per_partition=True)
        assert stats["messages"] == 8 and len(stats["per_partition"]) == 4
        assert stats["subscriptions"]["s"]["backlog"] == 5
        admin.reset_cursor("ca", "s", "earliest")
        assert len(admin.peek("ca", "s", 10)) == 8
        # A transaction holding an ack on a later partition: a reset is refused before any
        # partition moves, as one broker does (the first partitions used to be reset).
        consumer = client.subscribe("ca", "s")
        parts = client.topic_partitions("ca")
        msg = next(
            m for m in iter(lambda: consumer.receive(5000), None) if m.topic_name() != parts[0]
        )
        holder = client.new_transaction()
        consumer.acknowledge(msg, txn=holder)
        backlogs = [admin.topic_stats(p)["subscriptions"]["s"]["backlog"] for p in parts]
        for reset in (
            lambda: admin.reset_cursor("ca", "s", "latest"),
            lambda: admin.clear_backlog("ca", "s"),
        ):
            with pytest.raises(pulsartxn.TransactionConflict, match="hold acknowledgements"):
                reset()
            assert [
                admin.topic_stats(p)["subscriptions"]["s"]["backlog"] for p in parts
            ] == backlogs
        holder.abort()
        consumer.close()
        admin.reset_cursor("ca", "s", "earliest")
        assert len(admin.peek("ca", "s", 10)) == 8
        txn = client.new_transaction()
        inbuf = admin.transaction_in_buffer_stats("ca", txn.id)
        assert {p["state"] for p in inbuf["partitions"].values()} == {"unknown"}
        txn.abort()
        # A subscription on some partitions only (as a call cut part way leaves it) is
        # deleted where it is, as one broker does; SubscriptionNotFound once it is nowhere.
        admin.create_subscription(FULL + "ca-partition-2", "some")
        assert admin.list_subscriptions("ca") == ["s", "some"]
        admin.delete_subscription("ca", "some")
        assert admin.list_subscriptions("ca") == ["s"]
        with pytest.raises(pulsartxn.SubscriptionNotFound):
            admin.delete_subscription("ca", "some")
        # A create is refused when the subscription is on any partition, before any is made.
        admin.create_subscription(FULL + "ca-partition-2", "some")
        with pytest.raises(pulsartxn.SubscriptionAlreadyExists):
            admin.create_subscription("ca", "some")
        for i in range(4):
            assert admin.list_subscriptions(f"ca-partition-{i}") == ["s", "some"][: 2 - (i != 2)]
        admin.delete_subscription("ca", "some")
        with pytest.raises(pulsartxn.InvalidConfiguration):
            admin.delete_topic("ca")
        producer.close()
        assert main(["admin", "--url", cluster.service_url, "topics", "list"]) == 0
        assert {"topic": FULL + "ca", "partitions": 4} in json.loads(capsys.readouterr().out)
    finally:
        client.close()


def test_a_skip_cut_by_an_owner_out_of_reach_says_what_it_skipped(local_cluster):
    """A skip over partitions on two brokers, the second's owner down past the client's
    reconnect timeout: BrokerUnavailable, saying how many it had skipped before (they stay
    skipped), so the caller knows what is left to do."""
    cluster = local_cluster(2, num_coordinators=2)
    client = pulsartxn.Client(cluster.service_url, reconnect_timeout_s=1)
    try:
        client.create_topic("cut", partitions=4)
        parts = client.topic_partitions("cut")
        owners = [client._owner("partition", p) for p in parts]
        later = next(i for i, o in enumerate(owners) if o != owners[0])
        client.admin.create_subscription("cut", "s", "earliest")
        producer = client.create_producer("cut", batching_enabled=False)
        for i in range(40):
            producer.send(b"%d" % i, partition_key=str(i))
        producer.close()
        before = sum(
            client.admin.topic_stats(p)["subscriptions"]["s"]["backlog"] for p in parts[:later]
        )
        assert before > 0
        cluster.kill(cluster.addresses.index(owners[later]))
        with pytest.raises(pulsartxn.BrokerUnavailable, match=f"had skipped {before} of 40 "):
            client.admin.skip("cut", "s", 40)
    finally:
        client.close()
