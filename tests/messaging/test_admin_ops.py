"""The admin's topic and subscription operations (docs/API.md, "Admin and stats"), on the
embedded and the remote client: what pulsar-admin's topics group does, with its refusals."""

from __future__ import annotations

import base64
import threading
import time

import pytest

import pulsartxn
from pulsartxn import InitialPosition

FULL = "persistent://public/default/"


def _send(client, topic, *values, txn=None):
    producer = client.create_producer(topic)
    ids = [producer.send(v, txn=txn) for v in values]
    producer.close()
    return ids


def _payloads(rows):
    return [base64.b64decode(r["payload"]) for r in rows]


def _subscribe(client, topic, name, **kw):
    return client.subscribe(topic, name, initial_position=InitialPosition.Earliest, **kw)


def test_list_topics_once_by_name(client):
    client.create_topic("lt-part", partitions=3)
    _send(client, "lt-plain", b"a")
    rows = client.admin.list_topics()
    assert {"topic": FULL + "lt-part", "partitions": 3} in rows
    assert {"topic": FULL + "lt-plain", "partitions": 0} in rows
    assert not [r for r in rows if "-partition-" in r["topic"]]
    assert rows == sorted(rows, key=lambda r: r["topic"])


def test_subscriptions_create_list_delete(client):
    admin = client.admin
    _send(client, "subs", b"old")
    admin.create_subscription("subs", "early", "earliest")
    admin.create_subscription("subs", "late")  # latest: sees nothing sent before
    assert admin.list_subscriptions("subs") == ["early", "late"]
    assert _payloads(admin.peek("subs", "early", 5)) == [b"old"]
    assert admin.peek("subs", "late", 5) == []
    with pytest.raises(pulsartxn.SubscriptionAlreadyExists):
        admin.create_subscription("subs", "early")
    with pytest.raises(pulsartxn.TopicNotFound):
        admin.create_subscription("no-such-topic", "s")
    with pytest.raises(pulsartxn.TopicNotFound):
        admin.list_subscriptions("no-such-topic")
    with pytest.raises(ValueError):
        admin.create_subscription("subs", "")
    with pytest.raises(pulsartxn.SubscriptionNotFound):
        admin.delete_subscription("subs", "nobody")
    admin.delete_subscription("subs", "early")
    assert admin.list_subscriptions("subs") == ["late"]
    admin.create_subscription("subs", "early", "earliest")  # starts clean, from the start
    assert _payloads(admin.peek("subs", "early", 5)) == [b"old"]


def test_create_subscription_at_a_message_id(client):
    ids = _send(client, "at-id", b"m0", b"m1", b"m2")
    client.admin.create_subscription("at-id", "from-1", ids[1])
    assert _payloads(client.admin.peek("at-id", "from-1", 5)) == [b"m1", b"m2"]
    text = client.admin.peek("at-id", "from-1")[0]["message_id"]
    client.admin.create_subscription("at-id", "from-text", text)
    assert _payloads(client.admin.peek("at-id", "from-text", 5)) == [b"m1", b"m2"]
    with pytest.raises(pulsartxn.InvalidMessageId):
        client.admin.create_subscription("at-id", "bad", "1:x")
    assert "bad" not in client.admin.list_subscriptions("at-id")


def test_create_subscription_at_a_batch_index_is_one_write(tmp_path):
    """A subscription made at a message inside a batch: its cursor and the cumulative ack
    of the batch's messages before it are one write (a crash between two writes left it at
    the batch's start: those messages delivered again), and a restart finds it there."""
    with pulsartxn.Broker(str(tmp_path / "d")) as broker:
        client = broker.client()
        producer = client.create_producer("bi", batching_max_publish_delay_ms=60_000)
        futures = [producer.send_async(b"m%d" % i) for i in range(5)]
        producer.flush()
        ids = [f.result() for f in futures]
        assert len({i.entry_id() for i in ids}) == 1 and ids[2].batch_index() == 2
        groups = broker.storage.commits.groups
        client.admin.create_subscription("bi", "s", ids[2])
        assert broker.storage.commits.groups == groups + 1
        assert _payloads(client.admin.peek("bi", "s", 5)) == [b"m2", b"m3", b"m4"]
    with pulsartxn.Broker(str(tmp_path / "d")) as broker:
        client = broker.client()
        assert client.admin.topic_stats("bi")["subscriptions"]["s"]["backlog"] == 3
        consumer = client.subscribe("bi", "s")
        assert [consumer.receive(5000).data() for _ in range(3)] == [b"m2", b"m3", b"m4"]


