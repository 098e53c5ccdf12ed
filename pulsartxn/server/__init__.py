"""The network service (Arrow Flight) and the remote client."""
