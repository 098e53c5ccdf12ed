"""A broker cluster's metadata in ZooKeeper (Pulsar's own metadata store): live brokers and
who owns which bundle and coordinator; a local cluster of broker processes. See
docs/cluster.md."""

from .local import LocalCluster
from .metadata import ClusterMetadata, parse_cluster_url
from .zookeeper import LocalZooKeeper

__all__ = ["ClusterMetadata", "LocalCluster", "LocalZooKeeper", "parse_cluster_url"]
