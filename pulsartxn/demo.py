"""The main job on the embedded default: an exactly-once consume-process-produce pipeline.

Orders arrive on a partitioned topic; a processor takes them in windows and, for each window,
in ONE transaction: produces one total per customer to the ``totals`` topic and acknowledges
every order of the window. Every fifth window is aborted as if the processor had failed half
way: its totals never become visible and its orders come back (redelivered) to be processed
again. At the end every order is covered by exactly one committed total, which the job checks
by reading ``totals`` back read-committed. The data directory is kept: a second run adds new
orders and checks everything ever written.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pulsartxn

ORDERS, TOTALS, SUBSCRIPTION = "demo-orders", "demo-totals", "demo-processor"


def run_demo(
    data_dir: str,
    orders: int = 20_000,
    window: int = 500,
    customers: int = 50,
    sync: bool = True,
) -> list[str]:
    if orders < 0 or window < 1 or customers < 1:
        raise ValueError("orders must be >= 0, window and customers >= 1")
    with pulsartxn.Broker(data_dir, sync=sync) as broker:
        try:
            broker.topic_partitions(ORDERS)
        except pulsartxn.TopicNotFound:
            broker.create_topic(ORDERS, partitions=4)
        client = broker.client()
        processor = client.subscribe(
            ORDERS,
            SUBSCRIPTION,
            subscription_type=pulsartxn.ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        first_id = broker.admin.topic_stats(ORDERS)["messages"]
        start = time.perf_counter()
        _seed(client, first_id, orders, customers)
        seed_s = time.perf_counter() - start
        start = time.perf_counter()
        committed, aborted, processed = _process(client, processor, window)
        process_s = time.perf_counter() - start
        total_orders = broker.admin.topic_stats(ORDERS)["messages"]
        check = _check(client, total_orders)
        stats = [
            broker.admin.coordinator_stats(c["coordinator_id"]) for c in broker.admin.coordinators()
        ]
        buffer = broker.admin.transaction_buffer_stats(TOTALS)
    lines = [
        f"pulsartxn demo ({pulsartxn.IMPLEMENTATION} core, sync={sync}) on {data_dir}",
        f"seeded {orders} orders in {seed_s * 1000:.0f} ms (bulk send_batch, keyed by customer)",
        f"processed {processed} orders in windows of {window}: {committed} transactions "
        f"committed, {aborted} aborted and retried; {processed / max(process_s, 1e-9):,.0f} "
        f"orders/s through receive + transactional produce + transactional ack + commit",
        f"coordinators: {sum(s['committed'] for s in stats)} committed, "
        f"{sum(s['aborted'] for s in stats)} aborted this run; totals topic: max read "
        f"position {buffer['max_read_position']}, {buffer['ongoing_txn_size']} open "
        "transactions",
        check,
    ]
    if not check.startswith("check: ok"):
        raise SystemExit("\n".join(lines))
    return lines


def _seed(client, first_id: int, n: int, customers: int) -> None:
    if n == 0:
        return
    producer = client.create_producer(ORDERS)
    ids = range(first_id, first_id + n)
    values = [json.dumps({"order": i, "amount": i % 97 + 1}).encode() for i in ids]
    keys = [f"customer-{i % customers}" for i in ids]
    producer.send_batch(values, keys=keys)
    producer.close()


def _process(client, processor, window: int) -> tuple[int, int, int]:
    producer = client.create_producer(TOTALS)
    committed = aborted = processed = 0
    while True:
        msgs = processor.batch_receive(window, 200)
        if not msgs:
            break
        with client.new_transaction() as txn:
            totals: dict = defaultdict(lambda: {"orders": [], "amount": 0})
            for m in msgs:
                order = json.loads(m.data())
                total = totals[m.partition_key()]
                total["orders"].append(order["order"])
                total["amount"] += order["amount"]
            for customer, total in sorted(totals.items()):
                producer.send_async(
                    json.dumps({"customer": customer, **total}).encode(),
                    partition_key=customer,
                    txn=txn,
                )
            for m in msgs:
                processor.acknowledge(m, txn=txn)
            if (committed + aborted) % 5 == 4:
                txn.abort()  # the processor "fails": nothing of this window happened
                aborted += 1
                continue
        committed += 1
        processed += len(msgs)
    producer.close()
    return committed, aborted, processed


def _check(client, total_orders: int) -> str:
    seen: dict[int, int] = defaultdict(int)
    for batch in client.scan(TOTALS):
        for value in batch.column("value").to_pylist():
            total = json.loads(value)
            for order in total["orders"]:
                seen[order] += 1
    twice = [o for o, n in seen.items() if n > 1]
    missing = total_orders - len(seen)
    if twice or missing:
        return f"check FAILED: {missing} orders without a total, {len(twice)} counted twice"
    return f"check: ok, each of the {total_orders} orders ever written is in exactly one total"
