"""The client as a Pulsar user writes it from memory (issue 25): strict keywords naming the
nearest valid one, pulsar-client's spellings (consumer_type, send_async's callback second,
message_listener, the Latest default, producer options), one type family with the same
methods and signatures on every client, and private transaction internals."""

from __future__ import annotations

import inspect
import logging
import threading
import time

import pytest

import pulsartxn
from pulsartxn.admin import Admin
from pulsartxn.messaging.consumer import Consumer
from pulsartxn.messaging.producer import Producer
from pulsartxn.messaging.reader import Reader
from pulsartxn.remote import (
    ClusterAdmin,
    ClusterClient,
    RemoteAdmin,
    RemoteClient,
    RemoteConsumer,
    RemoteProducer,
)
from pulsartxn.remote.cluster_consumer import ClusterConsumer
from pulsartxn.remote.cluster_producer import ClusterProducer
from pulsartxn.remote.cluster_reader import ClusterReader
from pulsartxn.remote.reader import RemoteReader

EARLIEST = pulsartxn.InitialPosition.Earliest
SHARED = pulsartxn.ConsumerType.Shared


def eventually(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


def typo(call, wrong: str, right: str) -> None:
    with pytest.raises(TypeError) as info:
        call()
    text = str(info.value)
    assert f"unexpected keyword argument '{wrong}'" in text
    assert f"did you mean '{right}'?" in text


# -- strict keywords -----------------------------------------------------------------------


def test_unknown_keywords_name_the_nearest_valid_one(client):
    client.create_topic("parts", partitions=2)
    one = client.create_producer("t")
    many = client.create_producer("parts")
    typo(
        lambda: client.subscribe("t", "s", subscriptoin_type=SHARED),
        "subscriptoin_type",
        "subscription_type",
    )
    typo(
        lambda: client.create_producer("t", batching_enabeld=False),
        "batching_enabeld",
        "batching_enabled",
    )
    typo(lambda: client.new_transaction(timeout=5_000), "timeout", "timeout_ms")
    for producer in (one, many):  # the one-partition one answers from the native container
        typo(
            lambda p=producer: p.send_async(b"x", partiton_key="k"), "partiton_key", "partition_key"
        )
        typo(lambda p=producer: p.send(b"x", propertes={}), "propertes", "properties")
        typo(lambda p=producer: p.send_batch([b"x"], key=["k"]), "key", "keys")
    consumer = client.subscribe("t", "s", initial_position=EARLIEST)
    typo(lambda: consumer.receive(timeout_ms=10), "timeout_ms", "timeout_millis")
    typo(lambda: consumer.batch_receive(max_messages=3), "max_messages", "max_num_messages")
    txn = client.new_transaction()
    typo(lambda: txn.commit(timeout=1), "timeout", "timeout_ms")
    typo(lambda: client.admin.topic_stats(topc="t"), "topc", "topic")
    typo(lambda: client.admin.slow_transactions(min_open=0), "min_open", "min_open_ms")
    # The refused calls changed nothing: no subscription, no message, the transaction open.
    assert set(client.admin.topic_stats("t")["subscriptions"]) == {"s"}
    assert client.admin.topic_stats("t")["msg_in"] == 0
    one.send(b"kept")
    msg = consumer.receive(5_000)
    typo(lambda: consumer.acknowledge(msg, tnx=txn), "tnx", "txn")
    consumer.acknowledge(msg, txn=txn)
    txn.commit()
    # An error raised by the body, not by binding, is left as it is.
    with pytest.raises(TypeError, match="content must be bytes"):
        one.send("text")


def test_broker_and_client_constructors_name_the_nearest_keyword(tmp_path):
    typo(lambda: pulsartxn.Broker(tmp_path / "d", sycn=False), "sycn", "sync")
    typo(lambda: pulsartxn.Broker(tmp_path / "d", max_topic=3), "max_topic", "max_topics")
    assert not (tmp_path / "d").exists()  # refused before anything was created
    typo(lambda: pulsartxn.Client("pulsartxn://127.0.0.1:1", tokn="x"), "tokn", "token")
    with pytest.raises(TypeError, match="valid keywords: "):  # nothing close: the list
        pulsartxn.Broker(tmp_path / "d", zzzzzz=1)
    with pytest.raises(TypeError, match="valid keywords: keepalive_s, ") as info:
        pulsartxn.Client("pulsartxn://127.0.0.1:1", zzzzzz=1)
    assert "cls" not in str(info.value)  # __new__'s first parameter is no keyword


# -- pulsar-client's spellings -------------------------------------------------------------


def test_consumer_type_is_subscription_type(client):
    a = client.subscribe("t", "s", consumer_type=SHARED)
    b = client.subscribe("t", "s", consumer_type=SHARED)  # Shared: a second consumer joins
    assert client.admin.topic_stats("t")["subscriptions"]["s"]["type"] == "Shared"
    with pytest.raises(TypeError, match="both subscription_type and consumer_type"):
        client.subscribe("t", "other", subscription_type=SHARED, consumer_type=SHARED)
    with pytest.raises(TypeError, match="consumer_type must be a ConsumerType"):
        client.subscribe("t", "other", consumer_type="Shared")
    assert set(client.admin.topic_stats("t")["subscriptions"]) == {"s"}
    with pytest.raises(pulsartxn.ConsumerBusy):  # the default stays Exclusive
        client.subscribe("t", "x") and client.subscribe("t", "x")
    a.close()
    b.close()


def test_initial_position_defaults_to_latest(client):
    producer = client.create_producer("t")
    producer.send(b"before")
    latest = client.subscribe("t", "late")
    earliest = client.subscribe("t", "early", initial_position=EARLIEST)
    with pytest.raises(pulsartxn.Timeout):
        latest.receive(200)
    producer.send(b"after")
    after = latest.receive(5_000)
    assert after.data() == b"after"
    latest.acknowledge(after)
    assert [earliest.receive(5_000).data() for _ in range(2)] == [b"before", b"after"]
    latest.close()
    # Latest applies when the subscription is created; a reopened one resumes where it was.
    producer.send(b"while away")
    assert client.subscribe("t", "late").receive(5_000).data() == b"while away"


def test_send_async_takes_the_callback_second(client):
    client.create_topic("parts", partitions=2)
    for topic in ("t", "parts"):
        producer = client.create_producer(topic)
        got = []
        done = threading.Event()

        def callback(result, message_id, got=got, done=done):
            got.append((result, message_id))
            done.set()

        fut = producer.send_async(b"q", callback)  # pulsar-client's order
        keyed = producer.send_async(b"k", callback=callback, partition_key="key")
        producer.flush()
        assert eventually(lambda got=got: len(got) == 2)
        assert sorted(got) == sorted(
            [(pulsartxn.Result.Ok, fut.result()), (pulsartxn.Result.Ok, keyed.result())]
        )
        assert isinstance(fut.result(), pulsartxn.MessageId)
        # The old order (properties second) is refused clearly, and nothing is sent.
        before = client.admin.topic_stats(topic)["msg_in"]
        with pytest.raises(TypeError, match="second argument is the callback"):
            producer.send_async(b"x", {"a": "b"})
        producer.flush()
        assert client.admin.topic_stats(topic)["msg_in"] == before
        assert producer.send_async(b"p", None, {"a": "b"}).result(10) is not None


def test_a_failed_send_calls_back_with_its_error(client):
    producer = client.create_producer("t")
    got = []
    txn = client.new_transaction()
    txn.abort()
    try:
        fut = producer.send_async(b"late", lambda r, m: got.append((r, m)), txn=txn)
    except pulsartxn.InvalidTxnStatus:
        assert got == []  # refused at the call (in process): nothing queued, no callback
        return
    with pytest.raises(pulsartxn.InvalidTxnStatus):  # over the network: its future fails
        fut.result(10)
    assert eventually(lambda: got)
    assert isinstance(got[0][0], pulsartxn.InvalidTxnStatus) and got[0][1] is None


def test_late_ops_say_what_was_refused_on_both_clients(client):
    """A send or an ack in an ended transaction: the same error and words in process and
    over the network (the network's come from the coordinator)."""
    producer = client.create_producer("late-words")
    producer.send(b"m")
    consumer = client.subscribe(
        "late-words", "s", initial_position=pulsartxn.InitialPosition.Earliest
    )
    msg = consumer.receive(5000)
    txn = client.new_transaction()
    txn.commit()
    with pytest.raises(
        pulsartxn.InvalidTxnStatus, match=f"produce in transaction {txn.id}: it is COMMITTED"
    ):
        producer.send(b"late", txn=txn)
    aborted = client.new_transaction()
    aborted.abort()
    with pytest.raises(
        pulsartxn.InvalidTxnStatus, match=f"acknowledge in transaction {aborted.id}: it is ABORTED"
    ):
        consumer.acknowledge(msg, txn=aborted)
    consumer.acknowledge(msg)  # the message was not held by the refused ack


def test_pulsar_client_producer_options(client):
    p = client.create_producer(
        "t",
        send_timeout_millis=10_000,
        block_if_queue_full=True,
        max_pending_messages=100,
        compression_type=pulsartxn.CompressionType.NONE,
        batching_type=pulsartxn.BatchingType.Default,
        chunking_enabled=False,
    )
    assert p.send(b"x") is not None
    refused = [
        (ValueError, {"compression_type": pulsartxn.CompressionType.LZ4}, "LZ4 is not implemented"),
        (TypeError, {"compression_type": "LZ4"}, "must be a CompressionType"),
        (ValueError, {"batching_type": pulsartxn.BatchingType.KeyBased}, "KeyBased"),
        (ValueError, {"chunking_enabled": True}, "chunking_enabled=True is not implemented"),
        (ValueError, {"send_timeout_millis": -1}, "send_timeout_millis"),
        (ValueError, {"max_pending_messages": 1.5}, "max_pending_messages"),
        (TypeError, {"block_if_queue_full": "yes"}, "block_if_queue_full"),
    ]
    for kind, options, text in refused:
        with pytest.raises(kind, match=text):
            client.create_producer("never", **options)
    with pytest.raises(pulsartxn.PulsarTxnError):  # refused before the topic was made
        client.admin.topic_stats("never")


# -- message_listener ----------------------------------------------------------------------


def test_a_message_listener_gets_every_message_in_order(client):
    got, threads = [], set()

    def listener(consumer, msg):
        threads.add(threading.current_thread().name)
        got.append(msg.data())
        consumer.acknowledge(msg)

    producer = client.create_producer("t")
    producer.send(b"old")
    consumer = client.subscribe("t", "s", initial_position=EARLIEST, message_listener=listener)
    for i in range(20):
        producer.send(b"%d" % i)
    assert eventually(lambda: len(got) == 21)
    assert got == [b"old"] + [b"%d" % i for i in range(20)]
    assert threading.current_thread().name not in threads
    with pytest.raises(pulsartxn.InvalidConfiguration, match="message_listener"):
        consumer.receive(10)
    with pytest.raises(pulsartxn.InvalidConfiguration, match="message_listener"):
        consumer.batch_receive(10, 10)
    assert eventually(lambda: client.admin.topic_stats("t")["subscriptions"]["s"]["unacked"] == 0)
    consumer.close()


def test_a_listener_that_raises_is_logged_and_goes_on(client, caplog):
    got = []

    def listener(consumer, msg):
        got.append(msg.data())
        if msg.data() == b"bad":
            raise RuntimeError("listener failed")
        consumer.acknowledge(msg)

    consumer = client.subscribe("t", "s", message_listener=listener)
    producer = client.create_producer("t")
    with caplog.at_level(logging.ERROR, logger="pulsartxn.listener"):
        for data in (b"a", b"bad", b"c"):
            producer.send(data)
        assert eventually(lambda: got == [b"a", b"bad", b"c"])
    assert any("raised" in r.getMessage() for r in caplog.records)
    assert "listener failed" in caplog.text
    consumer.close()


def test_a_listener_stops_when_its_consumer_closes(client):
    got = []
    consumer = client.subscribe("t", "s", message_listener=lambda c, m: got.append(m.data()))
    listener = consumer._listener
    producer = client.create_producer("t")
    producer.send(b"1")
    assert eventually(lambda: got == [b"1"])
    consumer.close()
    assert not listener.thread.is_alive()
    producer.send(b"2")
    time.sleep(0.3)
    assert got == [b"1"]
    # Closing from within the listener does not wait for itself.
    closed = threading.Event()

    def close_from_inside(c, m):
        c.close()
        closed.set()

    inside = client.subscribe(
        "t", "s2", initial_position=EARLIEST, message_listener=close_from_inside
    )
    assert closed.wait(10)
    assert eventually(lambda: not inside._listener.thread.is_alive())


def test_a_listener_acknowledges_and_produces_in_transactions(client):
    """consume-transform-produce from a listener: each message acked and its result sent in
    one transaction; an aborted one comes back."""
    out = client.create_producer("out")
    attempts: dict[bytes, int] = {}

    def listener(consumer, msg):
        attempts[msg.data()] = attempts.get(msg.data(), 0) + 1
        txn = client.new_transaction()
        out.send(msg.data().upper(), txn=txn)
        consumer.acknowledge(msg, txn=txn)
        if msg.data() == b"b" and attempts[b"b"] == 1:
            txn.abort()
            consumer.negative_acknowledge(msg)
        else:
            txn.commit()

    consumer = client.subscribe(
        "in",
        "s",
        consumer_type=SHARED,
        negative_ack_redelivery_delay_ms=50,
        message_listener=listener,
    )
    source = client.create_producer("in")
    for data in (b"a", b"b", b"c"):
        source.send(data)
    check = client.subscribe("out", "check", initial_position=EARLIEST)
    seen = sorted(check.receive(10_000).data() for _ in range(3))
    assert seen == [b"A", b"B", b"C"] and attempts[b"b"] == 2
    with pytest.raises(pulsartxn.Timeout):
        check.receive(300)  # the aborted attempt's output never shows
    assert eventually(lambda: client.admin.topic_stats("in")["subscriptions"]["s"]["unacked"] == 0)
    consumer.close()


def test_a_listener_must_be_callable(client):
    with pytest.raises(TypeError, match="message_listener must be callable"):
        client.subscribe("t", "s", message_listener="print")
    assert client.admin.topic_stats("t")["subscriptions"] == {} if _exists(client, "t") else True


def _exists(client, topic: str) -> bool:
    try:
        client.admin.topic_stats(topic)
    except pulsartxn.PulsarTxnError:
        return False
    return True


# -- one type family -----------------------------------------------------------------------


def test_every_client_is_a_client(client):
    assert isinstance(client, pulsartxn.Client)
    assert issubclass(RemoteClient, pulsartxn.Client)
    assert issubclass(ClusterClient, pulsartxn.Client)
    assert not isinstance(object(), pulsartxn.Client)
    client.create_producer("t").close()
    assert client.topic_partitions("t") == client.get_topic_partitions("t")
    client.create_topic("p", partitions=3)
    assert client.get_topic_partitions("p") == [
        f"persistent://public/default/p-partition-{i}" for i in range(3)
    ]
    with pytest.raises(pulsartxn.InvalidConfiguration, match="standalone"):
        client.admin.cluster()
    with pytest.raises(pulsartxn.InvalidConfiguration, match="standalone"):
        client.admin.cluster_transactions(0)


def test_every_handle_is_of_its_exported_type(client):
    """pulsartxn.Producer, Consumer, Reader and Transaction hold for the handles of every
    client (the network ones are registered), and a reader is no consumer (the cluster's is
    built on its consumer's code)."""
    producer = client.create_producer("types")
    consumer = client.subscribe("types", "s")
    reader = client.create_reader("types", pulsartxn.MessageId.earliest)
    txn = client.new_transaction()
    kinds = (pulsartxn.Producer, pulsartxn.Consumer, pulsartxn.Reader, pulsartxn.Transaction)
    for handle, kind in zip((producer, consumer, reader, txn), kinds):
        assert [isinstance(handle, k) for k in kinds] == [k is kind for k in kinds]
    for cls, kind in (
        (RemoteProducer, pulsartxn.Producer),
        (ClusterProducer, pulsartxn.Producer),
        (RemoteConsumer, pulsartxn.Consumer),
        (ClusterConsumer, pulsartxn.Consumer),
        (RemoteReader, pulsartxn.Reader),
        (ClusterReader, pulsartxn.Reader),
    ):
        assert issubclass(cls, kind)
    assert not issubclass(ClusterReader, pulsartxn.Consumer)
    assert not isinstance(object(), pulsartxn.Producer)
    txn.abort()
    for h in (producer, consumer, reader):
        h.close()


def _public(cls) -> dict:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and inspect.isfunction(member)
    }


