"""Readers (client.create_reader) on both clients: start positions, read committed, the
non-durable subscription they read through, partitions, listeners; MessageId.earliest and
.latest; get_topic_partitions and last message ids."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

import pulsartxn
from pulsartxn import MessageId, errors
from pulsartxn._native import load

EARLIEST = pulsartxn.InitialPosition.Earliest


def send(client, topic: str, n: int, prefix: bytes = b"m") -> list[MessageId]:
    p = client.create_producer(topic, batching_enabled=False)
    ids = [p.send(prefix + b"%d" % i) for i in range(n)]
    p.close()
    return ids


def read(reader, n: int) -> list[bytes]:
    return [reader.read_next(2000).data() for _ in range(n)]


def drained(reader) -> bool:
    with pytest.raises(errors.Timeout):
        reader.read_next(50)
    return not reader.has_message_available()


# -- MessageId.earliest and .latest --------------------------------------------------------


@pytest.mark.parametrize("kind", ["native", "reference"])
def test_earliest_and_latest_are_message_ids_of_both_twins(kind):
    impl = load(kind)
    e, latest = impl.MessageId.earliest, impl.MessageId.latest
    assert isinstance(e, impl.MessageId) and isinstance(latest, impl.MessageId)
    assert impl.MessageId.earliest is e  # one value each
    assert (e.ledger_id(), e.entry_id(), e.partition(), e.batch_index()) == (-1, -1, -1, -1)
    assert (latest.ledger_id(), latest.entry_id()) == ((1 << 63) - 1, (1 << 63) - 1)
    some = impl.MessageId(3, 7, 0, 2, 5)
    assert e < some < latest and e != latest
    for mid in (e, latest):
        assert impl.MessageId.deserialize(mid.serialize()) == mid
        assert pickle.loads(pickle.dumps(mid)) == mid
        assert hash(mid) == hash(impl.MessageId(mid.ledger_id(), mid.entry_id()))
    other = load("reference" if kind == "native" else "native").MessageId
    assert e == other.earliest and latest == other.latest
    assert e.serialize() == other.earliest.serialize()
    # Any other negative position is still no MessageId's wire form.
    with pytest.raises(errors.InvalidMessageId):
        impl.MessageId.deserialize(impl.MessageId(5, -1).serialize())


def test_earliest_and_latest_bound_a_scan_and_acknowledge_nothing(client):
    send(client, "t", 3)
    batches = list(client.scan("t", start=MessageId.earliest, end=MessageId.latest))
    assert [v for b in batches for v in b.column("value").to_pylist()] == [b"m0", b"m1", b"m2"]
    c = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    for position in (MessageId.earliest, MessageId.latest):
        with pytest.raises(errors.InvalidMessageId):
            c.acknowledge(position)
    assert c.receive(2000).data() == b"m0"  # nothing was acknowledged
    c.close()


# -- start positions -----------------------------------------------------------------------


def test_reader_starts_at_earliest_latest_or_after_an_id(client):
    ids = send(client, "t", 5)
    with client.create_reader("t", MessageId.earliest) as r:
        assert r.topic().endswith("/t")
        assert read(r, 5) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert drained(r)
    with client.create_reader("t", ids[2]) as r:
        assert read(r, 2) == [b"m3", b"m4"]  # exclusive by default, as Pulsar's
        assert drained(r)
    with client.create_reader("t", ids[2], start_message_id_inclusive=True) as r:
        assert read(r, 3) == [b"m2", b"m3", b"m4"]
    with client.create_reader("t", ids[4]) as r:
        assert drained(r)
    r = client.create_reader("t", MessageId.latest)
    assert drained(r)
    send(client, "t", 1, b"new")
    assert read(r, 1) == [b"new0"]
    r.close()
    assert not r.is_connected()
    with pytest.raises(errors.AlreadyClosed):
        r.read_next(10)
    r.close()  # again: nothing


def test_reader_honours_the_batch_index(client):
    p = client.create_producer("b", batching_max_publish_delay_ms=10_000)
    futures = [p.send_async(b"x%d" % i) for i in range(6)]
    p.flush()
    ids = [f.result() for f in futures]
    assert len({m.entry_id() for m in ids}) == 1 and ids[3].batch_index() == 3
    with client.create_reader("b", ids[3]) as r:
        assert read(r, 2) == [b"x4", b"x5"]
        assert drained(r)
    with client.create_reader("b", ids[3], start_message_id_inclusive=True) as r:
        assert read(r, 3) == [b"x3", b"x4", b"x5"]
    with client.create_reader("b", ids[5]) as r:  # the last of its batch: the next entry
        assert drained(r)
    with client.create_reader("b", ids[0], start_message_id_inclusive=True) as r:
        assert read(r, 6) == [b"x%d" % i for i in range(6)]


def test_a_position_past_the_end_is_the_end_and_a_foreign_one_is_refused(client, broker):
    ids = send(client, "t", 2)
    past = MessageId(ids[0].ledger_id(), 10_000, ids[0].partition())
    with client.create_reader("t", past) as r:
        assert drained(r)
        send(client, "t", 1, b"n")
        assert read(r, 1) == [b"n0"]
    send(client, "other", 1)
    foreign = MessageId(ids[0].ledger_id() + 1, 0, -1)
    with pytest.raises(errors.InvalidMessageId):
        client.create_reader("t", foreign)
    with pytest.raises(TypeError):
        client.create_reader("t", "earliest")
    with pytest.raises(TypeError):
        client.create_reader("t", MessageId.earliest, reader_listener=42)
    with pytest.raises(errors.InvalidConfiguration):
        client.create_reader("t", MessageId.earliest, is_read_compacted=True)
    with pytest.raises(ValueError):
        client.create_reader("t", MessageId.earliest, receiver_queue_size=0)
    assert broker.admin.topic_stats("t")["subscriptions"] == {}


# -- transactions --------------------------------------------------------------------------


def test_reader_is_read_committed_and_never_shows_aborted(client):
    send(client, "t", 1, b"before")
    p = client.create_producer("t", batching_enabled=False)
    r = client.create_reader("t", MessageId.earliest)
    unc = client.create_reader(
        "t", MessageId.earliest, isolation=pulsartxn.Isolation.READ_UNCOMMITTED
    )
    assert read(r, 1) == [b"before0"] and read(unc, 1) == [b"before0"]
    t1 = client.new_transaction()
    p.send(b"open", txn=t1)
    assert drained(r)  # held back by the max read position
    assert read(unc, 1) == [b"open"]
    t2 = client.new_transaction()
    p.send(b"aborted", txn=t2)
    t2.abort()
    p.send(b"plain")
    assert drained(r)  # still behind the open transaction
    t1.commit()
    assert read(r, 2) == [b"open", b"plain"]
    assert read(unc, 1) == [b"plain"]
    assert drained(r) and drained(unc)
    # From the earliest again: the aborted message never shows.
    with client.create_reader("t", MessageId.earliest) as again:
        assert read(again, 3) == [b"before0", b"open", b"plain"]
        assert drained(again)
    r.close()
    unc.close()


def test_last_message_id_of_a_reader_is_the_last_readable(client):
    ids = send(client, "t", 2)
    p = client.create_producer("t", batching_enabled=False)
    t = client.new_transaction()
    p.send(b"open", txn=t)
    with client.create_reader("t", MessageId.earliest) as r:
        assert r.get_last_message_id() == ids[-1]
        assert r.get_last_message_ids() == [ids[-1]]
        t.abort()
        assert r.get_last_message_id() == ids[-1]  # the aborted one is never readable


# -- a non-durable subscription ------------------------------------------------------------


def test_a_reader_leaves_no_subscription_and_holds_nothing(tmp_path):
    b = pulsartxn.Broker(tmp_path / "data", sync=False)
    c = b.client()
    send(c, "t", 3)
    r = c.create_reader("t", MessageId.earliest)
    assert read(r, 1) == [b"m0"]
    part = b.topics.resolve("t")[1][0]
    assert b.admin.topic_stats("t")["subscriptions"] == {}
    assert list(part.readers) == [r._subscription]
    assert r._subscription.startswith("reader-")
    with b.storage.read() as lmdb_txn:
        cursors = list(lmdb_txn.cursor(db=b.storage.open_db(b"cursors")))
    assert cursors == []  # never written
    r.close()
    assert part.readers == {}
    b.close()
    b = pulsartxn.Broker(tmp_path / "data", sync=False)
    assert b.admin.topic_stats("t")["subscriptions"] == {}
    with b.storage.read() as lmdb_txn:
        assert list(lmdb_txn.cursor(db=b.storage.open_db(b"cursors"))) == []
    # A reader open when the broker closes leaves nothing either.
    c = b.client()
    r = c.create_reader("t", MessageId.earliest, subscription_role_prefix="audit")
    assert r._subscription.startswith("audit-")
    assert read(r, 3) == [b"m0", b"m1", b"m2"]
    b.close()
    b = pulsartxn.Broker(tmp_path / "data", sync=False)
    assert b.admin.topic_stats("t")["subscriptions"] == {}
    b.close()


def test_many_readers_read_alone(client):
    send(client, "t", 4)
    readers = [client.create_reader("t", MessageId.earliest) for _ in range(3)]
    names = {r.reader_name() for r in readers}
    assert len(names) == 3
    for r in readers:
        assert read(r, 4) == [b"m0", b"m1", b"m2", b"m3"]
    for r in readers:
        r.close()


# -- partitioned topics --------------------------------------------------------------------


def test_a_reader_reads_every_partition(client, broker):
    broker.create_topic("pt", 3)
    p = client.create_producer("pt", batching_enabled=False)
    ids = [p.send(b"k%d" % i, partition_key=f"key-{i}") for i in range(11)]
    time.sleep(0.005)  # publish times are in ms: the last is the last one alone
    ids.append(p.send(b"k11", partition_key="key-11"))
    assert len({m.partition() for m in ids}) == 3
    with client.create_reader("pt", MessageId.earliest) as r:
        assert sorted(read(r, 12)) == sorted(b"k%d" % i for i in range(12))
        assert drained(r)
        lasts = r.get_last_message_ids()
        assert [m.partition() for m in lasts] == [0, 1, 2]
        assert r.get_last_message_id() == ids[-1]  # published last
    # A MessageId applies to its partition; the others are read from their start.
    mid = ids[5]
    same = [i for i, m in enumerate(ids) if m.partition() == mid.partition()]
    others = [i for i, m in enumerate(ids) if m.partition() != mid.partition()]
    expected = sorted([b"k%d" % i for i in same if i > 5] + [b"k%d" % i for i in others])
    with client.create_reader("pt", mid) as r:
        assert sorted(read(r, len(expected))) == expected
        assert drained(r)
    with client.create_reader("pt", MessageId.latest) as r:
        assert drained(r)
        p.send(b"late", partition_key="key-1")
        assert read(r, 1) == [b"late"]
    with pytest.raises(errors.InvalidMessageId):
        client.create_reader("pt", MessageId(ids[0].ledger_id(), 0, 7))


def test_get_topic_partitions(client, broker):
    broker.create_topic("pt", 2)
    assert client.get_topic_partitions("pt") == [
        "persistent://public/default/pt-partition-0",
        "persistent://public/default/pt-partition-1",
    ]
    send(client, "plain", 1)
    assert client.get_topic_partitions("plain") == ["persistent://public/default/plain"]
    with pytest.raises(errors.TopicNotFound):
        client.get_topic_partitions("nope")


def test_last_message_id_on_a_partitioned_consumer(client, broker):
    broker.create_topic("pt", 3)
    c = client.subscribe("pt", "s", initial_position=EARLIEST)
    assert c.get_last_message_id() == MessageId.earliest  # no partition holds one
    assert [m.entry_id() for m in c.get_last_message_ids()] == [-1, -1, -1]
    p = client.create_producer("pt", batching_enabled=False)
    first = p.send(b"a", partition_key="x")
    time.sleep(0.005)
    second = p.send(b"b", partition_key="y")
    if second.partition() == first.partition():
        second = p.send(b"c", partition_key="zz")
    assert c.get_last_message_id() in (first, second)
    time.sleep(0.005)
    last = p.send(b"z", partition_key="x")
    assert c.get_last_message_id() == last
    by_partition = {m.partition(): m for m in c.get_last_message_ids()}
    assert by_partition[last.partition()] == last
    c.close()


# -- reading: listeners, iteration, seeks, waits ---------------------------------------------


def test_reader_listener_gets_every_message_in_order(client):
    ids = send(client, "t", 5)
    got: list = []
    done = threading.Event()

    def listener(reader, msg):
        got.append((reader, msg.data(), threading.current_thread()))
        if len(got) == 3:
            raise RuntimeError("a listener's error does not stop reading")
        if len(got) == 7:
            done.set()

    r = client.create_reader("t", ids[0], reader_listener=listener)
    with pytest.raises(errors.InvalidConfiguration):
        r.read_next(10)
    send(client, "t", 3, b"n")
    assert done.wait(10)
    assert [g[1] for g in got] == [b"m1", b"m2", b"m3", b"m4", b"n0", b"n1", b"n2"]
    assert all(g[0] is r for g in got)
    assert all(g[2] is not threading.current_thread() for g in got)
    r.close()
    send(client, "t", 1, b"after")
    time.sleep(0.2)
    assert len(got) == 7


def test_a_waiting_read_next_gets_what_comes(client):
    r = client.create_reader("t", MessageId.latest)
    out = []
    t = threading.Thread(target=lambda: out.append(r.read_next(10_000).data()))
    t.start()
    time.sleep(0.1)
    send(client, "t", 1, b"woke")
    t.join(10)
    assert out == [b"woke0"]
    r.close()


def test_reader_iterates_and_seeks(client):
    ids = send(client, "t", 4)
    with client.create_reader("t", MessageId.earliest) as r:
        it = iter(r)
        assert [next(it).data() for _ in range(4)] == [b"m0", b"m1", b"m2", b"m3"]
        r.seek(ids[1])  # exclusive, as it started
        assert read(r, 2) == [b"m2", b"m3"]
        r.seek(MessageId.earliest)
        assert read(r, 1) == [b"m0"]
        r.seek(MessageId.latest)
        assert drained(r)
        r.seek(0)  # a publish time before all
        assert read(r, 4) == [b"m0", b"m1", b"m2", b"m3"]
        r.seek(int(time.time() * 1000) + 60_000)
        assert drained(r)
        with pytest.raises(TypeError):
            r.seek("m1")
        with pytest.raises(ValueError):
            r.seek(-1)
    with client.create_reader("t", ids[0], start_message_id_inclusive=True) as r:
        r.seek(ids[2])  # inclusive, as it started
        assert read(r, 2) == [b"m2", b"m3"]
    with pytest.raises(errors.AlreadyClosed):
        r.seek(MessageId.earliest)


def test_a_bulk_read_moves_every_partition_it_read(client, broker):
    """What a cluster reader's fetcher takes in one call (_read_many) is read: the reader
    goes on after it on each partition, repeating nothing."""
    broker.create_topic("pt", 3)
    p = client.create_producer("pt", batching_enabled=False)
    for i in range(12):
        p.send(b"k%d" % i, partition_key=f"key-{i}")
    with client.create_reader("pt", MessageId.earliest) as r:
        first = [m.data() for m in r._read_many(7)]
        assert len(first) == 7 and len(set(first)) == 7
        rest = read(r, 5)
        assert sorted(first + rest) == sorted(b"k%d" % i for i in range(12))
        assert drained(r)
        assert r._read_many(5) == []