def test_delete_subscription_refused_with_consumers_and_transactions(client):
    admin = client.admin
    _send(client, "dsub", b"a", b"b")
    consumer = _subscribe(client, "dsub", "s")
    with pytest.raises(pulsartxn.ConsumerBusy):
        admin.delete_subscription("dsub", "s")
    txn = client.new_transaction()
    consumer.acknowledge(consumer.receive(5000), txn=txn)
    for force in (False, True):
        with pytest.raises(pulsartxn.TransactionConflict):
            admin.delete_subscription("dsub", "s", force=force)
    assert admin.list_subscriptions("dsub") == ["s"]
    txn.abort()
    admin.delete_subscription("dsub", "s", force=True)
    assert admin.list_subscriptions("dsub") == []
    with pytest.raises(pulsartxn.AlreadyClosed):
        consumer.receive(200)
    with pytest.raises(TypeError):
        admin.delete_subscription("dsub", "s", force="yes")


def test_peek_shows_committed_messages_only_and_moves_nothing(client):
    admin = client.admin
    _send(client, "peek", b"p0")
    open_txn = client.new_transaction()
    _send(client, "peek", b"open", txn=open_txn)
    aborted = client.new_transaction()
    _send(client, "peek", b"aborted", txn=aborted)
    aborted.abort()
    _send(client, "peek", b"p1")  # behind the open transaction: not readable yet
    admin.create_subscription("peek", "s", "earliest")
    assert _payloads(admin.peek("peek", "s", 10)) == [b"p0"]
    open_txn.commit()
    rows = admin.peek("peek", "s", 10)
    assert _payloads(rows) == [b"p0", b"open", b"p1"]
    assert admin.peek("peek", "s", 10) == rows  # it did not move
    assert set(rows[0]) == {"message_id", "topic", "publish_time", "key", "properties", "payload"}
    consumer = _subscribe(client, "peek", "s")
    assert consumer.receive(5000).data() == b"p0"
    for bad, error in ((0, ValueError), (-1, ValueError), ("2", TypeError), (True, TypeError)):
        with pytest.raises(error):
            admin.peek("peek", "s", bad)


def test_skip_and_past_the_end(client):
    admin = client.admin
    _send(client, "skip", b"a", b"b", b"c")
    admin.create_subscription("skip", "s", "earliest")
    assert admin.skip("skip", "s", 2) == 2
    assert _payloads(admin.peek("skip", "s", 5)) == [b"c"]
    assert admin.skip("skip", "s", 5) == 1
    assert admin.skip("skip", "s", 5) == 0
    assert admin.topic_stats("skip")["subscriptions"]["s"]["backlog"] == 0
    with pytest.raises(pulsartxn.SubscriptionNotFound):
        admin.skip("skip", "other", 1)
    with pytest.raises(ValueError):
        admin.skip("skip", "s", 0)


def test_clear_backlog_and_reset_cursor(client):
    admin = client.admin
    before = int(time.time() * 1000) - 1000
    ids = _send(client, "reset", b"a", b"b", b"c")
    consumer = _subscribe(client, "reset", "s")
    admin.clear_backlog("reset", "s")
    assert admin.topic_stats("reset")["subscriptions"]["s"]["backlog"] == 0
    with pytest.raises(pulsartxn.Timeout):
        consumer.receive(200)
    admin.reset_cursor("reset", "s", before)  # a time before the first message: all again
    assert [consumer.receive(5000).data() for _ in range(3)] == [b"a", b"b", b"c"]
    admin.reset_cursor("reset", "s", ids[1])
    assert consumer.receive(5000).data() == b"b"
    admin.reset_cursor("reset", "s", "earliest")
    assert consumer.receive(5000).data() == b"a"
    txn = client.new_transaction()
    consumer.acknowledge(consumer.receive(5000), txn=txn)
    with pytest.raises(pulsartxn.TransactionConflict):
        admin.reset_cursor("reset", "s", "earliest")
    with pytest.raises(pulsartxn.TransactionConflict):
        admin.clear_backlog("reset", "s")
    txn.abort()
    for bad, error in ((-5, ValueError), (1.5, TypeError), ("x:y", pulsartxn.InvalidMessageId)):
        with pytest.raises(error):
            admin.reset_cursor("reset", "s", bad)
    with pytest.raises(pulsartxn.SubscriptionNotFound):
        admin.reset_cursor("reset", "nobody", "earliest")


def test_delete_topic_refusals_and_force(client):
    admin = client.admin
    producer = client.create_producer("del")
    producer.send(b"a")
    consumer = _subscribe(client, "del", "s")
    with pytest.raises(pulsartxn.ProducerBusy):
        admin.delete_topic("del")
    txn = client.new_transaction()
    producer.send(b"in-txn", txn=txn)
    with pytest.raises(pulsartxn.TransactionConflict):
        admin.delete_topic("del", force=True)
    txn.abort()
    admin.delete_topic("del", force=True)
    assert FULL + "del" not in [r["topic"] for r in admin.list_topics()]
    with pytest.raises(pulsartxn.TopicNotFound):
        admin.topic_stats("del")
    with pytest.raises(pulsartxn.AlreadyClosed):
        producer.send(b"late")
    with pytest.raises(pulsartxn.AlreadyClosed):
        consumer.receive(200)
    with pytest.raises(pulsartxn.TopicNotFound):
        admin.delete_topic("del")
    _send(client, "del", b"new")  # the same name again: a new, empty topic
    assert admin.list_subscriptions("del") == []
    assert admin.topic_stats("del")["messages"] == 1
    client.create_topic("del-part", partitions=2)
    with pytest.raises(pulsartxn.InvalidTopicName):
        admin.delete_topic("del-part-partition-0")
    _subscribe(client, "del-part", "idle").close()  # a subscription alone does not block
    admin.delete_topic("del-part")
    with pytest.raises(pulsartxn.TopicNotFound):
        client.topic_partitions("del-part")


