"""A program written with pulsar-client's spellings only, run on pulsartxn unchanged.

``run()`` is what a Pulsar user writes from memory: ``import pulsar`` becomes ``import
pulsartxn as pulsar`` and nothing else changes (callback second in ``send_async``,
``consumer_type=``, ``message_listener=``, the producer options, ``receive(timeout_millis=)``,
``get_topic_partitions``, ``seek``, Key_Shared, a dead letter policy, a reader from
``MessageId.earliest``, ``ordering_key``, ``event_timestamp`` and
``operation_timeout_seconds``). It is also the program the tests type-check with mypy.

Try it (without a URL it starts a broker and its network service on 127.0.0.1)::

    python examples/pulsar_client_style.py [pulsartxn://host:port]
"""

from __future__ import annotations

import sys
import tempfile
import threading
from typing import Any

import pulsartxn as pulsar

TOPIC = "persistent://public/default/orders"
PAYMENTS = "persistent://public/default/payments"
DLQ = "persistent://public/default/payments-rejected"
N = 10


def run(service_url: str) -> dict[str, list[str]]:
    """Send N orders asynchronously, audit them with a listener, report them with receive()."""
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    producer = client.create_producer(
        TOPIC,
        send_timeout_millis=30_000,
        block_if_queue_full=True,
        max_pending_messages=1000,
        compression_type=pulsar.CompressionType.NONE,
        batching_type=pulsar.BatchingType.Default,
    )
    audited: list[str] = []
    all_audited = threading.Event()

    def on_message(consumer: Any, msg: pulsar.Message) -> None:
        audited.append(msg.data().decode())
        consumer.acknowledge(msg)
        if len(audited) == N:
            all_audited.set()

    audit = client.subscribe(
        TOPIC,
        "audit",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        message_listener=on_message,
    )
    report = client.subscribe(TOPIC, "report", initial_position=pulsar.InitialPosition.Earliest)

    sent: list[pulsar.MessageId] = []

    def on_sent(res: Any, msg_id: pulsar.MessageId | None) -> None:
        if res == pulsar.Result.Ok and msg_id is not None:
            sent.append(msg_id)

    for i in range(N):
        producer.send_async(f"order-{i}".encode(), on_sent, properties={"n": str(i)})
    producer.flush()

    reported: list[str] = []
    while len(reported) < N:
        msg = report.receive(timeout_millis=10_000)
        reported.append(msg.data().decode())
        report.acknowledge(msg)
    all_audited.wait(10)
    # Back to the start: the report subscription sees its first order again.
    report.seek(pulsar.MessageId.earliest)
    first_again = report.receive(timeout_millis=10_000).data().decode()
    partitions = client.get_topic_partitions(TOPIC)
    audit.close()
    report.close()
    producer.close()
    keyed, rejected = payments(client)
    client.close()
    return {
        "sent": [str(len(sent))],
        "audited": sorted(audited),
        "reported": reported,
        "first_again": [first_again],
        "partitions": partitions,
        "keyed": keyed,
        "rejected": rejected,
    }


def payments(client: pulsar.Client) -> tuple[list[str], list[str]]:
    """Key_Shared workers (each customer's payments in order on one of them), and a strict
    subscription whose rejected payment goes to a dead letter topic, read back by a reader."""
    producer = client.create_producer(PAYMENTS)
    workers = [
        client.subscribe(
            PAYMENTS,
            "workers",
            consumer_type=pulsar.ConsumerType.KeyShared,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        for _ in range(2)
    ]
    strict = client.subscribe(
        PAYMENTS,
        "strict",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        negative_ack_redelivery_delay_ms=0,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, dead_letter_topic=DLQ
        ),
    )
    for i in range(N):
        producer.send(
            f"payment-{i}".encode(),
            ordering_key=f"customer-{i % 3}",
            event_timestamp=1_700_000_000_000 + i,
        )
    keyed: dict[str, list[int]] = {}
    while sum(len(v) for v in keyed.values()) < N:
        for worker in workers:
            try:
                msg = worker.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            keyed.setdefault(msg.ordering_key() or "", []).append(msg.event_timestamp())
            worker.acknowledge(msg)
    accepted = 0
    while accepted < N - 1:
        msg = strict.receive(timeout_millis=10_000)
        if msg.data() == b"payment-0":
            strict.negative_acknowledge(msg)  # rejected: redelivered once, then dead-lettered
        else:
            strict.acknowledge(msg)
            accepted += 1
    reader = client.create_reader(DLQ, pulsar.MessageId.earliest)
    rejected = [reader.read_next(timeout_millis=10_000).data().decode()]
    reader.close()
    for c in (*workers, strict):
        c.close()
    producer.close()
    in_order = [k for k, stamps in sorted(keyed.items()) if stamps == sorted(stamps)]
    return in_order, rejected


def _local_service() -> tuple[str, Any]:
    """A broker and its network service on 127.0.0.1 (what a Pulsar user runs apart)."""
    from pulsartxn.server.service import BrokerServer

    broker = pulsar.Broker(tempfile.mkdtemp(prefix="pulsartxn-example-"))
    server = BrokerServer(broker, "127.0.0.1", 0)
    return f"pulsartxn://127.0.0.1:{server.port}", (broker, server)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(run(sys.argv[1]))
    else:
        url, (broker, server) = _local_service()
        try:
            print(run(url))
        finally:
            server.shutdown_sessions()
            server.shutdown()
            broker.close()
