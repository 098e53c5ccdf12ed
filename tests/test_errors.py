"""Error messages that can cross the wire: bounded echoes of what the caller sent, and never
the broker's data directory."""

from __future__ import annotations

import pytest

import pulsartxn
from pulsartxn._native import load
from pulsartxn.errors import excerpt

HUGE = "x" * 1_000_000
BOUND = 400  # a message says what is wrong and shows at most ~100 characters of the input


def test_excerpt_bounds_what_it_shows():
    assert excerpt("short") == "'short'"
    assert excerpt(7) == "7"
    shown = excerpt(HUGE)
    assert len(shown) <= 100 and shown.startswith("'xxx") and shown.endswith("...")
    assert len(excerpt(b"\xff" * 10_000)) <= 100
    assert len(excerpt({"k": HUGE})) <= 100
    assert len(excerpt(10**10_000)) <= 100  # repr would refuse: more than 4300 digits


def _message(call) -> str:
    with pytest.raises((pulsartxn.PulsarTxnError, ValueError, TypeError)) as raised:
        call()
    return str(raised.value)


def test_huge_inputs_are_not_echoed_back(tmp_path):
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        client = broker.client()
        producer = client.create_producer("t")
        txn = client.new_transaction()
        calls = [
            lambda: client.create_producer(HUGE),
            lambda: client.subscribe(
                HUGE, "s", initial_position=pulsartxn.InitialPosition.Earliest
            ),
            lambda: client.subscribe(
                "t", HUGE, initial_position=pulsartxn.InitialPosition.Earliest
            ),
            lambda: client.create_producer("t", producer_name=HUGE),
            lambda: broker.create_topic("persistent://" + HUGE),
            lambda: producer.send(b"x", properties={"k": HUGE, "n": 1}),
            lambda: producer.send(b"x", sequence_id=HUGE),
            lambda: producer.send(b"x", partition_key=[HUGE]),
            lambda: client.transaction(HUGE),
            lambda: client.new_transaction(group=[HUGE]),
            lambda: client.new_transaction(timeout_ms=HUGE),
            lambda: client.commit_group("g", [], idempotency_key=(HUGE, 1)),
            lambda: client.commit_group("g", [txn.id, HUGE]),
            lambda: client.abort_group(HUGE),
            lambda: client.scan("t", start=HUGE),
            lambda: broker.admin.pending_ack_stats("t", HUGE),
            lambda: broker.admin.slow_transactions(HUGE),
        ]
        for i, call in enumerate(calls):
            message = _message(call)
            assert len(message) < BOUND, (i, message[:200])
        txn.abort()


@pytest.mark.parametrize("kind", ["native", "reference"])
def test_a_txn_id_that_does_not_parse_is_not_echoed_whole(kind):
    impl = load(kind)
    with pytest.raises(ValueError) as raised:
        impl.TxnID.parse(HUGE)
    assert len(str(raised.value)) < BOUND


def test_no_error_names_the_data_directory(tmp_path):
    """What a broker raises at run time may reach a remote client: it must not say where the
    data lives (only the open, which the server does itself, may)."""
    data = str(tmp_path / "secret-place")
    broker = pulsartxn.Broker(data, sync=False, max_dbs=40)
    messages = []
    try:
        for i in range(60):
            try:
                broker.storage.open_db(b"db-%d" % i)
            except pulsartxn.InvalidConfiguration as exc:
                messages.append(str(exc))
                break
    finally:
        broker.close()
    messages.append(_message(broker.client))
    messages.append(_message(lambda: broker.create_topic("t")))
    assert len(messages) == 3
    for message in messages:
        assert "secret-place" not in message, message