def _parameters(member) -> list:
    return [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]


@pytest.mark.parametrize(
    "family, common_only",
    [
        ((pulsartxn.Client, RemoteClient, ClusterClient), False),
        ((Admin, RemoteAdmin, ClusterAdmin), False),
        ((Producer, RemoteProducer, ClusterProducer), True),
        ((Consumer, RemoteConsumer, ClusterConsumer), False),
        ((Reader, RemoteReader, ClusterReader), False),
    ],
)
def test_the_clients_offer_the_same_methods_and_signatures(family, common_only):
    """Methods added to one client must be added to all three (producers: batch_stream is
    the network producers' own)."""
    members = [_public(cls) for cls in family]
    names = [set(m) for m in members]
    if not common_only:
        assert names[0] == names[1] == names[2], [sorted(n ^ names[0]) for n in names]
    else:
        assert names[1] - names[0] == {"batch_stream"} and names[0] <= names[1] == names[2]
    for name in set.intersection(*names):
        shapes = [_parameters(m[name]) for m in members]
        assert shapes[0] == shapes[1] == shapes[2], (name, shapes)


def test_transaction_internals_are_private(client):
    txn = client.new_transaction()
    public = {n for n in dir(txn) if not n.startswith("_")}
    assert public == {"id", "state", "commit", "abort", "capability"}
    txn.commit()


def test_acknowledgements_return_none_on_both_clients(client):
    """As pulsar-client's: what a transactional ack registered is the broker's business."""
    producer = client.create_producer("t", batching_enabled=False)
    for i in range(4):
        producer.send(b"m%d" % i)
    consumer = client.subscribe("t", "s", initial_position=EARLIEST)
    msgs = [consumer.receive(timeout_millis=5000) for _ in range(4)]
    txn = client.new_transaction()
    assert consumer.acknowledge(msgs[0], txn=txn) is None
    assert consumer.acknowledge_cumulative(msgs[1], txn=txn) is None
    assert consumer.acknowledge(msgs[2]) is None
    txn.commit()
    assert consumer.acknowledge_cumulative(msgs[3]) is None
    assert client.admin.topic_stats("t")["subscriptions"]["s"]["backlog"] == 0
