"""An exactly-once loop (receive, send and ack in a transaction, commit) over a connection
that keeps losing the broker's answers: a relay drops what the server sends for a few
milliseconds, then cuts the connection, again and again. Every call is carried out by the
broker and its answer may never arrive; the client re-sends. The output must hold each input
once, in order."""

from __future__ import annotations

import random
import threading

import pytest

import pulsartxn
from pulsartxn import ConsumerType, InitialPosition
from tests.helpers import LosingProxy

N = 50
CUTS = 80  # then the loop finishes on a quiet connection


def _chaos(proxy: LosingProxy, stop: threading.Event, seed: int) -> list[int]:
    rng = random.Random(seed)
    cuts = [0]
    while cuts[0] < CUTS and not stop.wait(rng.uniform(0.02, 0.12)):
        proxy.hold_answers()
        stop.wait(rng.uniform(0.0, 0.03))
        proxy.cut()
        cuts[0] += 1
    return cuts


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
    consumer = client.subscribe(
        "in",
        "loop",
        subscription_type=ConsumerType.Exclusive,
        initial_position=InitialPosition.Earliest,
    )
    out = client.create_producer("out", batching_enabled=False)
    stop = threading.Event()
    cuts: list[int] = []
    chaos = threading.Thread(target=lambda: cuts.extend(_chaos(proxy, stop, 7)))
    chaos.start()
    done = aborted = 0
    try:
        while done < N:
            if batch:
                msgs = consumer.batch_receive(5, 1000)
                if not msgs:
                    continue
            else:
                msgs = [consumer.receive(20_000)]
            txn = client.new_transaction()
            try:
                for msg in msgs:
                    out.send(b"out-" + msg.data(), txn=txn)
                if batch:
                    consumer.acknowledge_cumulative(msgs[-1], txn=txn)
                else:
                    consumer.acknowledge(msgs[0], txn=txn)
                txn.commit()
            except pulsartxn.PulsarTxnError:
                # Aborted (or never begun): its acks are void; the messages come again.
                aborted += 1
                if txn.state is not pulsartxn.TxnState.ABORTED:
                    txn.abort()
                consumer.redeliver_unacknowledged_messages()
                continue
            done += len(msgs)
    finally:
        stop.set()
        chaos.join()
    with pulsartxn.Client(s.url) as direct:
        reader = direct.create_reader("out", pulsartxn.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(5000).data())
        stats = direct.admin.topic_stats("in")["subscriptions"]["loop"]
    assert cuts and cuts[0] > 10, cuts  # the answers were lost often
    assert got == [b"out-%d" % i for i in range(N)], (aborted, got)
    assert (stats["backlog"], stats["unacked"]) == (0, 0)
    client.close()
    proxy.close()
