"""One client cannot hurt another through `pulsartxn serve`: what would exhaust or break the
store is refused before anything is written, and errors stay short and say nothing of where
the data lives."""

from __future__ import annotations

import struct

import lmdb
import pytest

import pulsartxn
from pulsartxn.errors import InvalidTopicName, QuotaExceeded, TopicNotFound
from pulsartxn.txn import log

HUGE = "x" * 1_000_000


def test_a_refused_scale_leaves_a_store_that_restarts(server):
    """Before: scale_coordinators(20000) saved the count, then ran out of named databases
    (and grew the server to 4.6 GB); the server never started again."""
    s = server()
    client = pulsartxn.Client(s.url)
    with pytest.raises(QuotaExceeded, match="max_dbs"):
        client.admin.scale_coordinators(20000)
    with pytest.raises(QuotaExceeded, match="max_coordinators_memory_bytes"):
        client.admin.scale_coordinators(4000)
    client.admin.scale_coordinators(20)
    client.close()
    s.stop()
    s.start()
    client = pulsartxn.Client(s.url)
    assert len(client.admin.coordinators()) == 20
    client.new_transaction(coordinator_id=19).commit()
    client.close()


def test_a_bricked_store_is_served(server, tmp_path):
    """A store that an older broker left with 20000 coordinators saved (its scale ran out of
    named databases, and every later start failed) is served with the coordinators it ran."""
    data = tmp_path / "data"
    pulsartxn.Broker(data, sync=False).close()
    env = lmdb.open(str(data), max_dbs=64)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(log.COORDINATORS_KEY, struct.pack("<I", 20000), db=meta)
    env.close()
    s = server()
    client = pulsartxn.Client(s.url)
    assert len(client.admin.coordinators()) == 16
    txn = client.new_transaction()
    client.create_producer("t").send(b"x", txn=txn)
    txn.commit()
    client.close()


def test_a_store_whose_coordinators_do_not_fit_is_served_with_max_dbs(server, tmp_path):
    """Coordinators that handed out TxnIDs are never dropped: a store holding more than the
    named databases allow refuses to start in one line naming --max-dbs, which serves it."""
    data = tmp_path / "data"
    pulsartxn.Broker(data, sync=False).close()
    env = lmdb.open(str(data), max_dbs=64)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(log.COORDINATORS_KEY, struct.pack("<I", 60), db=meta)
        for c in range(60):
            txn.put(log.hwm_key(c), (4096).to_bytes(16, "big"), db=meta)
    env.close()
    with pytest.raises(RuntimeError) as refused:
        server("--max-dbs", "64")
    lines = str(refused.value).split("server exited: ", 1)[1].strip().splitlines()
    assert len(lines) == 1 and "--max-dbs" in lines[0] and str(data) not in lines[0]
    s = server("--max-dbs", "128")
    client = pulsartxn.Client(s.url)
    assert len(client.admin.coordinators()) == 60
    client.new_transaction(coordinator_id=59).commit()
    client.close()


def test_a_partition_quota_through_a_server(server):
    """Before: a few create_topic(name, 4096) could take every named database of the store."""
    s = server()
    client = pulsartxn.Client(s.url)
    client.create_topic("a", 4096)
    client.create_topic("b", 4096)
    with pytest.raises(QuotaExceeded, match="max_partitions"):
        client.create_topic("c", 4096)
    client.create_producer("d").send(b"x")
    client.close()
    s.stop()
    s.start()
    client = pulsartxn.Client(s.url)
    with pytest.raises(TopicNotFound):
        client.topic_partitions("c")
    with pytest.raises(QuotaExceeded, match="max_partitions"):
        client.create_topic("c", 4096)
    client.create_topic("c", 16)
    client.close()


def test_names_are_checked_before_any_write_through_a_server(server):
    s = server()
    client = pulsartxn.Client(s.url)
    for call in (
        lambda: client.create_producer("t" * 483),
        lambda: client.create_topic("t" * 483, 4),
        lambda: client.subscribe(
            "t" * 483, "s", initial_position=pulsartxn.InitialPosition.Earliest
        ),
    ):
        with pytest.raises(InvalidTopicName):
            call()
    with pytest.raises(ValueError, match="subscription"):
        client.subscribe("u", "s" * 490, initial_position=pulsartxn.InitialPosition.Earliest)
    with pytest.raises(ValueError, match="producer"):
        client.create_producer("u", producer_name="p" * 490)
    for call in (
        lambda: client.create_producer(HUGE),
        lambda: client.subscribe("u", HUGE, initial_position=pulsartxn.InitialPosition.Earliest),
    ):
        with pytest.raises((ValueError, InvalidTopicName)) as raised:
            call()
        message = str(raised.value)
        assert len(message) < 400 and s.data_dir not in message
    client.close()
    s.stop()
    s.start()
    client = pulsartxn.Client(s.url)
    for topic in ("t" * 483, "u"):
        with pytest.raises((TopicNotFound, InvalidTopicName)):
            client.topic_partitions(topic)
    client.create_producer("u").send(b"fine")
    client.close()


def test_a_sequence_id_at_the_top_does_not_break_the_name_through_a_server(server):
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("t", producer_name="p", batching_enabled=False)
    with pytest.raises(ValueError, match="sequence_id"):
        producer.send(b"x", sequence_id=2**63 - 1)
    with pytest.raises(ValueError, match="sequence_id"):
        producer.send_async(b"x", sequence_id=2**62)
    producer.send(b"a")  # the same handle: the refused ids moved nothing
    client.close()
    s.stop()
    s.start()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("t", producer_name="p", batching_enabled=False)
    producer.send(b"b")
    values = [v for b in client.scan("t") for v in b.column("value").to_pylist()]
    assert values == [b"a", b"b"]
    client.close()


