"""A broker cluster's metadata in ZooKeeper (Pulsar's own metadata store): live brokers and
who owns which bundle and coordinator. See docs/cluster.md."""

from .metadata import ClusterMetadata, parse_cluster_url
from .zookeeper import LocalZooKeeper

__all__ = ["ClusterMetadata", "LocalZooKeeper", "parse_cluster_url"]
