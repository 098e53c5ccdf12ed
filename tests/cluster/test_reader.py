"""Readers, seeks and last ids on a cluster: a reader per partition at its owner, merged; a
broker killed under an open reader, which goes on after what it read there."""

from __future__ import annotations

import threading
import time

import pytest

import pulsartxn
from pulsartxn import MessageId, errors
from pulsartxn.remote import ClusterClient

PARTITIONS = 3


def _read_all(reader, n: int) -> list[bytes]:
    return [reader.read_next(20_000).data() for _ in range(n)]


def test_readers_seeks_and_last_ids_across_brokers(local_cluster):
    cluster = local_cluster(3)
    with pulsartxn.Client(cluster.service_url, reconnect_timeout_s=60) as client:
        assert isinstance(client, ClusterClient)
        client.create_topic("rt", partitions=PARTITIONS)
        parts = client.get_topic_partitions("rt")
        assert parts == client.topic_partitions("rt") and len(parts) == PARTITIONS
        assert len({client._owner("partition", p) for p in parts}) > 1
        p = client.create_producer("rt", batching_enabled=False)
        ids = [p.send(b"a%d" % i, partition_key=f"k{i}") for i in range(30)]
        time.sleep(0.005)
        last = p.send(b"last", partition_key="k0")
        assert len({m.partition() for m in ids}) == PARTITIONS

        reader = client.create_reader("rt", MessageId.earliest)
        assert sorted(_read_all(reader, 31)) == sorted([b"a%d" % i for i in range(30)] + [b"last"])
        assert not reader.has_message_available()
        assert reader.get_last_message_id() == last
        assert [m.partition() for m in reader.get_last_message_ids()] == [0, 1, 2]

        # A MessageId applies to its own partition: the others are read from the start.
        mid = ids[4]
        with client.create_reader("rt", mid) as one:
            want = [
                b"a%d" % i
                for i, m in enumerate(ids)
                if m.partition() != mid.partition() or m.entry_id() > mid.entry_id()
            ] + [b"last"] * (last.partition() != mid.partition() or last > mid)
            assert sorted(_read_all(one, len(want))) == sorted(want)

        # A listener gets every partition's messages on its own thread; read_next is refused.
        heard: list = []
        done = threading.Event()

        def listener(r, msg) -> None:
            heard.append(msg.data())
            if len(heard) == 31:
                done.set()

        with client.create_reader("rt", MessageId.earliest, reader_listener=listener) as heard_by:
            assert done.wait(20)
            with pytest.raises(errors.InvalidConfiguration):
                heard_by.read_next(10)
            with pytest.raises(AttributeError):
                heard_by.acknowledge(ids[0])  # a reader is no consumer
        assert sorted(heard) == sorted([b"a%d" % i for i in range(30)] + [b"last"])

        consumer = client.subscribe("rt", "s", initial_position=pulsartxn.InitialPosition.Earliest)
        for _ in range(31):
            consumer.acknowledge(consumer.receive(20_000))
        consumer.seek(ids[7])  # its partition only, from that message on
        again = [
            b"a%d" % i
            for i, m in enumerate(ids)
            if m.partition() == ids[7].partition() and m.entry_id() >= ids[7].entry_id()
        ] + [b"last"] * (last.partition() == ids[7].partition())
        got = [consumer.receive(20_000) for _ in range(len(again))]
        assert sorted(m.data() for m in got) == sorted(again)
        for m in got:
            consumer.acknowledge(m)
        consumer.seek(0)  # a publish time: every partition
        got = [consumer.receive(20_000) for _ in range(31)]
        assert len({m.data() for m in got}) == 31
        for m in got:
            consumer.acknowledge(m)
        assert consumer.get_last_message_id() == last

        # The owner of a partition is killed under the open reader: it goes on there after
        # what it read, neither losing nor repeating a message.
        victim = cluster.addresses.index(client._owner("partition", parts[last.partition()]))
        cluster.kill(victim)
        cluster.start(victim)
        more = [p.send(b"b%d" % i, partition_key=f"k{i}") for i in range(9)]
        assert len(more) == 9
        after = _read_all(reader, 9)
        assert sorted(after) == sorted(b"b%d" % i for i in range(9))
        try:
            reader.read_next(500)
            raise AssertionError("a message came twice")
        except errors.Timeout:
            pass
        reader.close()
        consumer.close()
        p.close()
