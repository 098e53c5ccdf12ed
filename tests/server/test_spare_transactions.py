"""Spare transactions (remote/spare.py): a remote client running transactions in a loop has
each end begin its next transaction, so new_transaction() makes no call; a spare is handed
out only soon after its end and only for the same kind, a stale one is aborted by the next
begin, one never handed out is aborted when the client closes, a restarted broker's is
forgotten, and a bad request is refused with nothing ended or begun."""

from __future__ import annotations

import threading
import time

import pytest

import pulsartxn
from pulsartxn.remote import spare
from pulsartxn.txn.state import TxnState
from tests.helpers import scanned


def open_ids(client) -> set[str]:
    return {row["txn_id"] for row in client.admin.slow_transactions(0) if row["state"] == "OPEN"}


def a_spare(client, producer, **kind) -> str:
    """Run two transactions back to back (a loop), then return the spare the second one's end
    began: the one transaction open once it has ended."""
    client.new_transaction(**kind).commit()
    t = client.new_transaction(**kind)
    producer.send(b"loop", txn=t)
    t.commit()
    (held,) = open_ids(client)
    return held


@pytest.fixture
def wide(monkeypatch):
    """A spare window no busy test machine misses."""
    monkeypatch.setattr(spare, "SPARE_WITHIN_S", 5.0)


def test_a_loop_takes_each_transaction_begun_by_the_last_end(server, wide):
    s = server()
    with pulsartxn.Client(s.url) as c:
        p = c.create_producer("loop")
        held = a_spare(c, p)
        t = c.new_transaction()
        assert str(t.id) == held  # begun before new_transaction was called: no call of its own
        p.send(b"next", txn=t)
        t.commit()
        again = open_ids(c)  # the loop goes on: this end began the next one
        assert len(again) == 1 and again != {held}
        assert c.new_transaction().id != t.id
        assert scanned(c, "loop") == [b"loop", b"next"]


def test_a_spare_is_only_for_a_transaction_of_its_kind(server, wide):
    s = server()
    with pulsartxn.Client(s.url) as c:
        p = c.create_producer("kind")
        held = a_spare(c, p)
        other = c.new_transaction(timeout_ms=20_000)
        grouped = c.new_transaction(group="g")
        assert held not in {str(other.id), str(grouped.id)}
        assert str(c.new_transaction().id) == held  # kept for one of its kind
        meta = c.admin.transaction_metadata(other.id)
        assert meta["timeout_ms"] == 20_000 and meta["state"] == "OPEN"


def test_a_stale_spare_is_aborted_by_the_next_begin(server, monkeypatch):
    s = server()
    monkeypatch.setattr(spare, "SPARE_WITHIN_S", 0.3)
    with pulsartxn.Client(s.url) as c:
        p = c.create_producer("stale")
        held = a_spare(c, p)
        time.sleep(0.4)
        t = c.new_transaction()
        assert str(t.id) != held
        assert c.admin.transaction_metadata(held)["state"] == TxnState.ABORTED.value
        assert open_ids(c) == {str(t.id)}  # and no spare: the loop was broken
        p.send(b"late", txn=t)
        t.commit()
        assert scanned(c, "stale") == [b"loop", b"late"]


def test_a_spare_never_taken_is_aborted_when_its_client_closes(server, wide):
    s = server()
    with pulsartxn.Client(s.url) as admin:
        c = pulsartxn.Client(s.url)
        held = a_spare(c, c.create_producer("closed"))
        c.close()
        assert admin.admin.transaction_metadata(held)["state"] == TxnState.ABORTED.value


def test_after_a_broker_restart_a_loop_begins_afresh(server):
    s = server()
    c = pulsartxn.Client(s.url, reconnect_timeout_s=30)
    try:
        p = c.create_producer("restart")
        a_spare(c, p)
        s.kill9()
        s.start()
        t = c.new_transaction()
        p.send(b"after", txn=t)
        t.commit()
        assert scanned(c, "restart") == [b"loop", b"after"]
    finally:
        c.close()


def test_a_bad_next_or_drop_is_refused_and_ends_or_begins_nothing(server):
    s = server()
    with pulsartxn.Client(s.url) as c:
        t = c.new_transaction()
        end = {"txn": str(t.id), "capability": t.capability, "commit": True}
        for bad in ({"timeout_ms": None, "coordinator": 0}, [1, 2], "soon"):
            with pytest.raises(TypeError, match="next must name"):
                c._json("end", {**end, "next": bad})
        assert t.state is TxnState.OPEN
        for bad in ("x", [1], {"a": 1}):
            with pytest.raises(TypeError, match="drop must be"):
                c._json("new_transaction", {"drop": bad})
        assert open_ids(c) == {str(t.id)}
        t.commit()
        assert t.state is TxnState.COMMITTED


