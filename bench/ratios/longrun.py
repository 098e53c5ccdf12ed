"""Steady state: does an operation cost the same after thousands of others as before them?

Each row times the same operation late in a run against early in the same run (or with much
more held against little), so the ratio is 1.0x when the cost does not grow with what piles up,
and falls below when it does (sync=False, to see the CPU):

a. send + commit of one message per transaction while one long transaction holds its
   coordinator's low watermark back: the last 5,000 of 20,000 against the first 5,000;
b. a Shared consumer acknowledging in transactions of 10 while one message stays
   unacknowledged in front (the cursor keeps every later ack individually): the last quarter
   of 40,000 messages against the first;
c. one acknowledgement + commit with 10,000 messages in flight (received, unacknowledged,
   redelivered once so that each has a redelivery count) against 10 in flight;
d. commits of transactions holding one acknowledgement each, 5,000 open at once against 100.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pulsartxn
from pulsartxn import ConsumerType

from ._harness import Row

TARGET = 0.8


def _broker(tmp: str, name: str):
    return pulsartxn.Broker(os.path.join(tmp, name), sync=False, num_coordinators=1)


def _behind_a_long_transaction(tmp: str, n: int) -> Row:
    with _broker(tmp, "long") as broker:
        client = broker.client()
        producer = client.create_producer("t")
        long = client.new_transaction(timeout_ms=3_600_000)
        producer.send(b"long", txn=long)
        quarters = []
        for _ in range(4):
            start = time.perf_counter()
            for _ in range(n // 4):
                txn = client.new_transaction()
                producer.send(b"x" * 100, txn=txn)
                txn.commit()
            quarters.append(time.perf_counter() - start)
        long.commit()
    return Row(
        f"send + commit, 1 msg/txn, behind one long open txn: last {n // 4} of {n}",
        n // 4,
        "txns",
        quarters[-1],
        quarters[0],
        f"the first {n // 4}, same run",
        TARGET,
    )


def _behind_an_unacked_message(tmp: str, n: int) -> Row:
    with _broker(tmp, "unacked") as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        for _ in range(n + 1):
            producer.send_async(b"x" * 10)
        producer.flush()
        consumer = client.subscribe(
            "t",
            "s",
            subscription_type=ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        consumer.receive()  # never acknowledged
        quarters = []
        for _ in range(4):
            start = time.perf_counter()
            for _ in range(n // 40):
                msgs = consumer.batch_receive(10, 1000)
                txn = client.new_transaction()
                for m in msgs:
                    consumer.acknowledge(m, txn=txn)
                txn.commit()
            quarters.append(time.perf_counter() - start)
    return Row(
        f"ack in txns of 10 + commit, Shared, 1 msg unacked in front: last {n // 4} of {n}",
        n // 4,
        "msgs",
        quarters[-1],
        quarters[0],
        f"the first {n // 4}, same run",
        TARGET,
    )


def _ack_commit(client, consumer, msgs) -> float:
    start = time.perf_counter()
    for m in msgs:
        txn = client.new_transaction()
        consumer.acknowledge(m, txn=txn)
        txn.commit()
    return time.perf_counter() - start


def _in_flight(tmp: str, many: int, timed_acks: int) -> Row:
    def run(in_flight: int, name: str) -> float:
        with _broker(tmp, name) as broker:
            client = broker.client()
            client.create_producer("t").send_batch([b"x" * 10] * (in_flight + timed_acks))
            consumer = client.subscribe(
                "t",
                "s",
                subscription_type=ConsumerType.Shared,
                receiver_queue_size=in_flight + timed_acks,
                initial_position=pulsartxn.InitialPosition.Earliest,
            )
            consumer.batch_receive(in_flight + timed_acks, 1000)
            consumer.redeliver_unacknowledged_messages()  # each one now has a count too
            msgs = consumer.batch_receive(in_flight + timed_acks, 1000)
            return _ack_commit(client, consumer, msgs[:timed_acks])

    few = run(10, "few")
    lots = run(many, "many")
    return Row(
        f"ack + commit with {many:,} msgs in flight, redelivered once",
        timed_acks,
        "txns",
        lots,
        few,
        "10 in flight, same run",
        TARGET,
    )


def _open_transactions(tmp: str, many: int) -> Row:
    def run(open_txns: int, name: str) -> float:
        with _broker(tmp, name) as broker:
            client = broker.client()
            client.create_producer("t").send_batch([b"x" * 10] * open_txns)
            consumer = client.subscribe(
                "t",
                "s",
                subscription_type=ConsumerType.Shared,
                receiver_queue_size=open_txns,
                initial_position=pulsartxn.InitialPosition.Earliest,
            )
            txns = []
            for m in consumer.batch_receive(open_txns, 1000):
                txn = client.new_transaction()
                consumer.acknowledge(m, txn=txn)
                txns.append(txn)
            start = time.perf_counter()
            for txn in txns:
                txn.commit()
            return (time.perf_counter() - start) / open_txns

    few = run(100, "few-txns")
    lots = run(many, "many-txns")
    return Row(
        f"commit, each txn holding 1 ack, {many:,} open at once",
        1,
        "txns",
        lots,
        few,
        "100 open at once, same run",
        TARGET,
    )


def measure(quick: bool = False) -> list[Row]:
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-longrun-")
    try:
        return [
            _behind_a_long_transaction(tmp, 4000 if quick else 20_000),
            _behind_an_unacked_message(tmp, 8000 if quick else 40_000),
            _in_flight(tmp, 10_000, 500 if quick else 2000),
            _open_transactions(tmp, 1000 if quick else 5000),
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
