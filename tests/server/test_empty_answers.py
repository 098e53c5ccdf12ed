"""A call that the broker carries out and answers with no result at all (an OK status with
nothing before it, as a relay that dropped the result and passed the status would) is a lost
answer: the client re-sends it, never unpacks nothing. Every action but read_many answers at
least once (remote/calls.py, MAY_ANSWER_NOTHING)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import pulsartxn
from pulsartxn import ConsumerType
from pulsartxn.server.service import BrokerServer
from tests.helpers import exactly_once_loop

N = 12
# The loop's calls, from opening the session to ending its transactions.
LOOP = [
    "create_producer",
    "subscribe",
    "receive",
    "new_transaction",
    "send_many",
    "ack",
    "end",
]


class Forgetful(BrokerServer):
    """Carries out every call, and answers the first `lose[action]` calls of an action with
    no result."""

    def __init__(self, broker, lose: dict[str, int]) -> None:
        super().__init__(broker, "127.0.0.1", 0)
        self._lose = dict(lose)
        self._lock = threading.Lock()
        self.lost: Counter = Counter()

    def do_action(self, context, action):
        out = super().do_action(context, action)
        with self._lock:
            if self._lose.get(action.type, 0) > 0:
                self._lose[action.type] -= 1
                self.lost[action.type] += 1
                return []
        return out


@pytest.mark.parametrize("batch", [False, True], ids=["receive", "batch_receive"])
def test_an_exactly_once_loop_whose_answers_come_back_empty(tmp_path, batch):
    """The first two answers of each call of the loop come back empty: each is re-sent, and
    the output holds each input once, in order, with nothing left unacknowledged."""
    broker = pulsartxn.Broker(str(tmp_path / "data"), sync=False)
    lose = {name: 2 for name in LOOP}
    if batch:
        del lose["receive"]  # batch_receive is a DoGet stream, where none is an answer
    server = Forgetful(broker, lose)
    url = f"pulsartxn://127.0.0.1:{server.port}"
    try:
        feed = broker.client().create_producer("in", batching_enabled=False)
        for i in range(N):
            feed.send(b"%d" % i)
        with pulsartxn.Client(url) as client:
            failed = exactly_once_loop(client, N, ConsumerType.Exclusive, batch)
        reader = broker.client().create_reader("out", pulsartxn.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(5000).data())
        stats = broker.admin.topic_stats("in")["subscriptions"]["loop"]
        assert server.lost == Counter(lose), server.lost
        assert got == [b"out-%d" % i for i in range(N)], (failed, got)
        assert (stats["backlog"], stats["unacked"]) == (0, 0)
    finally:
        server.shutdown()
        broker.close()