def test_an_end_whose_answer_was_lost_gets_its_spare_once_and_the_next_begin_drops_it(server):
    """An end that asked for a spare and got no answer (it timed out) may have begun one the
    client never had: the client's next begin names the end (`lost`) and the broker aborts
    the spare. On the wire, as the client's calls are."""
    s = server()
    with pulsartxn.Client(s.url) as c:

        def ended_with_spare() -> tuple[str, dict]:
            t = c.new_transaction()
            end = {"txn": str(t.id), "capability": t.capability, "commit": True}
            end["next"] = {"timeout_ms": None, "coordinator_id": None}
            return str(t.id), c._json("end", end)["next"]  # an answer never read

        t, first = ended_with_spare()
        assert open_ids(c) == {first["txn"]}
        u = c._json("new_transaction", {"lost": [t]})["txn"]
        assert open_ids(c) == {u}
        spare_of_t = c.transaction(first["txn"], capability=first["capability"])
        assert spare_of_t.state is TxnState.ABORTED
        # Named again, or an end the session never made: nothing else is touched.
        c._json("drop_spares", {"lost": [t, "9:999"], "drop": []})
        assert open_ids(c) == {u}
        # A cluster client's call of its own (its begin may go to another broker).
        t2, second = ended_with_spare()
        assert open_ids(c) == {u, second["txn"]}
        c._json("drop_spares", {"lost": [t2]})
        assert open_ids(c) == {u}
        # Malformed: refused before anything is dropped.
        _, third = ended_with_spare()
        for bad in ("x", [1], [t2] * 65):
            with pytest.raises(TypeError, match="lost must be a list of at most 64"):
                c._json("drop_spares", {"drop": [third["txn"]], "lost": bad})
        assert open_ids(c) == {u, third["txn"]}


def test_the_client_names_each_unanswered_end_once():
    """A client's record of the ends whose spare it may have missed: those that asked for one
    and got no answer, not one answered when sent again, at most 64 (the newest)."""
    spares, kind = spare.Spares(), (None, None)
    spares.ended(kind, None, 0, "1:1", answered=False)
    spares.ended(None, None, 0, "1:2", answered=False)  # it asked for no spare
    spares.ended(kind, None, 0, "1:3", answered=False)
    spares.ended(kind, {"txn": "1:9", "capability": "c"}, 0, "1:3", answered=True)
    assert spares.lost() == ["1:1"] and spares.lost() == []
    for i in range(100):
        spares.ended(kind, None, 0, f"2:{i}", answered=False)
    assert spares.lost() == [f"2:{i}" for i in range(36, 100)]


def test_a_spare_is_handed_out_once_across_threads(server, wide):
    s = server()
    with pulsartxn.Client(s.url) as c:
        held = a_spare(c, c.create_producer("threads"))
        got, start = [], threading.Barrier(4)

        def take():
            start.wait()
            got.append(str(c.new_transaction().id))

        threads = [threading.Thread(target=take) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert len(set(got)) == 4 and held in got  # the others begun by calls


def test_what_a_begin_did_not_send_goes_to_the_next():
    """The stale spares a begin took out are named by the next begin that makes a call when
    this one made none (it took a fresh spare) or its call failed, and so are the unanswered
    ends it took; at most 64 of each."""
    spares, a, b = spare.Spares(), (None, None), (20_000, None)
    spares.ended(a, {"txn": "1:1", "capability": "c"}, 0, "1:0", answered=True)
    spares._held[0] = (*spares._held[0][:4], time.monotonic() - 1.0)  # gone stale
    spares.ended(b, {"txn": "1:2", "capability": "c"}, 0, "1:9", answered=True)
    found, stale = spares.take(b, 0)
    assert found == ("1:2", "c") and stale == ["1:1"]
    spares.unsent(stale, [])
    assert spares.take(a, 0) == (None, ["1:1"])  # named by the next begin
    spares.ended(a, None, 0, "2:0", answered=False)
    lost = spares.lost()
    spares.unsent(["1:5"], lost)  # that begin's call failed
    assert spares.dropped() == ["1:5"] and spares.lost() == ["2:0"]
    spares.unsent([f"3:{i}" for i in range(100)], [f"4:{i}" for i in range(100)])
    assert spares.dropped() == [f"3:{i}" for i in range(36, 100)]
    assert len(spares.lost()) == 64


def test_a_stale_spare_met_by_a_begin_that_takes_another_is_aborted_by_the_next_call(server, wide):
    s = server()
    with pulsartxn.Client(s.url) as c:
        p = c.create_producer("kinds")
        held_a = a_spare(c, p)  # a spare of the default kind
        t = c.new_transaction(timeout_ms=20_000)  # soon after: a loop of another kind
        t.commit()  # ... whose end begins a spare of that kind
        (held_b,) = open_ids(c) - {held_a}
        # The default kind's spare has gone stale (its window passed), the other's has not.
        c._spares._held = [
            (*h[:4], h[4] - 10.0 if h[1] == held_a else h[4]) for h in c._spares._held
        ]
        taken = c.new_transaction(timeout_ms=20_000)
        assert str(taken.id) == held_b  # no call: the stale one is left to the next call
        assert c.admin.transaction_metadata(held_a)["state"] == TxnState.OPEN.value
        c.new_transaction(group="g").abort()  # the next call names it
        assert c.admin.transaction_metadata(held_a)["state"] == TxnState.ABORTED.value
        taken.abort()
