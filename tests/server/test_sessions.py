"""A long session on the in-process server (127.0.0.1): the handles it keeps for the
transactions it used stay in proportion to the open ones."""

from __future__ import annotations

import time

import pulsartxn
from pulsartxn.server import sessions
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
