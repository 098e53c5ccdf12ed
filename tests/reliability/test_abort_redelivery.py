"""Messages whose transactional acks were aborted are delivered again, whatever the order of
the aborts (found by the 64-thread load test: a message read ahead but not yet delivered was
dropped when a later abort restarted reading above it)."""

from __future__ import annotations

import pulsartxn


def test_abort_above_a_read_ahead_message_keeps_it(tmp_path):
    with pulsartxn.Broker(tmp_path / "data", sync=False) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        for i in range(10):
            producer.send(b"m%d" % i)
        consumer = client.subscribe(
            "t",
            "s",
            subscription_type=pulsartxn.ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        first = [consumer.receive(timeout_millis=2000) for _ in range(5)]  # m0..m4
        assert [m.data() for m in first] == [b"m%d" % i for i in range(5)]
        t1, t2 = client.new_transaction(), client.new_transaction()
        consumer.acknowledge(first[4], txn=t1)
        consumer.acknowledge(first[1], txn=t2)
        consumer.acknowledge(first[2], txn=t2)
        consumer.acknowledge(first[0])
        consumer.acknowledge(first[3])
        t2.abort()  # m1 and m2 are to be delivered again: reading restarts at m1
        again = consumer.receive(timeout_millis=2000)
        assert again.data() == b"m1" and again.redelivery_count() == 1
        consumer.acknowledge(again)
        t1.abort()  # m4 too: reading restarts at m4, but m2 was read ahead and not delivered
        rest = []
        while True:
            try:
                msg = consumer.receive(timeout_millis=300)
            except pulsartxn.Timeout:
                break
            rest.append(msg.data())
            consumer.acknowledge(msg)
        assert sorted(rest) == [b"m2", b"m4", b"m5", b"m6", b"m7", b"m8", b"m9"]
