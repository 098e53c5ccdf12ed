from __future__ import annotations

import pytest

import pulsartxn


@pytest.fixture
def broker(tmp_path):
    b = pulsartxn.Broker(tmp_path / "data", sync=False)
    yield b
    b.close()


@pytest.fixture
def client(broker):
    return broker.client()
