"""The exactly-once loop of tests/server/test_lost_answers.py on a cluster of two brokers,
each behind a relay that keeps losing its answers: each broker advertises its relay, so the
client's calls and the brokers' calls to each other (a transaction's coordinator on one, its
partitions on both) all lose answers."""

from __future__ import annotations

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
    losing_answers,
    wait_for,
)

N = 60
CUTS = 60
PARTITIONS = 4


@contextmanager
def _behind_relays(zookeeper, tmp_path):
    """Two brokers of one cluster, each advertising its LosingProxy: (proxies, url)."""
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
        yield proxies, "pulsartxn://" + ",".join(f"127.0.0.1:{p.port}" for p in proxies)
    finally:
        for cluster in brokers:
            cluster.close()
        for proxy in proxies:
            proxy.close()


def test_an_exactly_once_loop_across_brokers_losing_answers(zookeeper, tmp_path):
    with _behind_relays(zookeeper, tmp_path) as (proxies, url):
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
    with _behind_relays(zookeeper, tmp_path) as (proxies, url):
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