def test_transaction_in_buffer_and_pending_ack(client):
    admin = client.admin
    _send(client, "tin", b"a")
    consumer = _subscribe(client, "tin", "s")
    txn = client.new_transaction()
    _send(client, "tin", b"b", txn=txn)
    consumer.acknowledge(consumer.receive(5000), txn=txn)
    stats = admin.transaction_in_buffer_stats("tin", txn.id)
    assert (stats["state"], stats["start_position"], stats["aborted"]) == ("ongoing", 1, False)
    held = admin.transaction_in_pending_ack_stats("tin", "s", str(txn.id))
    assert held["held_entries"] == 1 and held["cumulative_ack_position"] is None
    other = client.new_transaction()
    assert admin.transaction_in_buffer_stats("tin", other.id)["state"] == "unknown"
    txn.abort()
    assert admin.transaction_in_buffer_stats("tin", txn.id)["aborted"] is True
    assert admin.transaction_in_pending_ack_stats("tin", "s", txn.id)["held_entries"] == 0
    with pytest.raises(pulsartxn.SubscriptionNotFound):
        admin.transaction_in_pending_ack_stats("tin", "nobody", txn.id)
    with pytest.raises(ValueError):
        admin.transaction_in_buffer_stats("tin", "not-a-txn")
    other.abort()


def test_partitioned_topics(client):
    admin = client.admin
    client.create_topic("pt", partitions=2)
    producer = client.create_producer("pt")
    for i in range(6):
        producer.send(b"%d" % i, partition_key=str(i))
    producer.close()
    admin.create_subscription("pt", "s", "earliest")
    assert admin.list_subscriptions("pt") == ["s"]
    stats = admin.partitioned_stats("pt", per_partition=True)
    assert stats["messages"] == 6 and stats["partitions"] == 2
    assert sorted(stats["per_partition"]) == [FULL + f"pt-partition-{i}" for i in range(2)]
    assert "per_partition" not in admin.partitioned_stats("pt")
    _send(client, "lonely", b"x")
    with pytest.raises(pulsartxn.TopicNotFound):
        admin.partitioned_stats("lonely")
    assert len(admin.peek("pt", "s", 4)) == 4
    assert admin.skip("pt", "s", 5) == 5
    assert len(admin.peek("pt", "s", 10)) == 1
    assert admin.transaction_in_buffer_stats("pt", "0:999")["partitions"].keys() == set(
        stats["per_partition"]
    )


def test_mutations_are_durable(tmp_path):
    broker = pulsartxn.Broker(tmp_path / "d", sync=True)
    client = broker.client()
    _send(client, "dur", b"a", b"b", b"c")
    _send(client, "gone", b"x")
    broker.admin.create_subscription("dur", "skipped", "earliest")
    broker.admin.create_subscription("dur", "deleted", "earliest")
    broker.admin.skip("dur", "skipped", 2)
    broker.admin.delete_subscription("dur", "deleted")
    broker.admin.delete_topic("gone")
    broker.close()
    broker = pulsartxn.Broker(tmp_path / "d", sync=True)
    try:
        assert broker.admin.list_subscriptions("dur") == ["skipped"]
        assert _payloads(broker.admin.peek("dur", "skipped", 5)) == [b"c"]
        assert FULL + "gone" not in [r["topic"] for r in broker.admin.list_topics()]
    finally:
        broker.close()


def test_concurrent_skips_and_foreign_ids(client):
    admin = client.admin
    _send(client, "conc", *[b"%d" % i for i in range(10)])
    foreign = _send(client, "conc-other", b"x")[0]
    admin.create_subscription("conc", "s", "earliest")
    counts: list[int] = []
    threads = [
        threading.Thread(target=lambda: counts.append(admin.skip("conc", "s", 3))) for _ in range(5)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counts) == [0, 1, 3, 3, 3]
    with pytest.raises(pulsartxn.InvalidMessageId):
        admin.reset_cursor("conc", "s", foreign)
    with pytest.raises(TypeError, match="unexpected keyword argument 'm'"):
        admin.peek("conc", "s", m=1)
    assert admin.peek("conc", "s") == []
