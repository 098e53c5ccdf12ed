"""A program written with pulsar-client's spellings only, run on pulsartxn unchanged.

``run()`` is what a Pulsar user writes from memory: ``import pulsar`` becomes ``import
pulsartxn as pulsar`` and nothing else changes (callback second in ``send_async``,
``consumer_type=``, ``message_listener=``, the producer options, ``receive(timeout_millis=)``,
``get_topic_partitions``). It is also the program the tests type-check with mypy.

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
N = 10


def run(service_url: str) -> dict[str, list[str]]:
    """Send N orders asynchronously, audit them with a listener, report them with receive()."""
    client = pulsar.Client(service_url)
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
    partitions = client.get_topic_partitions(TOPIC)
    audit.close()
    report.close()
    producer.close()
    client.close()
    return {
        "sent": [str(len(sent))],
        "audited": sorted(audited),
        "reported": reported,
        "partitions": partitions,
    }


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
