"""Exactly-once consume-process-produce: the "Function" of Pulsar's transaction design.

A processor reads sensor readings from two input topics, ``sensor-a`` and ``sensor-b``, takes
them in windows of W readings, sums the readings of each room in the window, produces one
aggregate per room to ``aggregates`` and acknowledges every reading of the window - all in ONE
transaction per window. Without a transaction, a processor that fails between producing and
acknowledging (or half way through the acknowledgements) would see some readings again and
count them twice. With one, a window either happened completely (its aggregates are visible
and its readings are acknowledged) or not at all (its aggregates are discarded and its readings
come back to be processed again).

Each reading carries a unique id (property ``id``, e.g. ``a-17``) and each aggregate names the
ids it covers, so anyone can check that every reading is counted exactly once::

    {"room": "room-2", "inputs": ["a-3", "b-3", "a-9"], "count": 3, "sum": 151, "window": "4:2"}

Try it::

    python examples/consume_process_produce.py --data-dir /tmp/cpp --seed-inputs 1000 \\
        --window 50 --abort-probability 0.2

Kill it at any moment (even with ``kill -9``) and run the same command again: it carries on
where the last committed window ended and nothing is processed twice. ``--seed-inputs N`` is
idempotent too: the seeder's messages carry sequence ids, which the broker de-duplicates, so a
re-run never adds readings that are already there.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict

import pulsartxn

INPUTS = ("sensor-a", "sensor-b")
OUTPUT = "aggregates"
SUBSCRIPTION = "aggregator"
# Every window's transaction carries this label, so that a restarted processor can abort the
# transaction a crashed run left open (instead of waiting for that transaction's timeout).
TXN_GROUP = "aggregator"
ROOMS = 4


class SimulatedFailure(Exception):
    """Raised in the middle of a window when --abort-probability says the processor fails."""


def reading(i: int) -> tuple[str, str, str, int]:
    """Input number i (deterministic, so that a re-run seeds exactly the same readings):
    (topic, id, room, value). Even numbers go to sensor-a, odd ones to sensor-b."""
    topic = INPUTS[i % 2]
    seq = i // 2
    return topic, f"{topic[-1]}-{seq}", f"room-{i * 7 % ROOMS}", (i * 37) % 100


def seed_inputs(client: pulsartxn.Client, n: int) -> None:
    """Make sure readings 0..n-1 are on the input topics (plain, non-transactional sends)."""
    producers = {
        topic: client.create_producer(topic, producer_name=f"seeder-{topic}") for topic in INPUTS
    }
    futures = []
    for i in range(n):
        topic, reading_id, room, value = reading(i)
        # sequence_id: a message the broker already stored under (producer_name, sequence_id)
        # is not stored again, so a seeder killed half way can simply start over.
        futures.append(
            producers[topic].send_async(
                str(value).encode(),
                properties={"id": reading_id},
                partition_key=room,
                sequence_id=i // 2,
            )
        )
    for producer in producers.values():
        producer.flush()
    for future in futures:
        future.result()  # durable
    for producer in producers.values():
        producer.close()


def take_window(consumers, size: int, idle_ms: int) -> list:
    """Up to `size` (consumer, message) pairs, taken in turn from the inputs. An input that
    stays empty for idle_ms is left out for the rest of the window; [] means both are drained."""
    window: list = []
    active = list(consumers)
    while active and len(window) < size:
        for consumer in list(active):
            if len(window) == size:
                break
            try:
                window.append((consumer, consumer.receive(idle_ms)))
            except pulsartxn.Timeout:
                active.remove(consumer)
    return window


def aggregate(window: list) -> list[dict]:
    """One aggregate per room: the ids of its readings in the window, their count and sum."""
    rooms: dict = defaultdict(lambda: {"inputs": [], "count": 0, "sum": 0})
    for _, msg in window:
        room = rooms[msg.partition_key()]
        room["inputs"].append(msg.properties()["id"])
        room["count"] += 1
        room["sum"] += int(msg.data())
    return [{"room": name, **room} for name, room in sorted(rooms.items())]


def process_window(client, producer, window: list, fail: bool) -> tuple[str, int]:
    """Produce the window's aggregates and acknowledge its inputs in one transaction.

    Returns (transaction id, number of aggregates). Raises SimulatedFailure (after the
    transaction was aborted) when `fail` is set.
    """
    # The context manager commits on a normal exit and aborts on an exception.
    with client.new_transaction(timeout_ms=30_000, group=TXN_GROUP) as txn:
        results = aggregate(window)
        for result in results:
            result["window"] = str(txn.id)
            producer.send_async(json.dumps(result).encode(), partition_key=result["room"], txn=txn)
        for n, (consumer, msg) in enumerate(window):
            if fail and n == len(window) // 2:
                # The seeds' failure: results produced, only some inputs acknowledged.
                raise SimulatedFailure(f"processor failed in window {txn.id}")
            consumer.acknowledge(msg, txn=txn)
    return str(txn.id), len(results)


def covered_inputs(client) -> tuple[int, int]:
    """(committed aggregates, input ids they cover), read back read-committed."""
    aggregates = inputs = 0
    for batch in client.scan(OUTPUT):
        for value in batch.column("value").to_pylist():
            aggregates += 1
            inputs += len(json.loads(value)["inputs"])
    return aggregates, inputs


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="the broker's LMDB data directory")
    parser.add_argument("--window", type=int, default=20, help="input messages per transaction")
    parser.add_argument(
        "--seed-inputs",
        type=int,
        default=0,
        metavar="N",
        help="first make sure readings 0..N-1 are on the inputs (idempotent)",
    )
    parser.add_argument(
        "--abort-probability",
        type=float,
        default=0.0,
        metavar="P",
        help="fail (abort) a window half way with probability P; its inputs come back",
    )
    parser.add_argument("--random-seed", type=int, default=None, help="for the failures")
    parser.add_argument(
        "--idle-ms",
        type=int,
        default=200,
        help="an input with nothing to deliver for this long counts as drained",
    )
    args = parser.parse_args(argv)
    if args.window < 1 or args.seed_inputs < 0 or not 0 <= args.abort_probability < 1:
        parser.error("need --window >= 1, --seed-inputs >= 0 and 0 <= --abort-probability < 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.random_seed)
    with pulsartxn.Broker(args.data_dir, sync=True) as broker:
        client = broker.client()
        if args.seed_inputs:
            seed_inputs(client, args.seed_inputs)
            print(f"seeded: readings 0..{args.seed_inputs - 1} on {', '.join(INPUTS)}", flush=True)

        # A run that died mid-window left its transaction open, holding its inputs (pending
        # acks) and its aggregates (invisible to read-committed readers). The broker aborted
        # it when it recovered (an in-process client's transactions die with its process):
        # the inputs come back, the aggregates are discarded. A window whose commit was
        # already decided was completed. (On Pulsar the transaction's timeout does this, later.)
        coordinators = range(len(broker.admin.coordinators()))
        orphans = sum(broker.admin.coordinator_stats(c)["recovered_orphaned"] for c in coordinators)
        if orphans:
            print(f"recovered: aborted {orphans} open transaction(s)", flush=True)

        consumers = [
            client.subscribe(
                topic,
                SUBSCRIPTION,
                subscription_type=pulsartxn.ConsumerType.Exclusive,
                initial_position=pulsartxn.InitialPosition.Earliest,
            )
            for topic in INPUTS
        ]
        producer = client.create_producer(OUTPUT)
        committed = aborted = processed = 0
        while window := take_window(consumers, args.window, args.idle_ms):
            fail = rng.random() < args.abort_probability
            try:
                txn_id, n_results = process_window(client, producer, window, fail)
            except SimulatedFailure:
                # The transaction was aborted: the inputs it acknowledged are released and
                # redelivered. The ones not acknowledged yet are still held by the consumers,
                # as received; give them back too (a real processor would restart instead).
                for consumer in consumers:
                    consumer.redeliver_unacknowledged_messages()
                aborted += 1
                print(f"window aborted: its {len(window)} inputs will be redelivered", flush=True)
                continue
            committed += 1
            processed += len(window)
            print(
                f"window {txn_id} committed: {len(window)} inputs -> {n_results} aggregates",
                flush=True,
            )

        n_aggregates, n_inputs = covered_inputs(client)
        print(
            f"drained: {committed} windows committed and {aborted} aborted in this run "
            f"({processed} inputs); '{OUTPUT}' holds {n_aggregates} aggregates covering "
            f"{n_inputs} inputs",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
