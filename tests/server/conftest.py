from __future__ import annotations

import pytest

from tests.helpers import Server


@pytest.fixture
def server(tmp_path):
    servers = []

    def make(*extra):
        s = Server(tmp_path / "data", *extra)
        servers.append(s)
        s.start()
        return s

    yield make
    for s in servers:
        s.stop()
