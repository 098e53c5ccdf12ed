"""Dead letter policy, broker-side: a message redelivered max_redeliver_count times goes to its
dead letter topic at the next redelivery, stored there and acknowledged on its subscription in
one write (a SIGKILL in the middle neither loses nor doubles it); transactions holding it
keep it, and a transactional ack of a dead-lettered message conflicts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import pulsartxn
from pulsartxn import ConsumerType, DeadLetterPolicy, InitialPosition
from tests.helpers import drain

EARLIEST = InitialPosition.Earliest
DLQ = "persistent://public/default/t-s-DLQ"


def subscribe(client, policy, name="s", topic="t", **kwargs):
    kwargs.setdefault("subscription_type", ConsumerType.Shared)
    return client.subscribe(
        topic,
        name,
        initial_position=EARLIEST,
        negative_ack_redelivery_delay_ms=0,
        dead_letter_policy=policy,
        **kwargs,
    )


def nack_until_gone(consumer, timeout_ms=300) -> dict:
    """Receive and nack until nothing comes: data -> the redelivery counts it came with."""
    seen: dict = {}
    while True:
        try:
            m = consumer.receive(timeout_ms)
        except pulsartxn.Timeout:
            return seen
        seen.setdefault(m.data(), []).append(m.redelivery_count())
        consumer.negative_acknowledge(m)


def dead_letters(client, topic=DLQ, name="dlq-reader") -> list:
    c = client.subscribe(topic, name, initial_position=EARLIEST)
    try:
        return drain(c, 500)
    finally:
        c.close()


def test_moved_after_max_redeliveries_with_content_and_properties(client):
    p = client.create_producer("t")
    for i in range(5):
        p.send(b"m%d" % i, properties={"a": str(i)}, partition_key=f"k{i}")
    c = subscribe(client, DeadLetterPolicy(max_redeliver_count=3))
    seen = nack_until_gone(c)
    assert seen == {b"m%d" % i: [0, 1, 2, 3] for i in range(5)}  # then to the DLQ
    moved = dead_letters(client)
    assert [m.data() for m in moved] == [b"m%d" % i for i in range(5)]
    for i, m in enumerate(moved):
        props = m.properties()
        assert props["a"] == str(i) and props["REAL_TOPIC"] == "persistent://public/default/t"
        assert "ORIGIN_MESSAGE_ID" in props
        assert m.partition_key() == f"k{i}"
    c.close()
    assert drain(subscribe(client, None)) == []  # acknowledged on the original


def test_named_topic_and_initial_subscription_made_before_the_first_message(client):
    p = client.create_producer("t")
    p.send(b"x")
    policy = DeadLetterPolicy(1, dead_letter_topic="my-dlq", initial_subscription_name="keep")
    c = subscribe(client, policy)
    assert nack_until_gone(c) == {b"x": [0, 1]}
    # "keep" was made before the message landed: it holds it (a later subscription would not)
    late = client.subscribe("my-dlq", "late", initial_position=InitialPosition.Latest)
    assert drain(late) == []
    keep = client.subscribe("my-dlq", "keep")
    assert [m.data() for m in drain(keep)] == [b"x"]


def test_acked_messages_are_not_moved_and_others_go_on(client):
    p = client.create_producer("t")
    for i in range(4):
        p.send(b"%d" % i)
    c = subscribe(client, DeadLetterPolicy(1))
    msgs = [c.receive(1000) for _ in range(4)]
    for m in msgs[:2]:
        c.acknowledge(m)
    for m in msgs[2:]:
        c.negative_acknowledge(m)
    again = [c.receive(1000) for _ in range(2)]
    assert [m.redelivery_count() for m in again] == [1, 1]
    c.negative_acknowledge(again[0])
    c.acknowledge(again[1])
    with pytest.raises(pulsartxn.Timeout):
        c.receive(300)
    assert [m.data() for m in dead_letters(client)] == [b"2"]


def test_batched_message_moved_alone(client):
    p = client.create_producer("t", batching_enabled=True, batching_max_publish_delay_ms=50)
    futs = [p.send_async(b"%d" % i, None) for i in range(4)]
    p.flush()
    ids = [f.result() for f in futs]
    assert {i.entry_id() for i in ids} == {ids[0].entry_id()} and ids[0].batch_size() == 4
    c = subscribe(client, DeadLetterPolicy(1))
    msgs = [c.receive(1000) for _ in range(4)]
    c.negative_acknowledge(msgs[1])
    for m in (msgs[0], msgs[2], msgs[3]):
        c.acknowledge(m)
    again = c.receive(1000)
    assert again.data() == b"1" and again.redelivery_count() == 1
    c.negative_acknowledge(again)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(300)
    assert [m.data() for m in dead_letters(client)] == [b"1"]
    c.close()
    assert drain(subscribe(client, None)) == []


def test_a_transaction_holding_the_message_keeps_it_and_its_abort_counts(client):
    client.create_producer("t").send(b"x")
    c = subscribe(client, DeadLetterPolicy(1))
    m = c.receive(1000)
    c.negative_acknowledge(m)
    m = c.receive(1000)
    assert m.redelivery_count() == 1
    txn = client.new_transaction()
    c.acknowledge(m, txn)  # held: neither delivered nor moved while it is
    c.redeliver_unacknowledged_messages()
    with pytest.raises(pulsartxn.Timeout):
        c.receive(300)
    assert dead_letters(client) == []
    txn.abort()  # redeliverable, its count increased: past the policy, so moved
    with pytest.raises(pulsartxn.Timeout):
        c.receive(500)
    assert [d.data() for d in dead_letters(client)] == [b"x"]


def test_a_transactional_ack_of_a_dead_lettered_message_conflicts(client):
    client.create_producer("t").send(b"x")
    c = subscribe(client, DeadLetterPolicy(1))
    first = c.receive(1000)
    c.negative_acknowledge(first)
    second = c.receive(1000)
    c.negative_acknowledge(second)
    with pytest.raises(pulsartxn.Timeout):
        c.receive(300)
    assert len(dead_letters(client)) == 1
    txn = client.new_transaction()
    with pytest.raises(pulsartxn.TransactionConflict):
        c.acknowledge(second, txn)
    with pytest.raises(pulsartxn.PulsarTxnError):
        txn.commit()  # a conflict leaves the transaction abort-only


def test_committed_transactional_ack_is_final(client):
    client.create_producer("t").send(b"x")
    c = subscribe(client, DeadLetterPolicy(1))
    m = c.receive(1000)
    c.negative_acknowledge(m)
    m = c.receive(1000)
    txn = client.new_transaction()
    c.acknowledge(m, txn)
    txn.commit()
    c.redeliver_unacknowledged_messages()
    with pytest.raises(pulsartxn.Timeout):
        c.receive(300)
    assert dead_letters(client) == []


def test_pulsar_clients_name_for_the_policy(client):
    assert pulsartxn.ConsumerDeadLetterPolicy is DeadLetterPolicy
    client.create_producer("t").send(b"x")
    c = subscribe(client, pulsartxn.ConsumerDeadLetterPolicy(max_redeliver_count=1))
    assert nack_until_gone(c) == {b"x": [0, 1]}
    assert len(dead_letters(client)) == 1


def test_bad_policies_are_refused(client):
    for bad in (0, -1, True, "3", None):
        with pytest.raises(ValueError, match="max_redeliver_count"):
            DeadLetterPolicy(bad)
    with pytest.raises(ValueError, match="dead_letter_topic"):
        DeadLetterPolicy(1, dead_letter_topic="")
    with pytest.raises(TypeError, match="DeadLetterPolicy"):
        subscribe(client, {"max_redeliver_count": 1})


def test_key_shared_moves_too(client):
    p = client.create_producer("t")
    for i in range(6):
        p.send(b"%d" % i, partition_key=f"k{i}")
    a = subscribe(client, DeadLetterPolicy(2), subscription_type=ConsumerType.KeyShared)
    b = subscribe(client, DeadLetterPolicy(2), subscription_type=ConsumerType.KeyShared)
    seen: dict = {}
    for _ in range(4):
        for c in (a, b):
            for data, counts in nack_until_gone(c, 100).items():
                seen.setdefault(data, []).extend(counts)
    assert seen == {b"%d" % i: [0, 1, 2] for i in range(6)}
    assert sorted(m.data() for m in dead_letters(client)) == [b"%d" % i for i in range(6)]


CHILD = r"""
import sys
import pulsartxn
from pulsartxn import ConsumerType, DeadLetterPolicy, InitialPosition
broker = pulsartxn.Broker(sys.argv[1], sync=True)
client = broker.client()
c = client.subscribe("t", "s", subscription_type=ConsumerType.Shared,
                     initial_position=InitialPosition.Earliest,
                     negative_ack_redelivery_delay_ms=0,
                     dead_letter_policy=DeadLetterPolicy(1, initial_subscription_name="dlq"))
