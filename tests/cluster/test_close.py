"""A cluster client's close() with one of its brokers killed: what the live broker holds is
released there at once (its session gauge), the dead one is not waited for, and no thread
of the client is left behind."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid

import pulsartxn
from pulsartxn.cluster import LocalCluster
from pulsartxn.errors import BrokerUnavailable
from tests.helpers import free_ports


def _sessions(url: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return float(re.search(r"^pulsartxn_sessions (\S+)$", text, re.M).group(1))


def test_close_with_a_broker_killed_is_prompt_and_releases_the_live_one(zookeeper, tmp_path):
    cluster = LocalCluster(
        tmp_path / "cluster",
        2,
        zookeeper=zookeeper.address,
        root=f"t-{uuid.uuid4().hex[:8]}",
        sync=False,
        metrics_base_port=free_ports(2),
    )
    cluster.start()
    try:
        threads = set(threading.enumerate())
        client = pulsartxn.Client(cluster.service_url, reconnect_timeout_s=30)
        client.create_topic("close-t", partitions=4)
        producer = client.create_producer("close-t", batching_max_publish_delay_ms=60_000)
        client.subscribe("close-t", "s")
        for i in range(4):
            producer.send(b"stored", partition_key=f"k{i}")
        pending = [producer.send_async(b"pending", partition_key=f"k{i}") for i in range(8)]
        assert {len(client._conns)} == {2}  # both brokers hold a part of it
        live = cluster.metrics_url(0)
        assert _sessions(live) == 1
        cluster.kill(1)
        start = time.monotonic()
        client.close()
        assert time.monotonic() - start < 2.0  # nothing waits for the killed broker
        assert _sessions(live) == 0
        failed = 0
        for fut in pending:  # the live broker's were sent by close(), the others failed
            if fut.exception(timeout=0) is not None:
                assert isinstance(fut.exception(), BrokerUnavailable), fut.exception()
                failed += 1
        assert 0 < failed < len(pending)
        deadline = time.monotonic() + 2.0
        while set(threading.enumerate()) - threads:
            assert time.monotonic() < deadline, set(threading.enumerate()) - threads
            time.sleep(0.02)
    finally:
        cluster.close()
