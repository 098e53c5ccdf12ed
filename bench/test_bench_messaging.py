"""pytest-benchmark: produce, consume and scan through the embedded broker (sync=False)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import pulsartxn


@pytest.fixture
def client(tmp_path):
    broker = pulsartxn.Broker(tmp_path / "d", sync=False)
    yield broker.client()
    broker.close()


@pytest.fixture(scope="module")
def values():
    return [os.urandom(100) for _ in range(100_000)]


def test_send_batch_arrow(benchmark, client, values):
    producer = client.create_producer("t")
    data = pa.array(values, pa.binary())
    benchmark.extra_info["items"] = len(values)
    assert benchmark(producer.send_batch, data) == len(values)


def test_send_async_per_message(benchmark, client, values):
    producer = client.create_producer("t")
    data = values[:20_000]

    def run():
        for v in data:
            producer.send_async(v)
        producer.flush()

    benchmark.extra_info["items"] = len(data)
    benchmark(run)


def test_scan(benchmark, client, values):
    client.create_producer("t").send_batch(values)
    benchmark.extra_info["items"] = len(values)
    assert benchmark(lambda: sum(b.num_rows for b in client.scan("t"))) == len(values)


def test_receive_acknowledge(benchmark, client, values):
    producer = client.create_producer("t")
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)

    def setup():
        producer.send_batch(values[:5000])
        return (), {}

    def run():
        for _ in range(5000):
            consumer.acknowledge(consumer.receive(1000))

    benchmark.pedantic(run, setup=setup, rounds=5)
