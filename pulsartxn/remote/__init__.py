"""``pulsartxn.Client("pulsartxn://host:port")``: the client API of API.md over the network
service (``pulsartxn.server``), in its own layer: it imports the wire protocol, never the
service. ``connect`` gives a ClusterClient when the brokers are a cluster's."""

from .admin import RemoteAdmin
from .batch_stream import BatchStream
from .client import RemoteClient
from .cluster import ClusterAdmin, ClusterClient, connect
from .consumer import RemoteConsumer
from .handles import RemoteTransaction
from .producer import RemoteProducer

__all__ = [
    "BatchStream",
    "ClusterAdmin",
    "ClusterClient",
    "RemoteAdmin",
    "RemoteClient",
    "RemoteConsumer",
    "RemoteProducer",
    "RemoteTransaction",
    "connect",
]
