"""The server's memory of delivering calls' answers (server/replay.py), on its own: a call
made again gets its first attempt's answer, also while that attempt still runs; empty
answers and errors are not kept; what the client has is dropped; memory stays bounded; bad
numbers are refused over the wire."""

from __future__ import annotations

import itertools
import threading

import pyarrow.flight as flight
import pytest

import pulsartxn
from pulsartxn.server import replay
from pulsartxn.server.protocol import frame
from pulsartxn.server.replay import Replays


class Handle:
    """Stands for a consumer: what Replays keys its answers by (weakly)."""


def test_a_call_made_again_gets_its_first_answer_and_new_calls_get_new_ones():
    replays, h = Replays(), Handle()
    counter = itertools.count()

    def deliver():
        return b"m%d" % next(counter)

    assert replays.run(h, {"call": 0, "below": 0}, deliver, "receive") == b"m0"
    assert replays.run(h, {"call": 0, "below": 0}, deliver, "receive") == b"m0"
    assert replays.run(h, {"call": 1, "below": 1}, deliver, "receive") == b"m1"
    assert replays.run(h, {}, deliver, "receive") == b"m2"  # an unnumbered call: never kept
    # The client has every answer below 2: call 0 made again now delivers anew.
    assert replays.run(h, {"call": 2, "below": 2}, deliver, "receive") == b"m3"
    assert replays.run(h, {"call": 0, "below": 0}, deliver, "receive") == b"m4"
    # Another handle's calls are its own.
    assert replays.run(Handle(), {"call": 2, "below": 2}, deliver, "receive") == b"m5"
    # A number of another kind (a batch's answer is a list) is not given another kind's.
    assert replays.run(h, {"call": 2, "below": 2}, lambda: [b"b"], "batch_receive") == [b"b"]
    assert replays.run(h, {"call": 2, "below": 2}, deliver, "receive") == b"m3"


def test_empty_answers_and_errors_are_not_kept():
    replays, h = Replays(), Handle()
    answers = iter([[], pulsartxn.Timeout("nothing"), [b"a"]])

    def deliver():
        out = next(answers)
        if isinstance(out, Exception):
            raise out
        return out

    assert replays.run(h, {"call": 7}, deliver, "receive") == []
    with pytest.raises(pulsartxn.Timeout):
        replays.run(h, {"call": 7}, deliver, "receive")
    assert replays.run(h, {"call": 7}, deliver, "receive") == [b"a"]
    assert replays.run(h, {"call": 7}, deliver, "receive") == [b"a"]


def test_a_call_made_again_while_the_first_runs_waits_for_its_answer():
    replays, h = Replays(), Handle()
    started, release = threading.Event(), threading.Event()
    runs = []

    def deliver():
        runs.append(1)
        started.set()
        release.wait(10)
        return b"only"

    got = []
    first = threading.Thread(
        target=lambda: got.append(replays.run(h, {"call": 3}, deliver, "receive"))
    )
    first.start()
    started.wait(10)
    second = threading.Thread(
        target=lambda: got.append(replays.run(h, {"call": 3}, deliver, "receive"))
    )
    second.start()
    second.join(0.2)
    assert second.is_alive() and got == []  # waits for the first, does not deliver
    release.set()
    first.join(10)
    second.join(10)
    assert got == [b"only", b"only"] and len(runs) == 1


def test_a_handle_keeps_few_answers_and_few_bytes():
    replays, h = Replays(), Handle()
    counter = itertools.count()
    for call in range(replay.KEEP + 3):  # a client that never says what it has
        replays.run(h, {"call": call, "below": 0}, lambda: b"m%d" % next(counter), "receive")
    kept = replays._of[h].answers
    assert sorted(n for _, n in kept) == list(range(3, replay.KEEP + 3))
    big = b"x" * (replay.KEEP_BYTES // 2 + 1)
    replays.run(h, {"call": 100, "below": 0}, lambda: big, "receive")
    replays.run(h, {"call": 101, "below": 0}, lambda: big, "receive")
    assert list(replays._of[h].answers) == [("receive", 101)]  # the newest is always kept
    replays.run(h, {"call": 102, "below": 0}, lambda: b"x" * (2 * replay.KEEP_BYTES), "receive")
    assert list(replays._of[h].answers) == [("receive", 102)]
    replays.forget(h)
    assert h not in replays._of


@pytest.mark.parametrize("bad", [-1, 1 << 63, "1", 1.0, True])
def test_bad_call_numbers_are_refused_and_deliver_nothing(server, bad):
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("t")
    producer.send(b"m0")
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    raw = flight.FlightClient(f"grpc://127.0.0.1:{s.port}")
    for name in ("call", "below"):
        args = {"session": client._session, "handle": consumer._ensure(), name: bad}
        with pytest.raises(flight.FlightError, match=name):
            list(raw.do_action(flight.Action("receive", frame(args))))
    assert consumer.receive(2000).data() == b"m0"
    client.close()
