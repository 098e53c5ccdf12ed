"""Damaged bytes on disk, flipped with the lmdb module while the broker is closed: a damaged
entry is a CorruptEntry naming topic, ledger and entry id wherever it is read (receive, scan,
recovery), never silently skipped or wrong; damaged transaction buffer snapshots are ignored
and the state rebuilt from the ledger; a damaged pending-ack record stops only its
subscription. (A damaged transaction log record stopping only its coordinator:
tests/txn/test_coordinator.py; the head snapshot record alone: tests/txn/test_transactions.py.)
"""

from __future__ import annotations

import functools
import random
import struct

import lmdb
import pytest

import pulsartxn
from pulsartxn.errors import CorruptEntry
from tests import helpers
from tests.helpers import scanned

TOPIC = "persistent://public/default/t"


@pytest.fixture
def open_broker(tmp_path):
    with helpers.brokers_at(tmp_path / "data", sync=False, num_coordinators=2) as open_:
        yield open_


def edit_lmdb(path, db_name, edit):
    """Run edit(txn, db) on a named database of the closed broker's environment."""
    env = lmdb.open(str(path), max_dbs=256)
    try:
        db = env.open_db(db_name, create=False)
        with env.begin(write=True) as txn:
            edit(txn, db)
    finally:
        env.close()


def flip(txn, db, key, offset):
    raw = bytearray(txn.get(key, db=db))
    raw[offset % len(raw)] ^= 0x5A
    txn.put(key, bytes(raw), db=db)


def entry_key(entry_id):
    return struct.pack(">Q", entry_id)


# This module drains with a 300 ms wait (the shared default is 200 ms).
drain = functools.partial(helpers.drain, timeout_ms=300)


def test_a_damaged_entry_payload_is_named_on_receive_and_on_scan(open_broker, tmp_path):
    broker = open_broker()
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    for i in range(6):
        producer.send(b"m%d" % i)
    client.create_producer("other", batching_enabled=False).send(b"fine")
    broker.close()
    edit_lmdb(
        tmp_path / "data", b"ledger/" + TOPIC.encode(), lambda t, db: flip(t, db, entry_key(3), -2)
    )

    broker = open_broker()
    client = broker.client()
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    got = []
    with pytest.raises(
        CorruptEntry, match=r"persistent://public/default/t \(ledger \d+\): entry 3: checksum"
    ):
        while True:
            got.append(consumer.receive(2000).data())
    # What came before is intact; the damaged entry is never skipped: asking again fails again.
    assert got == [b"m0", b"m1", b"m2"]
    with pytest.raises(CorruptEntry, match="entry 3"):
        consumer.receive(2000)
    with pytest.raises(CorruptEntry, match=r"/t \(ledger \d+\): entry 3: checksum"):
        scanned(client, "t")
    assert [b.num_rows for b in client.scan("t", end=3)] == [3]
    # Other topics are untouched, and the damaged one still takes new messages.
    assert scanned(client, "other") == [b"fine"]
    producer = client.create_producer("t", batching_enabled=False)
    producer.send(b"after")
    assert broker.admin.topic_stats("t")["messages"] == 7


def test_a_damaged_entry_header_is_named_when_the_partition_opens(open_broker, tmp_path):
    broker = open_broker()
    broker.create_topic("p", 2)
    client = broker.client()
    producer = client.create_producer("p", batching_enabled=False)
    for i in range(10):
        producer.send(b"v%d" % i, partition_key=f"k{i}")
    broker.close()
    part0 = b"ledger/persistent://public/default/p-partition-0"
    edit_lmdb(tmp_path / "data", part0, lambda t, db: flip(t, db, entry_key(1), 0))  # the magic

    broker = open_broker()
    client = broker.client()
    with pytest.raises(CorruptEntry, match=r"p-partition-0 \(ledger \d+\): entry 1: bad magic"):
        scanned(client, "p")
    with pytest.raises(CorruptEntry, match="p-partition-0"):
        client.subscribe("p", "s", initial_position=pulsartxn.InitialPosition.Earliest)


