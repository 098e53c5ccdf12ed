"""The exactly-once loop of tests/server/test_lost_answers.py on a cluster of two brokers,
each behind a relay that keeps losing its answers: each broker advertises its relay, so the
client's calls and the brokers' calls to each other (a transaction's coordinator on one, its
partitions on both) all lose answers."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from contextlib import contextmanager

import pytest

import pulsartxn
from pulsartxn import ConsumerType
from pulsartxn.cluster import LocalCluster
from tests.helpers import (
    LosingProxy,
    answer_lost,
    exactly_once_loop,
    free_ports,
    in_thread,
    losing_answers,
    wait_for,
)

N = 60
CUTS = 60
PARTITIONS = 4


@contextmanager
def _behind_relays(zookeeper, tmp_path):
    """Two brokers of one cluster, each advertising its LosingProxy: (proxies, url,
    brokers), brokers[i] the one-broker LocalCluster behind proxies[i]."""
    base = free_ports(2)
    proxies = [LosingProxy(("127.0.0.1", base + i)) for i in range(2)]
    root = f"t-{uuid.uuid4().hex[:8]}"
    brokers = []
    try:
        for i, proxy in enumerate(proxies):
            brokers.append(
                LocalCluster(
                    tmp_path / f"broker-{i}",
                    1,
                    zookeeper=zookeeper.address,
                    root=root,
                    base_port=base + i,
                    num_coordinators=4,
                    sync=False,
                    extra_args=("--advertised-address", f"127.0.0.1:{proxy.port}"),
                ).start()
            )
        yield proxies, "pulsartxn://" + ",".join(f"127.0.0.1:{p.port}" for p in proxies), brokers
    finally:
        for cluster in brokers:
            cluster.close()
        for proxy in proxies:
            proxy.close()


def test_an_exactly_once_loop_across_brokers_losing_answers(zookeeper, tmp_path):
    with _behind_relays(zookeeper, tmp_path) as (proxies, url, _):
        with pulsartxn.Client(url) as setup:
            setup.create_topic("in", PARTITIONS)
            setup.create_topic("out", PARTITIONS)
            feed = setup.create_producer("in", batching_enabled=False)
            for i in range(N):
                feed.send(b"%d" % i, partition_key=str(i))
        client = pulsartxn.Client(url, reconnect_timeout_s=60)
        with losing_answers(proxies, 11, CUTS) as cuts:
            failed = exactly_once_loop(client, N, ConsumerType.Failover)
        client.close()
        with pulsartxn.Client(url) as check:
            # A commit returns once decided; a participant's part may land just after.
            reader = check.create_reader("out", pulsartxn.MessageId.earliest)
            got = []
            try:
                while len(got) < N:
                    got.append(reader.read_next(10_000).data())
            except pulsartxn.Timeout:
                pass
            extra = reader.has_message_available()

            def backlog() -> tuple[int, int]:
                stats = check.admin.partitioned_stats("in")["subscriptions"]["loop"]
                return stats["backlog"], stats["unacked"]

            wait_for(lambda: backlog() == (0, 0), what="the acks landed")
        assert cuts and cuts[0] > 10, cuts
        assert Counter(got) == Counter(b"out-%d" % i for i in range(N)), (failed, got)
        assert not extra  # nothing twice


def test_a_transactional_send_batch_cut_on_a_partition_makes_its_transaction_abort(
    zookeeper, tmp_path
):
    """A cluster client's send_batch of a transaction over two partitions, their owners'
    answers lost and the connections cut: the call fails, and the transaction can only abort
    (what each owner stored is unknown): its commit aborts it, and nothing of it is read."""
    with _behind_relays(zookeeper, tmp_path) as (proxies, url, _):
        client = pulsartxn.Client(url, reconnect_timeout_s=5)
        client.create_topic("t", 2)
        producer = client.create_producer("t")
        txn = client.new_transaction()
        keys = [str(i) for i in range(20)]
        got = answer_lost(proxies, lambda: producer.send_batch([b"v"] * 20, keys, txn=txn))
        assert isinstance(got[0], pulsartxn.PulsarTxnError), got
        with pytest.raises(pulsartxn.InvalidTxnStatus):
            txn.commit()
        assert txn.state == pulsartxn.TxnState.ABORTED
        producer.send(b"after", partition_key="0")
        producer.send(b"after", partition_key="1")
        reader = client.create_reader("t", pulsartxn.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(2)] == [b"after"] * 2
        client.close()


def test_admin_calls_re_sent_across_an_owners_restart_take_effect_once(zookeeper, tmp_path):
    """A skip over a topic whose 4 partitions two brokers own is a numbered call at each
    partition's owner. Its answer lost, then the owner of the partition it skipped on killed
    -9 and restarted, the client makes the call again there: what the owner wrote with the
    skip says it is done, so 15 messages are skipped in all, not more. A subscription's
    delete on every partition says nothing is amiss. (A create goes the same way; each
    restart waits 4 s for the dead broker's ZooKeeper session, so it is left out.)"""
    with _behind_relays(zookeeper, tmp_path) as (proxies, url, brokers):
        client = pulsartxn.Client(url, reconnect_timeout_s=60)
        client.create_topic("pt", PARTITIONS)
        parts = client.topic_partitions("pt")
        owner = {p: client._owner("partition", p) for p in parts}
        assert len(set(owner.values())) == 2, owner
        for name in ("s", "gone"):
            client.subscribe(
                "pt", name, initial_position=pulsartxn.InitialPosition.Earliest
            ).close()
        producer = client.create_producer("pt", batching_enabled=False)
        for i in range(40):
            producer.send(b"m%d" % i, partition_key=str(i))

        def subs(part=None):
            if part is None:
                return client.admin.partitioned_stats("pt")["subscriptions"]
            return client.admin.topic_stats(part)["subscriptions"]

        first = subs(parts[0])["s"]["backlog"]
        assert 0 < first < 15 and subs()["s"]["backlog"] == 40
        addresses = [f"127.0.0.1:{p.port}" for p in proxies]
        victim = addresses.index(owner[parts[0]])
        other = addresses[1 - victim]

        def across_a_restart(fn, landed):
            """fn() in a thread, the victim's answers lost; the victim killed once it has
            answered, `landed(subscriptions of parts[0])` checked in its store, then it is
            restarted and its connections cut: what fn() returned."""
            proxies[victim].dropped = 0
            proxies[victim].hold_answers()
            client._home = other  # the topic's metadata from the broker that answers
            call, got = in_thread(fn)
            wait_for(lambda: proxies[victim].dropped > 0, what="the victim's answer")
            time.sleep(1.0)  # a keep-alive's answer (every 1 s) may come first
            brokers[victim].kill(0)
            with pulsartxn.Broker(brokers[victim].data_dir_of(0)) as broker:
                assert landed(broker.client().admin.topic_stats(parts[0])["subscriptions"])
            brokers[victim].start(0)
            proxies[victim].cut()
            call.join(90)
            assert not call.is_alive()
            return got[0]

        skip = across_a_restart(
            lambda: client.admin.skip("pt", "s", 15), lambda s: s["s"]["backlog"] == 0
        )
        assert skip == 15 and subs()["s"]["backlog"] == 25
        assert (
            across_a_restart(
                lambda: client.admin.delete_subscription("pt", "gone"), lambda s: "gone" not in s
            )
            is None
        )
        assert "gone" not in subs()
        # New calls are new.
        assert client.admin.skip("pt", "s", 5) == 5 and subs()["s"]["backlog"] == 20
        with pytest.raises(pulsartxn.SubscriptionNotFound):
            client.admin.delete_subscription("pt", "gone")
        client.close()


def test_calls_made_again_after_an_owner_was_out_of_reach_take_effect_once(zookeeper, tmp_path):
    """The owner of a partition out of reach for longer than a connection's own retries
    (1 s) after a skip and an unsubscribe landed there, their answers lost: the client makes
    each again there once it answers, in the same session. The skip skips once, and the
    unsubscribe succeeds (it is done: what it did the first time is the answer)."""
    with _behind_relays(zookeeper, tmp_path) as (proxies, url, _):
        client = pulsartxn.Client(url, reconnect_timeout_s=60)
        client.create_topic("pt", PARTITIONS)
        parts = client.topic_partitions("pt")
        addresses = [f"127.0.0.1:{p.port}" for p in proxies]
        victim = addresses.index(client._owner("partition", parts[0]))
        other = addresses[1 - victim]
        client.subscribe("pt", "s", initial_position=pulsartxn.InitialPosition.Earliest).close()
        leaving = client.subscribe("pt", "leaving")
        producer = client.create_producer("pt", batching_enabled=False)
        for i in range(40):
            producer.send(b"m%d" % i, partition_key=str(i))

        def subs():
            return client.admin.partitioned_stats("pt")["subscriptions"]

        first = client.admin.topic_stats(parts[0])["subscriptions"]["s"]["backlog"]
        assert 0 < first < 15

        def out_of_reach(fn):
            proxies[victim].dropped = 0
            proxies[victim].hold_answers()
            client._home = other
            call, got = in_thread(fn)
            wait_for(lambda: proxies[victim].dropped > 0, what="the victim's answer")
            time.sleep(0.5)  # a keepalive's answer may come first
            proxies[victim].refusing = True
            proxies[victim].cut()
            time.sleep(2)  # past the connection's own retries (1 s): the cluster client's turn
            proxies[victim].refusing = False
            call.join(90)
            assert not call.is_alive()
            return got[0]

        assert out_of_reach(lambda: client.admin.skip("pt", "s", 15)) == 15
        assert subs()["s"]["backlog"] == 25
        assert out_of_reach(leaving.unsubscribe) is None
        assert "leaving" not in subs()
        client.close()
