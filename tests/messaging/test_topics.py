"""Topic names, creation, partitions and auto-creation."""

from __future__ import annotations

import pytest

import pulsartxn
from pulsartxn.messaging.topic_name import TopicName


@pytest.mark.parametrize(
    ("name", "full"),
    [
        ("orders", "persistent://public/default/orders"),
        ("t1/ns1/orders", "persistent://t1/ns1/orders"),
        ("persistent://t1/ns1/a.b-c_d=e:f", "persistent://t1/ns1/a.b-c_d=e:f"),
    ],
)
def test_names_parse(name, full):
    assert TopicName.parse(name).full == full


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ",
        "a b",
        "a/b",
        "non-persistent://public/default/x",
        "persistent://public/default",
        "persistent://a/b/c/d",
        "persistent:///default/x",
        "x" * 600,
        "ünïcode",
        "a\0b",
        5,
        None,
    ],
)
def test_bad_names_are_refused(client, broker, bad):
    with pytest.raises(pulsartxn.InvalidTopicName):
        TopicName.parse(bad)
    with pytest.raises(pulsartxn.InvalidTopicName):
        client.create_producer(bad)
    with pytest.raises(pulsartxn.InvalidTopicName):
        broker.create_topic(bad, 2)


def test_partitions(broker):
    broker.create_topic("orders", partitions=4)
    assert broker.topic_partitions("orders") == [
        f"persistent://public/default/orders-partition-{i}" for i in range(4)
    ]
    assert broker.topic_partitions("orders-partition-2") == [
        "persistent://public/default/orders-partition-2"
    ]
    with pytest.raises(pulsartxn.TopicNotFound):
        broker.topic_partitions("orders-partition-4")
    with pytest.raises(pulsartxn.TopicAlreadyExists):
        broker.create_topic("orders", partitions=4)
    with pytest.raises(pulsartxn.TopicNotFound):
        broker.topic_partitions("missing")
    broker.create_topic("plain", partitions=0)
    assert broker.topic_partitions("plain") == ["persistent://public/default/plain"]
    with pytest.raises(ValueError):
        broker.create_topic("neg", partitions=-1)
    with pytest.raises(TypeError):
        broker.create_topic("flt", partitions=1.5)
    with pytest.raises(pulsartxn.InvalidTopicName):
        broker.create_topic("x-partition-1", partitions=2)
    with pytest.raises(pulsartxn.TopicNotFound):
        broker.topic_partitions("neg")


def test_a_create_made_again_under_its_id_finds_its_own_topic(tmp_path):
    """What a server does with a client's re-sent create: the same create_id finds the topic
    that call made, also after a reopen; another id, none, or other partitions are
    TopicAlreadyExists; a bad id is refused and creates nothing."""
    with pulsartxn.Broker(str(tmp_path / "b")) as broker:
        broker.create_topic("orders", 3, create_id="call-1")
        broker.create_topic("orders", 3, create_id="call-1")
        for other in ({"create_id": "call-2"}, {}):
            with pytest.raises(pulsartxn.TopicAlreadyExists):
                broker.create_topic("orders", 3, **other)
        with pytest.raises(pulsartxn.TopicAlreadyExists):
            broker.create_topic("orders", 4, create_id="call-1")
        for bad in (5, "", "x" * 65, b"call-1"):
            with pytest.raises(TypeError, match="create_id"):
                broker.create_topic("bad-id", 0, create_id=bad)
        with pytest.raises(pulsartxn.TopicNotFound):
            broker.topic_partitions("bad-id")
        with pytest.raises(TypeError):
            broker.create_topic("kw", 0, "positional-id")
    with pulsartxn.Broker(str(tmp_path / "b")) as broker:
        broker.create_topic("orders", 3, create_id="call-1")
        assert len(broker.topic_partitions("orders")) == 3
        assert broker.admin.list_topics() == [
            {"topic": "persistent://public/default/orders", "partitions": 3}
        ]


