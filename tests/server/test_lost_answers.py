"""An exactly-once loop (receive, send and ack in a transaction, commit) over a connection
that keeps losing the broker's answers: a relay drops what the server sends for a few
milliseconds, then cuts the connection, again and again. Every call is carried out by the
broker and its answer may never arrive; the client re-sends. The output must hold each input
once, in order."""

from __future__ import annotations

import pytest

import pulsartxn
from pulsartxn import ConsumerType
from tests.helpers import LosingProxy, exactly_once_loop, losing_answers

N = 50
CUTS = 80  # then the loop finishes on a quiet connection


@pytest.mark.parametrize("batch", [False, True], ids=["receive", "batch_receive"])
def test_an_exactly_once_loop_over_a_connection_losing_answers(server, batch):
    """One message a transaction with an individual ack, or up to 5 (batch_receive) with a
    cumulative ack of the last; a transaction that fails is aborted and what it acked is
    redelivered."""
    s = server()
    with pulsartxn.Client(s.url) as direct:
        feed = direct.create_producer("in", batching_enabled=False)
        for i in range(N):
            feed.send(b"%d" % i)
    proxy = LosingProxy(("127.0.0.1", s.port))
    client = pulsartxn.Client(f"pulsartxn://127.0.0.1:{proxy.port}", reconnect_timeout_s=60)
    with losing_answers([proxy], 7, CUTS) as cuts:
        failed = exactly_once_loop(client, N, ConsumerType.Exclusive, batch)
    with pulsartxn.Client(s.url) as direct:
        reader = direct.create_reader("out", pulsartxn.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(5000).data())
        stats = direct.admin.topic_stats("in")["subscriptions"]["loop"]
    assert cuts and cuts[0] > 10, cuts  # the answers were lost often
    assert got == [b"out-%d" % i for i in range(N)], (failed, got)
    assert (stats["backlog"], stats["unacked"]) == (0, 0)
    client.close()
    proxy.close()
