"""The native per-partition producer and its twin store the same messages, answer the same ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pulsartxn
from pulsartxn._native import load
from pulsartxn.messaging import producer as producer_module

NATIVE, REFERENCE = load("native"), load("reference")

sends = st.lists(
    st.tuples(
        st.binary(max_size=40),
        st.one_of(st.none(), st.sampled_from(["a", "b"])),
        st.one_of(st.none(), st.just({"p": "q"})),
        st.one_of(st.none(), st.integers(0, 30)),
        st.booleans(),  # flush after this one
    ),
    max_size=40,
)


def run(impl, tmp_path, workload, name):
    old = producer_module.PartitionProducer
    producer_module.PartitionProducer = impl.PartitionProducer
    try:
        with pulsartxn.Broker(tmp_path / name, sync=False) as broker:
            client = broker.client()
            p = client.create_producer(
                "t",
                producer_name="p",
                batching_max_messages=4,
                batching_max_publish_delay_ms=60_000,
            )
            assert type(p._parts[0]) is impl.PartitionProducer
            futures = []
            for value, key, props, seq, flush in workload:
                futures.append(
                    p.send_async(value, properties=props, partition_key=key, sequence_id=seq)
                )
                if flush:
                    p.flush()
            p.flush()
            ids = [(f.result().entry_id(), f.result().batch_index()) for f in futures]
            assert len(ids) == len(workload)
            stored = [
                (r["entry_id"], r["batch_index"], r["key"], r["value"], r["properties"])
                for b in client.scan("t")
                for r in b.to_pylist()
            ]
            return ids, stored, p.last_sequence_id()
    finally:
        producer_module.PartitionProducer = old


@settings(max_examples=25, deadline=None)
@given(sends)
def test_native_and_twin_producers_agree(tmp_path_factory, workload):
    tmp = tmp_path_factory.mktemp("prod")
    assert run(NATIVE, tmp, workload, "n") == run(REFERENCE, tmp, workload, "r")


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "reference"])
def test_duplicate_of_a_message_still_in_its_batch(impl, tmp_path):
    _, _, last = run(
        impl, tmp_path, [(b"a", None, None, 5, False), (b"a2", None, None, 5, False)], "d"
    )
    assert last == 5