def test_auto_creation_on_first_use(broker, client):
    client.create_producer("auto").send(b"x")
    assert broker.topic_partitions("auto") == ["persistent://public/default/auto"]
    client.subscribe("auto2", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    assert broker.topic_partitions("auto2") == ["persistent://public/default/auto2"]
    broker.create_topic("p", partitions=2)
    with pytest.raises(pulsartxn.TopicNotFound):
        client.create_producer("p-partition-5")


def test_producers_consumers_and_readers_name_their_topic_in_full(broker, client):
    """topic() is the full name whatever the caller wrote, as pulsar-client's (the remote
    client gave back what it was given)."""
    broker.create_topic("named-pt", partitions=2)
    for short in ("named-t", "named-pt", "public/default/named-t"):
        full = TopicName.parse(short).full
        with client.create_producer(short) as p:
            assert p.topic() == full
        with client.subscribe(short, "s") as c:
            assert c.topic() == full
        with client.create_reader(short, pulsartxn.MessageId.earliest) as r:
            assert r.topic() == full


def test_second_broker_on_same_directory_fails_fast(tmp_path, broker):
    with pytest.raises(pulsartxn.DataDirectoryLocked):
        pulsartxn.Broker(broker.data_dir)


def test_close_is_idempotent_and_context_manager(tmp_path):
    with pulsartxn.Broker(tmp_path / "d", sync=False) as b:
        b.client().create_producer("t").send(b"x")
    b.close()
    with pytest.raises(pulsartxn.AlreadyClosed):
        b.client()
    with pulsartxn.Broker(tmp_path / "d", sync=False) as again:  # the lock was released
        assert [
            bytes(r) for r in again.client().scan("t").__next__().column("value").to_pylist()
        ] == [b"x"]


def test_second_broker_in_another_process_fails_fast(tmp_path):
    import subprocess
    import sys

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import pulsartxn, sys; b = pulsartxn.Broker({str(tmp_path / 'x')!r}, sync=False); "
            "print('open', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(pulsartxn.DataDirectoryLocked, match="in use"):
            pulsartxn.Broker(tmp_path / "x", sync=False)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with pulsartxn.Broker(tmp_path / "x", sync=False):  # released when that process ended
        pass


def known_topics(path) -> tuple[list, list]:
    """(topics, partitions with a ledger) a store holds, read back after a reopen."""
    with pulsartxn.Broker(path, sync=False) as b:
        with b.storage.read() as txn:
            ledgers = [bytes(k).decode() for k, _ in txn.cursor(db=b.topics._ledgers_db)]
        return b.topics.known(), ledgers


def test_a_topic_quota_refuses_creation_and_auto_creation(tmp_path):
    data = tmp_path / "d"
    with pulsartxn.Broker(data, sync=False, max_topics=3) as b:
        client = b.client()
        b.create_topic("a", 2)
        client.create_producer("b").send(b"x")
        client.subscribe("c", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_topics"):
            b.create_topic("d")
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_topics"):
            client.create_producer("e")
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_topics"):
            client.subscribe("f", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        client.create_producer("b").send(b"existing topics still work")
    topics, _ = known_topics(data)
    assert len(topics) == 3
    with pulsartxn.Broker(data, sync=False, max_topics=3) as b:  # counted from the store
        with pytest.raises(pulsartxn.QuotaExceeded):
            b.create_topic("d")


def test_a_subscription_quota_refuses_new_subscriptions_only(tmp_path):
    """max_subscriptions_per_topic: a new durable subscription past it is refused on every
    partition (none is half made); those that exist go on, also past a lowered limit."""
    data = tmp_path / "d"
    earliest = pulsartxn.InitialPosition.Earliest
    with pulsartxn.Broker(data, sync=False, max_subscriptions_per_topic=2) as b:
        client = b.client()
        b.create_topic("p", 2)
        client.subscribe("p", "s1", initial_position=earliest).close()
        # Partition 1 alone gets a second one: it is full, partition 0 is not.
        client.subscribe("p-partition-1", "one", initial_position=earliest).close()
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_subscriptions_per_topic=2"):
            client.subscribe("p", "s2", initial_position=earliest)
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_subscriptions_per_topic"):
            client.admin.create_subscription("p", "s3")
        with pytest.raises(pulsartxn.SubscriptionAlreadyExists):
            client.admin.create_subscription("p", "s1")
        assert client.admin.list_subscriptions("p-partition-0") == ["s1"]  # no s2 half made
        client.create_producer("p").send_batch([b"m0", b"m1"])
        again = client.subscribe("p", "s1", initial_position=earliest)  # it exists: taken
        assert sorted(m.data() for m in again.batch_receive(10, 1000)) == [b"m0", b"m1"]
        again.close()
        client.admin.delete_subscription("p-partition-1", "one")
        client.subscribe("p", "s2", initial_position=earliest).close()  # room again
    with pulsartxn.Broker(data, sync=False, max_subscriptions_per_topic=1) as b:
        client = b.client()
        assert client.admin.list_subscriptions("p") == ["s1", "s2"]  # past the lowered limit
        with pytest.raises(pulsartxn.QuotaExceeded):
            client.subscribe("p", "s4")
        s2 = client.subscribe("p", "s2", initial_position=earliest)
        assert sorted(m.data() for m in s2.batch_receive(10, 1000)) == [b"m0", b"m1"]
    for bad, error in ((0, ValueError), (True, TypeError), ("9", TypeError)):
        with pytest.raises(error, match="max_subscriptions_per_topic"):
            pulsartxn.Broker(tmp_path / "bad", max_subscriptions_per_topic=bad)


def test_a_partition_quota_counts_every_topic(tmp_path):
    """Before: a few create_topic(name, 4096) took every LMDB named database the store had;
    the defaults now stop them well before."""
    with pulsartxn.Broker(tmp_path / "d", sync=False) as b:
        b.create_topic("a", 4096)
        b.create_topic("b", 4096)
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_partitions"):
            b.create_topic("c", 4096)
        with pytest.raises(pulsartxn.TopicNotFound):
            b.topic_partitions("c")
        b.create_topic("c", 16)
        b.client().create_producer("d").send(b"x")
    with pulsartxn.Broker(tmp_path / "e", sync=False, max_partitions=5) as b:
        b.create_topic("a", 4)
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_partitions"):
            b.create_topic("b", 2)
        b.client().create_producer("c").send(b"x")  # a non-partitioned topic counts one
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_partitions"):
            b.client().create_producer("d")


def test_partitions_never_run_out_of_named_databases(tmp_path):
    """The partitions a store may hold fit beside its coordinators in max_dbs: every topic
    created is usable, and the one that would not fit is refused before anything is written
    (before: InvalidConfiguration from LMDB halfway through, for everyone after)."""
    with pulsartxn.Broker(tmp_path / "d", sync=False, max_dbs=64, num_coordinators=2) as b:
        client = b.client()
        b.create_topic("big", 40)
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_dbs"):
            b.create_topic("more", 10)
        created = 0
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_dbs"):
            for i in range(64):
                client.create_producer(f"t{i}").send(b"x")
                created += 1
        assert created > 0
        producer = client.create_producer("big")
        for i in range(40):
            producer.send(b"x", partition_key=str(i))
        for i in range(created):
            client.create_producer(f"t{i}").send(b"again")
        with pytest.raises(pulsartxn.QuotaExceeded):
            b.admin.scale_coordinators(4)


def test_a_long_topic_name_is_refused_before_any_write(tmp_path):
    """Before: a 483-character name left a topic whose ledger LMDB could not name, and
    MDB_BAD_VALSIZE for good."""
    data = tmp_path / "d"
    long = "t" * 483
    with pulsartxn.Broker(data, sync=False) as b:
        client = b.client()
        for call in (
            lambda: client.create_producer(long),
            lambda: client.subscribe(
                long, "s", initial_position=pulsartxn.InitialPosition.Earliest
            ),
            lambda: b.create_topic(long),
            lambda: b.create_topic(long, 4),
        ):
            with pytest.raises(pulsartxn.InvalidTopicName, match="bytes"):
                call()
        # Fits alone, not with its partitions' suffix.
        edge = "e" * (255 - len("persistent://public/default/"))
        b.create_topic(edge)
        with pytest.raises(pulsartxn.InvalidTopicName, match="partition"):
            b.create_topic(edge[:-5], 12)
        b.create_topic(edge[:-14], 12)
        client.create_producer(edge[:-14]).send(b"x", partition_key="k")
    topics, ledgers = known_topics(data)
    assert sorted(len(t) for t in topics) == [241, 255]
    assert all(len(name) <= 255 for name in ledgers)


@pytest.mark.parametrize("length", [201, 490])
def test_long_subscription_and_producer_names_are_refused(tmp_path, length):
    """Before: a 490-byte subscription or producer name made a key LMDB refuses, after the
    topic was created (MDB_BAD_VALSIZE); a NUL in a producer name could alias another's
    de-duplication keys."""
    data = tmp_path / "d"
    name = "n" * length
    with pulsartxn.Broker(data, sync=False) as b:
        client = b.client()
        with pytest.raises(ValueError, match="subscription"):
            client.subscribe("t", name, initial_position=pulsartxn.InitialPosition.Earliest)
        with pytest.raises(ValueError, match="producer"):
            client.create_producer("t", producer_name=name).send(b"x")
        with pytest.raises(ValueError, match="producer"):
            client.create_producer("t", producer_name="a\0b")
        with pytest.raises(pulsartxn.TopicNotFound):
            b.topic_partitions("t")  # refused before the topic was auto-created
        consumer = client.subscribe(
            "t", "n" * 200, initial_position=pulsartxn.InitialPosition.Earliest
        )
        producer = client.create_producer("t", producer_name="p" * 200)
        producer.send(b"x", sequence_id=1)
        assert consumer.receive(5000).data() == b"x"
        with pytest.raises(ValueError, match="app_id"):
            client.commit_group("g", [], idempotency_key=("a" * 600, 1))
        with pytest.raises(ValueError, match="group"):
            client.abort_group("g" * 70_000)
    with pulsartxn.Broker(data, sync=False) as b:
        with b.storage.read() as txn:
            cursors = [bytes(k) for k, _ in txn.cursor(db=b.topics._cursors_db)]
        assert [len(k.split(b"\0")[1]) for k in cursors] == [200]


def test_creates_racing_under_different_ids_make_one_topic(tmp_path):
    """Four callers create one topic at once, each under its own id: exactly one succeeds,
    the others are TopicAlreadyExists, and only the winner's call made again finds the topic
    as its own."""
    from tests.helpers import racing, the_one_winner

    with pulsartxn.Broker(str(tmp_path / "b")) as broker:
        for round_ in range(20):
            topic = f"race-{round_}"
            outcomes = racing(
                4, lambda i, t=topic: broker.create_topic(t, 2, create_id=f"call-{i}")
            )
            winner = the_one_winner(outcomes, pulsartxn.TopicAlreadyExists)
            broker.create_topic(topic, 2, create_id=f"call-{winner}")
            for loser in set(range(4)) - {winner}:
                with pytest.raises(pulsartxn.TopicAlreadyExists):
                    broker.create_topic(topic, 2, create_id=f"call-{loser}")
            assert len(broker.topic_partitions(topic)) == 2
