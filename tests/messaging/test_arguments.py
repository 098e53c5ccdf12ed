"""Arguments on both clients: an unknown one is an error, a bad one a clear ValueError or
TypeError whose text shows at most an excerpt of it, and neither changes anything."""

from __future__ import annotations

import threading
import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType

HUGE = "x" * 1_000_000


def test_unknown_arguments_are_errors(client):
    client.create_producer("t")  # the topic exists; no subscription may appear
    with pytest.raises(TypeError, match="batching_max_bytes"):
        client.create_producer("t", batching_max_bytes=10)
    with pytest.raises(TypeError, match="receiver_queue"):
        client.subscribe(
            "t", "s", receiver_queue=10, initial_position=pulsartxn.InitialPosition.Earliest
        )
    assert client.admin.topic_stats("t")["subscriptions"] == {}


def test_bad_receive_arguments_are_refused_with_an_excerpt(client):
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    client.create_producer("t").send(b"kept")
    for bad in (-1, 1.5, True, HUGE):
        with pytest.raises(ValueError, match="timeout_millis") as info:
            consumer.receive(bad)
        assert len(str(info.value)) < 200
    for kwargs in (
        {"max_num_messages": 0},
        {"max_num_messages": "ten"},
        {"timeout_millis": None},
        {"timeout_millis": -5},
        {"timeout_millis": HUGE},
    ):
        with pytest.raises(ValueError) as info:
            consumer.batch_receive(**kwargs)
        assert len(str(info.value)) < 200
    assert consumer.receive(5_000).data() == b"kept"  # nothing was taken by the refusals


def test_consumer_names_are_bounded(client):
    client.create_producer("t")  # the topic exists; no subscription may appear
    with pytest.raises(ValueError, match="consumer_name"):
        client.subscribe(
            "t", "s", consumer_name="c" * 201, initial_position=pulsartxn.InitialPosition.Earliest
        )
    with pytest.raises(ValueError, match="consumer_name"):
        client.subscribe(
            "t", "s", consumer_name="", initial_position=pulsartxn.InitialPosition.Earliest
        )
    assert client.admin.topic_stats("t")["subscriptions"] == {}
    assert (
        client.subscribe(
            "t", "s", consumer_name="c" * 200, initial_position=pulsartxn.InitialPosition.Earliest
        ).consumer_name()
        == "c" * 200
    )


def test_enums_are_checked_before_a_request(client):
    client.create_producer("t")  # the topic exists; no subscription may appear
    with pytest.raises(TypeError, match="ConsumerType"):
        client.subscribe(
            "t",
            "s",
            subscription_type="Shared",
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
    with pytest.raises(TypeError, match="InitialPosition"):
        client.subscribe("t", "s", initial_position=HUGE)
    assert client.admin.topic_stats("t")["subscriptions"] == {}


def test_batching_and_delay_numbers_are_checked_before_a_request(client):
    """A batching option of 0 silently became the broker's default, "yes" enabled batching,
    a NaN or infinite delay was taken, and a negative nack delay too: each is refused now,
    and nothing is made."""
    client.create_producer("t")  # the topic exists; no producer or subscription may appear
    for kwargs, error, match in (
        ({"batching_max_messages": 0}, ValueError, "batching_max_messages must be a positive"),
        ({"batching_max_allowed_size_in_bytes": 0}, ValueError, "size_in_bytes must be a pos"),
        ({"batching_max_publish_delay_ms": float("nan")}, ValueError, "delay_ms must be a num"),
        ({"batching_max_publish_delay_ms": float("inf")}, ValueError, "delay_ms must be a num"),
        ({"batching_max_publish_delay_ms": -1}, ValueError, "delay_ms must be a number"),
        ({"batching_enabled": "yes"}, TypeError, "batching_enabled must be a bool"),
    ):
        with pytest.raises(error, match=match):
            client.create_producer("t", producer_name="checked", **kwargs)
    for bad in (-1, float("nan"), True, "60000"):
        with pytest.raises(ValueError, match="negative_ack_redelivery_delay_ms must be a number"):
            client.subscribe("t", "s", negative_ack_redelivery_delay_ms=bad)
    assert client.admin.topic_stats("t")["subscriptions"] == {}
    producer = client.create_producer("t", producer_name="checked", batching_max_messages=1)
    assert producer.producer_name() == "checked"  # no earlier attempt holds the name


def test_the_waiting_stat_counts_parked_receives(client):
    consumers = [
        client.subscribe(
            "t",
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        for _ in "ab"
    ]
    threads = [threading.Thread(target=c.receive, args=(30_000,)) for c in consumers]
    for t in threads:
        t.start()

    def stats() -> dict:
        return client.admin.topic_stats("t")["subscriptions"]["s"]

    deadline = time.monotonic() + 20
    while stats()["waiting"] != 2:
        assert time.monotonic() < deadline, stats()
        time.sleep(0.01)
    producer = client.create_producer("t")
    producer.send(b"1")
    producer.send(b"2")
    for t in threads:
        t.join(20)
        assert not t.is_alive()
    assert stats()["waiting"] == 0
    assert stats()["consumers"] == 2
