"""A long session on the in-process server (127.0.0.1): the handles it keeps for the
transactions it used stay in proportion to the open ones."""

from __future__ import annotations

import threading
import time

import pytest

import pulsartxn
from pulsartxn import errors
from pulsartxn.server import sessions
from pulsartxn.server.protocol import SessionLost
from pulsartxn.server.service import BrokerServer
from pulsartxn.txn.state import FINAL
from tests.helpers import scanned


def test_a_long_session_keeps_only_the_open_transactions(tmp_path, monkeypatch):
    monkeypatch.setattr(sessions, "_PRUNE_TXNS_AT", 64)  # pruned at 64 handles, not 1024
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        server = BrokerServer(broker, "127.0.0.1", 0)
        client = pulsartxn.Client(f"pulsartxn://127.0.0.1:{server.port}")
        try:
            producer = client.create_producer("t")
            held = client.new_transaction()  # open across every pruning below
            producer.send(b"held", txn=held)
            for i in range(450):
                txn = client.new_transaction(timeout_ms=100 if i % 3 == 2 else None)
                producer.send(b"%d" % i, txn=txn)
                if i % 3 == 0:
                    txn.commit()
                elif i % 3 == 1:
                    txn.abort()
                # else: left to its 100 ms timeout, never ended by the client
            time.sleep(0.5)  # every left one has timed out now
            (session,) = server.sessions.live()
            # Begins (left open) until the next pruning: it comes before the handles pass
            # twice what the last pruning left, and drops the 150 timed out ones. How many
            # were still open at the last pruning depends on the loop's speed against their
            # 100 ms timeouts, so the begins needed do too.
            extra = []
            while len(session.txns) > 1 + len(extra):
                assert len(extra) <= 2 * (150 + 1) + 1, "no pruning"
                extra.append(client.new_transaction())
            assert not [t for t in session.txns.values() if t.state in FINAL]
            assert str(held.id) in session.txns
            for txn in extra:
                txn.commit()
            assert len(session.txns) <= 64 + 1  # committed handles are forgotten at once
            held.commit()  # its send, counted in the kept handle, is in the commit
            got = set(scanned(client, "t"))
            assert b"held" in got
            assert got == {b"held"} | {b"%d" % i for i in range(0, 450, 3)}
        finally:
            client.close()
            server.shutdown_sessions()
            server.shutdown()


def _server_and_client(tmp_path, **client_kw):
    broker = pulsartxn.Broker(tmp_path / "d", sync=False)
    server = BrokerServer(broker, "127.0.0.1", 0)
    client = pulsartxn.Client(f"pulsartxn://127.0.0.1:{server.port}", **client_kw)
    return broker, server, client


def _stop(broker, server, client) -> None:
    client.close()
    server.shutdown_sessions()
    server.shutdown()
    broker.close()


def _receive_now(consumer) -> BaseException | None:
    try:
        consumer.receive(timeout_millis=0)
    except (errors.Timeout, SessionLost):
        return None
    except errors.ConsumerBusy as exc:
        return exc
    return None


def test_a_consumer_made_while_the_session_reopens_is_made_once(tmp_path):
    """The keepalive reopens a lost session while a consumer is being made: the consumer
    belongs to the session it landed in, so it is not made twice there (an exclusive one
    would find itself in the way: ConsumerBusy)."""
    broker, server, client = _server_and_client(tmp_path, keepalive_s=0.001)
    try:
        busy = []
        for i in range(300):
            server.sessions.close(client._session)  # lost: the keepalive opens it again
            busy.append(_receive_now(client.subscribe("t", f"s{i}")))
        assert [e for e in busy if e is not None] == []
    finally:
        _stop(broker, server, client)


def test_a_session_opened_again_while_it_is_closed_waits_for_its_consumers_to_go(tmp_path):
    """A session ended on the server (expired, or closed) while its client goes on: the
    client's hello of the same id waits until the old session's consumers are gone, so its
    exclusive consumer is subscribed again, never ConsumerBusy."""
    broker, server, client = _server_and_client(tmp_path)
    client.create_producer("t").send_batch([b"m"] * 5000)
    # Unacknowledged messages to hand back make the old session's close take its time.
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    stop = threading.Event()

    def close_often() -> None:
        while not stop.is_set():
            server.sessions.close(client._session)
            time.sleep(0.002)

    closer = threading.Thread(target=close_often)
    closer.start()
    try:
        busy = [_receive_now(consumer) for _ in range(300)]
    finally:
        stop.set()
        closer.join()
        _stop(broker, server, client)
    assert [e for e in busy if e is not None] == []


def test_a_create_cancelled_first_is_never_made_and_bad_cancels_are_refused(server):
    """Calls._create's cancels on the wire: a create whose id was cancelled before it arrived
    makes nothing; a malformed cancel or create id is a TypeError and changes nothing; a
    create sent again replaces what it made."""
    s = server()
    with pulsartxn.Client(s.url) as c:
        c._raw("keepalive", {"cancel": ["early"]})
        create = {"topic": "cancelled", "subscription": "s", "options": {}}
        with pytest.raises(errors.PulsarTxnError, match="was cancelled"):
            c._raw("subscribe", {**create, "create_id": "early"})
        for bad in ("early", [1], ["a"] * 65):
            with pytest.raises(TypeError, match="cancel"):
                c._raw("keepalive", {"cancel": bad})
        for bad in (1, "", "x" * 65):
            with pytest.raises(TypeError, match="create_id"):
                c._raw("subscribe", {**create, "create_id": bad})
        consumer = c.subscribe("cancelled", "s")  # Exclusive: nothing above holds it
        assert c.admin.topic_stats("cancelled")["subscriptions"]["s"]["consumers"] == 1
        consumer.close()
        # The same create sent twice (a retry after a lost answer) replaces what it made.
        for _ in range(2):
            c._raw("subscribe", {**create, "create_id": "twice"})
        assert c.admin.topic_stats("cancelled")["subscriptions"]["s"]["consumers"] == 1
