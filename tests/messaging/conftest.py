from __future__ import annotations

import pytest

import pulsartxn


@pytest.fixture
def broker(tmp_path):
    b = pulsartxn.Broker(tmp_path / "data", sync=False)
    yield b
    b.close()


@pytest.fixture(params=["embedded", "remote"])
def client(request, broker):
    """The embedded client, and the remote client through a server on 127.0.0.1 serving the
    same broker: every test that takes `client` runs against both."""
    if request.param == "embedded":
        yield broker.client()
        return
    from pulsartxn.server.service import BrokerServer

    server = BrokerServer(broker, "127.0.0.1", 0)
    remote = pulsartxn.Client(f"pulsartxn://127.0.0.1:{server.port}")
    yield remote
    remote.close()
    server.shutdown_sessions()
    server.shutdown()
