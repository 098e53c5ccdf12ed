from __future__ import annotations

import threading

import pytest

from tests.helpers import Served, brokers_at


class RecordingParticipant:
    """A participant that records every end call; fails the first `failures` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list = []
        self.lock = threading.Lock()

    def end_txn(self, txn_id, commit, low_watermark) -> None:
        with self.lock:
            if self.failures > 0:
                self.failures -= 1
                raise OSError("injected failure")
            self.calls.append((txn_id, commit, low_watermark))

    def outcomes(self) -> dict:
        with self.lock:
            return {t: c for t, c, _ in self.calls}


class Participants:
    """Resolver handed to Broker(txn_participants=...): one RecordingParticipant per name."""

    def __init__(self) -> None:
        self.by_name: dict = {}

    def __call__(self, kind, name):
        return self.by_name.setdefault((kind, name), RecordingParticipant())


@pytest.fixture(params=["embedded", "remote"])
def env(request, tmp_path):
    """open(**options) -> a broker on tmp_path (reopened after close()); with "remote", its
    client() is a remote client through a server serving it."""
    with brokers_at(
        tmp_path / "data",
        wrap=Served if request.param == "remote" else None,
        sync=False,
        num_coordinators=2,
        txn_timeout_tick_ms=10,
    ) as open_:
        yield open_


@pytest.fixture
def participants():
    return Participants()


@pytest.fixture
def open_broker(tmp_path, participants):
    """open_broker(**options) -> a broker on tmp_path/data (closed at the end of the test)."""
    with brokers_at(
        tmp_path / "data",
        sync=False,
        num_coordinators=4,
        txn_timeout_tick_ms=10,
        txn_participants=participants,
    ) as open_:
        yield open_
