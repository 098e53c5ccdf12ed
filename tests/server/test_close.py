"""A remote client against a real `pulsartxn serve` process that is live, paused (SIGSTOP)
while the keepalive reopens the session, or killed (SIGKILL): close() releases everything on
a live broker, returns at once from a dead one leaving no thread behind, and a send with a
send timeout never waits for a reopen the paused broker does not answer."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request

import pytest

import pulsartxn
from pulsartxn.errors import AlreadyClosed, BrokerUnavailable, Timeout
from pulsartxn.remote.handles import CLOSE_TIMEOUT_S
from tests.helpers import Server, frames

from .test_send_timeout import timed


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the server, its metrics URL); the session timeout is long, so only a close (not an
    expiry) can end a session during a test."""
    s = Server(
        tmp_path_factory.mktemp("close") / "data",
        "--session-timeout-s",
        "60",
        "--metrics-port",
        "0",
        "--log-level",
        "warning",
    )
    s.start()
    found = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", s.proc.stdout.readline())
    yield s, found.group(1)
    s.proc.send_signal(signal.SIGCONT)
    s.stop()


def sessions(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    return float(re.search(r"^pulsartxn_sessions (\S+)$", text, re.M).group(1))


def restart(server: Server) -> None:
    """SIGKILL the broker and start it again on its port (its sessions are gone)."""
    server.proc.send_signal(signal.SIGCONT)
    server.kill9()
    server.start()


def reopening(thread_id: int) -> bool:
    """Whether that thread is in the call that opens the session again."""
    return "_hello" in frames(thread_id)


def wait_until(check, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def test_close_with_a_live_broker_releases_its_session_at_once(served):
    server, metrics = served
    before = sessions(metrics)
    client = pulsartxn.Client(server.url)
    producer = client.create_producer("close-live", batching_max_publish_delay_ms=60_000)
    queued = producer.send_async(b"queued")  # batched: sent by close()
    client.subscribe("close-live", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    client.create_reader("close-live", pulsartxn.MessageId.earliest)
    assert sessions(metrics) == before + 1
    start = time.monotonic()
    client.close()
    assert time.monotonic() - start < CLOSE_TIMEOUT_S
    assert queued.result(timeout=0) is not None  # stored, not dropped
    assert sessions(metrics) == before  # released by the close, long before any expiry
    client.close()  # again: nothing to do
    with pytest.raises(AlreadyClosed):
        client.create_producer("close-live")
    with pulsartxn.Client(server.url) as other:  # what close() sent was stored once
        c = other.subscribe("close-live", "t", initial_position=pulsartxn.InitialPosition.Earliest)
        assert c.receive(timeout_millis=5000).data() == b"queued"


def test_a_send_and_close_do_not_wait_for_a_reopen_the_paused_broker_does_not_answer(served):
    server, _ = served
    client = pulsartxn.Client(server.url, keepalive_s=0.02)
    keepalive = client._keepalive.ident
    producer = client.create_producer(
        "close-reopen", send_timeout_millis=500, batching_enabled=False
    )
    try:
        producer.send(b"a")
        restart(server)  # the keepalive opens the session again: the producer is stale
        wait_until(lambda: client._generation == 1)
        # Again, now with the broker paused while the keepalive is inside its reopen: the
        # broker runs in slices of a few microseconds until the keepalive is caught there. A
        # reopen that slipped through within one slice is tried again with another restart.
        for _ in range(10):
            before = client._generation
            restart(server)
            for _ in range(1000):
                os.kill(server.proc.pid, signal.SIGSTOP)
                time.sleep(0.002)
                if reopening(keepalive) or client._generation > before:
                    break
                os.kill(server.proc.pid, signal.SIGCONT)
            if reopening(keepalive) and client._generation == before:
                break
        else:
            pytest.fail("the keepalive was never caught reopening the session")
        out, took = timed(lambda: producer.send(b"b"))
        assert isinstance(out, Timeout), out
        assert 0.4 < took < 3.0, took
        # Closing while it is still paused: each call gets no answer, within the bound.
        out, took = timed(client.close)
        assert out is None
        assert took < CLOSE_TIMEOUT_S + 1.5, took
        assert not client._keepalive.is_alive()
    finally:
        server.proc.send_signal(signal.SIGCONT)
        client.close()


def test_close_after_the_broker_was_killed_is_prompt_and_leaves_no_thread(served):
    server, _ = served
    threads = set(threading.enumerate())
    client = pulsartxn.Client(server.url, reconnect_timeout_s=30, keepalive_s=0.05)
    producer = client.create_producer("close-dead", batching_max_publish_delay_ms=60_000)
    producer.send(b"stored")
    pending = producer.send_async(b"pending")  # batched, never sent: the broker is gone
    consumer = client.subscribe("close-dead", "s", message_listener=lambda c, m: None)
    reader = client.create_reader("close-dead", pulsartxn.MessageId.earliest)
    server.kill9()
    try:
        time.sleep(0.2)  # the keepalive is retrying now
        out, took = timed(client.close)
        assert out is None
        assert took < 1.0, took  # nothing is retried: the broker refuses connections
        with pytest.raises((BrokerUnavailable, AlreadyClosed)):
            pending.result(timeout=0)
        for handle in (producer, consumer, reader):
            assert not handle.is_connected()
        wait_until(lambda: not set(threading.enumerate()) - threads, within=1.0)
    finally:
        server.start()
