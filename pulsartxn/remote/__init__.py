"""``pulsartxn.Client("pulsartxn://host:port")``: the client API of API.md over the network
service (``pulsartxn.server``), in its own layer: it imports the wire protocol, never the
service."""

from .client import RemoteAdmin, RemoteClient
from .consumer import RemoteConsumer
from .handles import RemoteTransaction
from .producer import BatchStream, RemoteProducer

__all__ = [
    "BatchStream",
    "RemoteAdmin",
    "RemoteClient",
    "RemoteConsumer",
    "RemoteProducer",
    "RemoteTransaction",
]
