"""The ack timeout (unacked_messages_timeout_ms), kept by the broker: a delivered message not
acknowledged in time is delivered again (count + 1) to a consumer that can take it, unless a
transaction holds it; nacks and the timeout do not redeliver one delivery twice."""

from __future__ import annotations

import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType, DeadLetterPolicy, InitialPosition
from tests.helpers import drain

TIMEOUT_MS = 300


@pytest.fixture
def broker(tmp_path):
    """The `client` fixture's broker, with ack timeouts allowed down to 100 ms."""
    b = pulsartxn.Broker(tmp_path / "data", sync=False, min_ack_timeout_ms=100)
    yield b
    b.close()


def subscribe(client, name="s", timeout_ms=TIMEOUT_MS, **kwargs):
    kwargs.setdefault("subscription_type", ConsumerType.Shared)
    return client.subscribe(
        "t",
        name,
        initial_position=InitialPosition.Earliest,
        unacked_messages_timeout_ms=timeout_ms,
        **kwargs,
    )


def test_an_unacknowledged_message_comes_back_after_the_timeout(client):
    client.create_producer("t").send(b"x")
    c = subscribe(client)
    start = time.monotonic()
    assert c.receive(1000).redelivery_count() == 0
    with pytest.raises(pulsartxn.Timeout):
        c.receive(TIMEOUT_MS // 2)
    again = c.receive(2000)
    assert time.monotonic() - start >= TIMEOUT_MS / 1000
    assert again.data() == b"x" and again.redelivery_count() == 1
    c.acknowledge(again)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(2 * TIMEOUT_MS)


def test_acknowledged_messages_stay_acknowledged(client):
    p = client.create_producer("t")
    for i in range(50):
        p.send(b"%d" % i)
    c = subscribe(client)
    msgs = c.batch_receive(50, 1000)
    assert len(msgs) == 50
    for m in msgs[::2]:
        c.acknowledge(m)
    time.sleep(TIMEOUT_MS / 1000 * 1.5)
    # Acknowledged as drained: a drain slower than the timeout would see them again.
    again = drain(c, 200, acknowledge=True)
    assert sorted(m.data() for m in again) == sorted(m.data() for m in msgs[1::2])
    assert {m.redelivery_count() for m in again} == {1}


def test_another_consumer_takes_it_and_a_consumer_without_timeout_keeps_its_own(client):
    client.create_producer("t").send(b"x")
    slow = subscribe(client)
    m = slow.receive(1000)
    other = subscribe(client, timeout_ms=None)
    got = other.receive(3000)  # waits in a receive for the timeout's redelivery
    assert got.data() == b"x" and got.redelivery_count() == 1
    with pytest.raises(pulsartxn.Timeout):
        other.receive(2 * TIMEOUT_MS)  # no timeout on `other`: it keeps it
    with pytest.raises(pulsartxn.TransactionConflict):
        txn = client.new_transaction()
        other.acknowledge(got, txn)
        slow.acknowledge(m, client.new_transaction())  # held by txn already
    txn.commit()
    assert drain(slow, 2 * TIMEOUT_MS) == []


def test_a_transaction_holding_the_message_stops_the_timeout_until_it_aborts(client):
    client.create_producer("t").send(b"x")
    c = subscribe(client)
    m = c.receive(1000)
    txn = client.new_transaction()
    c.acknowledge(m, txn)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(3 * TIMEOUT_MS)
    txn.abort()
    again = c.receive(1000)
    assert again.data() == b"x" and again.redelivery_count() == 1
    txn = client.new_transaction()
    c.acknowledge(again, txn)
    txn.commit()
    with pytest.raises(pulsartxn.Timeout):
        c.receive(3 * TIMEOUT_MS)


def test_a_nack_and_the_timeout_redeliver_one_delivery_once(client):
    client.create_producer("t").send(b"x")
    c = subscribe(client, negative_ack_redelivery_delay_ms=0)
    c.negative_acknowledge(c.receive(1000))
    again = c.receive(1000)
    assert again.redelivery_count() == 1
    third = c.receive(3000)  # the second delivery's own timeout, not the first's
    assert third.redelivery_count() == 2
    c.acknowledge(third)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(3 * TIMEOUT_MS)


def test_key_shared_timeout_returns_to_the_keys_consumer(client):
    p = client.create_producer("t")
    for i in range(20):
        p.send(b"%d" % i, partition_key=f"k{i}")
    a = subscribe(client, consumer_name="a", subscription_type=ConsumerType.KeyShared)
    b = subscribe(client, consumer_name="b", subscription_type=ConsumerType.KeyShared)
    # Until all 20 are out (a slow drain sees timed out ones again: the same consumer's).
    first: dict = {a: set(), b: set()}
    deadline = time.monotonic() + 30
    while len(first[a] | first[b]) < 20 and time.monotonic() < deadline:
        for c in (a, b):
            try:
                first[c].add(c.receive(50).data())
            except pulsartxn.Timeout:
                pass
    assert first[a] and first[b] and not first[a] & first[b]
    time.sleep(TIMEOUT_MS / 1000 * 1.5)
    again_a, again_b = drain(a, acknowledge=True), drain(b, acknowledge=True)
    assert {m.data() for m in again_a} == first[a]
    assert {m.data() for m in again_b} == first[b]


def test_with_a_dead_letter_policy_timeouts_count_as_redeliveries(client):
    client.create_producer("t").send(b"x")
    c = subscribe(client, dead_letter_policy=DeadLetterPolicy(1))
    assert c.receive(1000).redelivery_count() == 0
    assert c.receive(2000).redelivery_count() == 1
    with pytest.raises(pulsartxn.Timeout):
        c.receive(3 * TIMEOUT_MS)
    dlq = client.subscribe("t-s-DLQ", "r", initial_position=InitialPosition.Earliest)
    assert [m.data() for m in drain(dlq)] == [b"x"]


def test_bad_timeouts_are_refused(client):
    for bad in (-1, 1.5, "10", True):
        with pytest.raises(ValueError, match="unacked_messages_timeout_ms"):
            subscribe(client, timeout_ms=bad)
    with pytest.raises(ValueError, match="at least 100"):
        subscribe(client, timeout_ms=50)
    subscribe(client, name="off", timeout_ms=0).close()


def test_the_default_minimum_is_pulsars_ten_seconds(tmp_path):
    with pulsartxn.Broker(tmp_path / "d", sync=False) as b:
        c = b.client()
        with pytest.raises(ValueError, match="at least 10000"):
            c.subscribe("t", "s", unacked_messages_timeout_ms=9_999)
        c.subscribe("t", "s", unacked_messages_timeout_ms=10_000).close()