def test_a_request_with_unknown_or_bad_options_is_refused_with_an_excerpt(server):
    """A client other than ours may send any option map: unknown names and enum names that
    are no member are refused, echoed short, and nothing is created."""
    s = server()
    client = pulsartxn.Client(s.url)
    client.create_producer("t")
    for action, args in (
        ("create_producer", {"topic": "t", "options": {HUGE: 1}}),
        ("subscribe", {"topic": "t", "subscription": "s", "options": {"bogus": 1}}),
        ("subscribe", {"topic": "t", "subscription": "s", "options": [1]}),
    ):
        with pytest.raises(TypeError) as info:
            client._raw(action, args)
        assert len(str(info.value)) < 300
    for bad in (HUGE, 7, "Nope"):
        with pytest.raises(ValueError, match="subscription_type must name a ConsumerType"):
            client._raw(
                "subscribe",
                {"topic": "t", "subscription": "s", "options": {"subscription_type": bad}},
            )
    assert client.admin.topic_stats("t")["subscriptions"] == {}
    client.close()


def test_an_end_with_a_bad_timeout_on_the_wire_is_refused_and_changes_nothing(server):
    """Another client's end may carry any timeout_ms: one that is no number of 0..2^40 ms is
    a ValueError from the broker, and the transaction stays OPEN."""
    s = server()
    client = pulsartxn.Client(s.url)
    txn = client.new_transaction()
    client.create_producer("t", batching_enabled=False).send(b"v", txn=txn)
    for bad in ("5", True, -1, 1e30, [1]):
        with pytest.raises(ValueError, match="timeout_ms must be a number"):
            client._raw("end", {"txn": str(txn.id), "commit": True, "timeout_ms": bad})
        assert txn.state is pulsartxn.TxnState.OPEN
    txn.commit()
    assert [v for b in client.scan("t") for v in b.column("value").to_pylist()] == [b"v"]
    client.close()


def test_a_consumer_keeps_its_name_across_a_server_restart(server):
    """The name the server gave a consumer (or the one asked for) is the one it subscribes
    under again when the client reconnects after a restart."""
    s = server()
    client = pulsartxn.Client(s.url)
    for _ in range(2):  # a restarted server counts its names from 0 again
        client.subscribe("t", "other", initial_position=pulsartxn.InitialPosition.Earliest).close()
    given = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    asked = client.subscribe(
        "t", "s2", consumer_name="mine", initial_position=pulsartxn.InitialPosition.Earliest
    )
    name = given.consumer_name()
    assert name.startswith("consumer-") and asked.consumer_name() == "mine"
    s.kill9()
    s.start()
    client.create_producer("t").send(b"after")  # reconnects the session
    assert given.receive(10_000).data() == b"after"  # re-subscribed
    assert given.consumer_name() == name and asked.consumer_name() == "mine"
    client.close()


def test_every_call_refuses_an_argument_it_does_not_take(server):
    """Unknown arguments are errors on the wire too: every action, the bulk stream's
    command, the dispatch and scan streams and a send's messages refuse a key they do not
    take before anything runs (a typo such as 'timeout' for 'timeout_ms' began a
    transaction with the default timeout)."""
    import pyarrow as pa
    import pyarrow.flight as flight

    from pulsartxn.server import protocol
    from pulsartxn.server.protocol import frame

    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("t")
    producer.send(b"one")
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    session = client._session
    raw = flight.FlightClient(f"grpc://127.0.0.1:{s.port}")
    created = client.admin.coordinator_stats(0)["created"]
    served = set(dict(raw.list_actions()))
    assert served <= set(protocol.ACTION_ARGS)  # every one has its table
    for action in sorted(served):
        body = frame({"session": session, "bogus": 1})
        with pytest.raises(flight.FlightError, match=f"{action}: unknown argument 'bogus'"):
            list(raw.do_action(flight.Action(action, body)))
    typo = frame({"session": session, "timeout": 100})
    with pytest.raises(flight.FlightError, match="unknown argument 'timeout'"):
        list(raw.do_action(flight.Action("new_transaction", typo)))
    message = frame(
        {"session": session, "handle": producer._ensure(), "messages": [{"n": 1, "prop": {}}]},
        b"x",
    )
    with pytest.raises(flight.FlightError, match="send_many message: unknown argument 'prop'"):
        list(raw.do_action(flight.Action("send_many", message)))
    command = frame({"session": session, "handle": producer._ensure(), "txns": None})
    batch = pa.RecordBatch.from_arrays([pa.array([b"x"])], names=["value"])
    writer, reader = raw.do_put(flight.FlightDescriptor.for_command(command), batch.schema)
    with pytest.raises(flight.FlightError, match="unknown argument 'txns'"):
        writer.write_batch(batch)
        writer.done_writing()
        reader.read()
        writer.close()
    for ticket in (
        {"session": session, "op": "scan", "topic": "t", "limit": 1},
        {"session": session, "op": "receive", "handle": consumer._ensure(), "timeout": 1},
    ):
        with pytest.raises(flight.FlightError, match="unknown argument"):
            raw.do_get(flight.Ticket(frame(ticket))).read_all()
    assert client.admin.coordinator_stats(0)["created"] == created
    assert client.admin.topic_stats("t")["messages"] == 1
    producer.send(b"two")  # the client's own calls take only what their tables name
    assert [m.data() for m in (consumer.receive(5000), consumer.receive(5000))] == [
        b"one",
        b"two",
    ]
    client.close()
