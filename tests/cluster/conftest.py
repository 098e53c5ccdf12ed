"""Fixtures of the cluster tests: one real ZooKeeper per test module, and local clusters of
broker processes on it, each under a root of its own."""

from __future__ import annotations

import uuid

import pytest

from pulsartxn.cluster import LocalCluster, LocalZooKeeper


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    with LocalZooKeeper(tmp_path_factory.mktemp("zk")) as zk:
        yield zk


@pytest.fixture
def local_cluster(zookeeper, tmp_path):
    """local_cluster(n, **options): a started LocalCluster of n brokers on the module's
    ZooKeeper, under a fresh root (sync=False unless given: a killed process loses nothing
    unsynced, only a lost machine would); every one made is closed after the test."""
    made: list[LocalCluster] = []

    def make(brokers: int = 3, **options) -> LocalCluster:
        options.setdefault("sync", False)
        cluster = LocalCluster(
            tmp_path / f"cluster-{len(made)}",
            brokers,
            zookeeper=zookeeper.address,
            root=f"t-{uuid.uuid4().hex[:8]}",
            **options,
        )
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.close()