print("ready", flush=True)
# Announces the first move that landed: the parent's kill then finds moves under way.
probe = client.subscribe(sys.argv[2], "probe", initial_position=InitialPosition.Earliest)
announced = False
while True:
    try:
        c.negative_acknowledge(c.receive(1000))
    except pulsartxn.Timeout:
        pass
    if not announced and probe.has_message_available():
        print("moving", flush=True)
        announced = True
"""


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.3])
def test_a_sigkill_during_moves_neither_loses_nor_doubles(tmp_path, delay):
    data = str(tmp_path / "data")
    n = 3000
    with pulsartxn.Broker(data, sync=True) as b:
        b.client().create_producer("t").send_batch([b"%d" % i for i in range(n)])
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, str(script), data, DLQ], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert proc.stdout.readline().strip() == "moving"
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with pulsartxn.Broker(data, sync=True) as b:
        client = b.client()
        left = [m.data() for m in drain(client.subscribe("t", "s"), 500)]
        moved = [m.data() for m in drain(client.subscribe(DLQ, "dlq"), 500)]
    assert len(moved) == len(set(moved))
    assert not set(moved) & set(left)
    assert sorted(moved + left, key=int) == [b"%d" % i for i in range(n)]
    assert 0 < len(moved) < n  # killed with moves under way


def test_a_dead_letter_topic_that_cannot_be_made_is_refused_up_front(client):
    with pytest.raises(pulsartxn.InvalidTopicName):
        subscribe(client, DeadLetterPolicy(1, dead_letter_topic="bad://x/y/z"))


def test_a_move_that_cannot_be_made_leaves_the_message_where_it_was(tmp_path):
    with pulsartxn.Broker(tmp_path / "d", sync=False, max_topics=1) as b:
        client = b.client()
        client.create_producer("t").send(b"x")
        c = subscribe(client, DeadLetterPolicy(1))
        c.negative_acknowledge(c.receive(1000))
        c.negative_acknowledge(c.receive(1000))
        with pytest.raises(pulsartxn.QuotaExceeded):
            c.receive(1000)  # the dead letter topic would be a second topic
        plain = subscribe(client, None)  # the same Shared subscription, no policy
        again = plain.receive(1000)
        assert again.data() == b"x" and again.redelivery_count() == 2
        plain.acknowledge(again)
        c.close()
        plain.close()
        assert drain(subscribe(client, None)) == []


def test_concurrent_consumers_move_each_message_once(client):
    import threading

    n = 200
    client.create_producer("t").send_batch([b"%d" % i for i in range(n)])
    consumers = [subscribe(client, DeadLetterPolicy(2)) for _ in range(3)]
    seen: dict = {}
    lock = threading.Lock()

    def run(c):
        while True:
            msgs = c.batch_receive(16, 300)
            if not msgs:
                return
            with lock:
                for m in msgs:
                    seen.setdefault(m.data(), []).append(m.redelivery_count())
            for m in msgs:
                c.negative_acknowledge(m)

    threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {k: sorted(v) for k, v in seen.items()} == {b"%d" % i: [0, 1, 2] for i in range(n)}
    moved = [m.data() for m in dead_letters(client)]
    assert sorted(moved, key=int) == [b"%d" % i for i in range(n)]