@pytest.mark.parametrize("seed", range(4))
def test_damaged_buffer_snapshots_are_ignored_and_rebuilt_from_the_ledger(
    open_broker, tmp_path, seed
):
    rnd = random.Random(seed)
    broker = open_broker(txn_snapshot_every_txns=3)
    broker.create_topic("t2", 2)
    client = broker.client(session="s1")  # its open transaction outlives the close
    producer = client.create_producer("t2", batching_enabled=False)
    for i in range(30):
        txn = client.new_transaction()
        producer.send(b"c%d-a" % i, txn=txn)
        producer.send(b"c%d-b" % i, txn=txn)
        producer.send(b"plain%d" % i)
        (txn.commit if i % 3 else txn.abort)()
    ongoing = client.new_transaction()
    producer.send(b"ongoing", txn=ongoing, partition_key="x")
    producer.send(b"behind-ongoing", partition_key="x")
    before = sorted(scanned(client, "t2"))
    consumer = client.subscribe("t2", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    delivered_before = sorted(m.data() for m in drain(consumer))
    assert delivered_before == before and b"ongoing" not in before
    broker.close()

    damaged = []

    def damage(txn, db):
        keys = [
            bytes(k)
            for k, _ in txn.cursor(db=db)
            if bytes(k).startswith(b"persistent://public/default/t2")
        ]
        assert keys, "no snapshot was taken"
        for key in rnd.sample(keys, rnd.randint(1, len(keys))):
            flip(txn, db, key, rnd.randrange(1 << 16))
            damaged.append(key)

    edit_lmdb(tmp_path / "data", b"tbsnapshot", damage)

    broker = open_broker(txn_snapshot_every_txns=3)
    client = broker.client()
    errors = []
    for name in broker.topic_partitions("t2"):
        stats = broker.admin.transaction_buffer_stats(name)
        if stats["snapshot_load_error"] is not None:
            errors.append(stats["snapshot_load_error"])
    assert errors and all("snapshot" in e for e in errors), (damaged, errors)
    # The same read-committed view, scanned and delivered; the ongoing transaction still
    # holds back its partition, and commits.
    assert sorted(scanned(client, "t2")) == before
    consumer = client.subscribe("t2", "s2", initial_position=pulsartxn.InitialPosition.Earliest)
    assert sorted(m.data() for m in drain(consumer)) == before
    client.transaction(ongoing.id).commit()
    assert sorted(scanned(client, "t2")) == sorted(before + [b"ongoing", b"behind-ongoing"])
    assert sorted(m.data() for m in drain(consumer)) == [b"behind-ongoing", b"ongoing"]


def test_a_damaged_pending_ack_record_stops_only_its_subscription(open_broker, tmp_path):
    broker = open_broker()
    client = broker.client(session="s1")  # its open transaction outlives the close
    producer = client.create_producer("t", batching_enabled=False)
    for i in range(4):
        producer.send(b"m%d" % i)
    held = client.subscribe("t", "held", initial_position=pulsartxn.InitialPosition.Earliest)
    (m0, *_) = drain(held)
    txn = client.new_transaction()
    held.acknowledge(m0, txn=txn)
    other = client.subscribe("t", "other", initial_position=pulsartxn.InitialPosition.Earliest)
    for m in drain(other):
        other.acknowledge(m)
    other.close()
    broker.close()

    def damage(t, db):
        keys = [bytes(k) for k, _ in t.cursor(db=db) if b"\0held\0" in bytes(k)]
        assert len(keys) == 1
        flip(t, db, keys[0], -1)

    edit_lmdb(tmp_path / "data", b"pendingack", damage)

    broker = open_broker()
    client = broker.client()
    # The damaged subscription says so, by name, and delivers nothing...
    with pytest.raises(CorruptEntry, match="subscription 'held' on persistent://public/default/t"):
        client.subscribe("t", "held", initial_position=pulsartxn.InitialPosition.Earliest)
    stats = broker.admin.pending_ack_stats("t", "held")
    assert "checksum" in str(stats)
    # ...its transaction cannot be finalized behind its back (it is retried, not dropped)...
    handle = client.transaction(txn.id)
    handle.commit()  # decided; the damaged subscription's part is retried
    assert handle.state is pulsartxn.TxnState.COMMITTING
    # ...while the topic, its other subscriptions and new ones go on.
    producer = client.create_producer("t", batching_enabled=False)
    producer.send(b"m4")
    assert scanned(client, "t") == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [
        m.data()
        for m in drain(
            client.subscribe("t", "other", initial_position=pulsartxn.InitialPosition.Earliest)
        )
    ] == [b"m4"]
    assert (
        len(
            drain(client.subscribe("t", "new", initial_position=pulsartxn.InitialPosition.Earliest))
        )
        == 5
    )
