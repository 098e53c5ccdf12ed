"""The network service as a real process on 127.0.0.1 and the remote client against it."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import pulsartxn
from pulsartxn import ConsumerType, TxnID, TxnState
from pulsartxn.errors import (
    InvalidTxnStatus,
    PulsarTxnError,
    Timeout,
    TransactionConflict,
    TransactionNotFound,
    TransactionTimeout,
)
from pulsartxn.messaging import once
from pulsartxn.remote.calls import HeldNumbers
from pulsartxn.server.protocol import frame
from tests.helpers import LosingProxy, answer_lost, drain, in_thread, scanned, wait_for


def test_produce_consume_and_transactions_remotely(server):
    s = server()
    client = pulsartxn.Client(s.url)
    client.create_topic("t", 2)
    assert len(client.topic_partitions("t")) == 2
    producer = client.create_producer("t")
    producer.send(b"plain", partition_key="k")
    futures = [producer.send_async(b"a%d" % i) for i in range(50)]
    producer.flush()
    assert all(f.done() and f.exception() is None for f in futures)
    assert producer.send_batch(pa.array([b"x", b"y"], pa.binary())) == 2
    consumer = _consumer(client, ConsumerType.Shared)
    got = drain(consumer)
    assert len(got) == 53
    txn = client.new_transaction()
    producer.send(b"in-txn", txn=txn)
    producer.send_batch([b"bulk-txn"], txn=txn)
    for m in got:
        consumer.acknowledge(m, txn=txn)
    assert drain(consumer, 100) == []
    assert not any(v == b"in-txn" for b in client.scan("t") for v in b.column("value").to_pylist())
    with pytest.raises(TransactionConflict):
        consumer.acknowledge(got[0], txn=client.new_transaction())
    txn.commit()
    assert txn.state is TxnState.COMMITTED
    assert sorted(m.data() for m in drain(consumer)) == [b"bulk-txn", b"in-txn"]
    with pytest.raises(InvalidTxnStatus):
        txn.commit()
    with pytest.raises(TransactionNotFound):
        client.transaction(TxnID(0, 424242))
    assert client.admin.topic_stats("t")["messages"] == 55
    assert client.admin.coordinator_stats(txn.id.coordinator_id)["committed"] >= 1
    client.close()


def test_wrong_token_is_refused(server, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    s = server("--token-file", str(token_file))
    with pytest.raises(PulsarTxnError, match="authentication"):
        pulsartxn.Client(s.url, token="wrong")
    with pytest.raises(PulsarTxnError, match="authentication"):
        pulsartxn.Client(s.url)
    client = pulsartxn.Client(s.url, token="s3cret")
    client.create_producer("t").send(b"ok")
    client.close()


def test_garbage_and_oversized_requests_change_nothing(server):
    s = server("--max-request-bytes", "4096")
    raw = flight.FlightClient(f"grpc://127.0.0.1:{s.port}")
    for body in (b"", b"\xff\xff\xff\xff", b"\x05\x00\x00\x00{nope", frame({"x": 1}) * 3):
        with pytest.raises(flight.FlightError):
            list(raw.do_action(flight.Action("send_many", body)))
    with pytest.raises(flight.FlightError, match="unknown action"):
        list(raw.do_action(flight.Action("drop_everything", frame({}))))
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("t")
    with pytest.raises(ValueError, match="exceeds the limit"):
        producer.send(b"x" * 10_000)
    with pytest.raises(pulsartxn.InvalidTopicName):
        client.create_producer("persistent://bad/name")
    producer.send(b"small")
    # A bulk batch whose metadata is no first sequence id is refused, and nothing is stored.
    command = frame({"handle": producer._ensure(), "session": client._session})
    batch = pa.RecordBatch.from_arrays([pa.array([b"x"])], names=["value"])
    for meta in (b"{nope", b'{"first_sequence": -1}', b'{"first_sequence": "1"}', b"7" * 100):
        writer, reader = raw.do_put(flight.FlightDescriptor.for_command(command), batch.schema)
        with pytest.raises(flight.FlightError, match="sequence|metadata"):
            writer.write_with_metadata(batch, pa.py_buffer(meta))
            writer.done_writing()
            reader.read()
            writer.close()  # where the broker's answer (its error) is raised
    assert client.admin.topic_stats("t")["messages"] == 1
    # Columns other than 'value' and 'key' (an extra one, a misspelt 'keys', a missing
    # 'value', a doubled one) are refused before anything of the stream is stored.
    for cols, names in (
        ([pa.array([b"x"]), pa.array([b"y"])], ["value", "extra"]),
        ([pa.array([b"x"]), pa.array(["k"])], ["value", "keys"]),
        ([pa.array(["k"])], ["key"]),
        ([pa.array([b"x"]), pa.array([b"y"])], ["value", "value"]),
    ):
        batch = pa.RecordBatch.from_arrays(cols, names=names)
        writer, reader = raw.do_put(flight.FlightDescriptor.for_command(command), batch.schema)
        with pytest.raises(flight.FlightError, match="columns"):
            writer.write_with_metadata(batch, pa.py_buffer(b'{"first_sequence": 100}'))
            writer.done_writing()
            reader.read()
            writer.close()
    assert client.admin.topic_stats("t")["messages"] == 1
    client.close()


def test_a_send_batch_streams_in_slices_under_the_request_limit(server):
    """A send_batch larger than the request limit goes out in slices of about 8 MiB, each
    checked on arrival; a batch that is itself past the limit is refused, nothing stored."""
    s = server("--max-request-bytes", str(16 << 20))
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("t")
    values = [bytes([i % 251]) * (i % 97 + (1 << 20) * (i % 5 == 0)) for i in range(200)]
    txn = client.new_transaction()
    assert producer.send_batch(values, txn=txn) == 200  # 40 MiB: past 16 MiB, in slices
    txn.commit()
    assert scanned(client, "t") == values
    big = pa.RecordBatch.from_arrays([pa.array([b"x" * (17 << 20)], pa.binary())], ["value"])
    stream = producer.batch_stream()
    with pytest.raises(ValueError, match="exceeds the limit"):
        stream.write(big.column(0))
        stream.close()
    assert client.admin.topic_stats("t")["messages"] == 200
    client.close()


def test_disconnected_client_messages_are_redelivered(server):
    s = server("--session-timeout-s", "1")
    a = pulsartxn.Client(s.url)
    a.create_producer("t").send(b"m")
    ca = a.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    assert ca.receive(1000).data() == b"m"
    open_txn = a.new_transaction(timeout_ms=60_000)
    grouped = a.new_transaction(timeout_ms=60_000, group="job")
    shared = a.new_transaction(timeout_ms=60_000)
    b = pulsartxn.Client(s.url)
    assert b.transaction(shared.id).state is TxnState.OPEN  # B holds it too, by its id
    # A goes silent without closing (as a crashed process would).
    a._stop.set()
    cb = b.subscribe(
        "t",
        "s",
        subscription_type=ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    deadline = time.monotonic() + 10
    got = None
    while got is None and time.monotonic() < deadline:
        try:
            got = cb.receive(200)
        except Timeout:
            pass
    assert got is not None and got.data() == b"m" and got.redelivery_count() == 1
    # What only A held is aborted with its session (nobody could end it); a group's belongs
    # to its decision, and one that B holds lives on with B.
    live = lambda: {t["txn_id"] for t in b.admin.slow_transactions(0)}  # noqa: E731
    deadline = time.monotonic() + 10
    while str(open_txn.id) in live():
        assert time.monotonic() < deadline, "the expired session's transaction is still open"
        time.sleep(0.02)
    assert live() == {str(grouped.id), str(shared.id)}
    b.transaction(shared.id).commit()
    b.abort_group("job")
    b.close()
    a._flight.close()  # A's connection goes with its process (the server's stop waited for it)


def test_transactions_of_a_session_that_does_not_come_back_are_aborted(server):
    """A server killed -9 keeps its sessions' transactions: a client that comes back within
    the session timeout goes on (see above); one that does not has its transactions aborted
    then, but those of a group; the rows of its once-calls are dropped then too."""
    s = server("--session-timeout-s", "1")
    a = pulsartxn.Client(s.url)
    producer = a.create_producer("t")
    a.admin.create_subscription("t", "made")  # a row of a's once-calls (messaging/once.py)
    gone = a.new_transaction(timeout_ms=600_000)
    producer.send(b"gone", txn=gone)
    grouped = a.new_transaction(timeout_ms=600_000, group="job")
    producer.send(b"grouped", txn=grouped)
    a._stop.set()  # never calls again
    s.kill9()
    s.start()
    b = pulsartxn.Client(s.url)
    live = lambda: {t["txn_id"] for t in b.admin.slow_transactions(0)}  # noqa: E731
    assert live() == {str(gone.id), str(grouped.id)}  # recovered
    deadline = time.monotonic() + 15
    while str(gone.id) in live():
        assert time.monotonic() < deadline, "the orphaned transaction is still open"
        time.sleep(0.05)
    assert live() == {str(grouped.id)}
    b.commit_group("job", [grouped.id])
    values = [v for batch in b.scan("t") for v in batch.column("value").to_pylist()]
    assert values == [b"grouped"]
    b.close()
    assert s.stop() == 0
    with pulsartxn.Broker(s.data_dir) as broker:  # a's rows went with its session
        assert once.owners(broker.storage) == set()


def test_server_killed_mid_transaction_client_carries_on(server):
    s = server()
    client = pulsartxn.Client(s.url, reconnect_timeout_s=30)
    producer = client.create_producer("t", producer_name="p1")
    producer.send(b"before")
    txn = client.new_transaction(timeout_ms=120_000)
    producer.send(b"in-txn", txn=txn)
    s.kill9()
    s.start()  # same data directory, same port
    producer.send(b"after")  # reconnects, re-creates the producer under its name
    txn.commit()  # the transaction survived in the coordinator's log
    values = sorted(v for b in client.scan("t") for v in b.column("value").to_pylist())
    assert values == [b"after", b"before", b"in-txn"]
    # A re-sent message (same producer name and sequence id) is stored once.
    again = client.create_producer("t", producer_name="p2")
    again.send(b"once", sequence_id=7)
    again.send(b"once", sequence_id=7)
    values = [v for b in client.scan("t") for v in b.column("value").to_pylist()]
    assert values.count(b"once") == 1
    client.close()


@pytest.mark.parametrize("partitions", [0, 2], ids=["topic", "partitioned"])
def test_queued_sends_refused_at_a_timeout_stay_on_record_across_a_kill(server, partitions):
    """A remote producer's sends still queued when their transaction timed out: the broker
    refuses them at the flush and writes their sequence ids as never written before it answers.
    Killed -9 right after, it still has that row, so after the restart a resend is stored
    anew, though a later sequence id was stored on the same partition before the kill."""
    s = server()
    client = pulsartxn.Client(s.url, reconnect_timeout_s=30)
    if partitions:
        client.create_topic("t", partitions)
    options = {"batching_max_messages": 100, "batching_max_publish_delay_ms": 60_000}
    p = client.create_producer("t", producer_name="p", **options)
    keys = [f"k{i}" for i in range(8)]
    t1 = client.new_transaction(timeout_ms=50)
    waiting = [
        p.send_async(b"w%d" % i, sequence_id=i, txn=t1, partition_key=key)
        for i, key in enumerate(keys)
    ]
    wait_for(lambda: t1.state.value == "TIMEOUT", what="the timeout")
    p.flush()  # the broker refuses them (the failure is the futures')
    assert all(isinstance(f.exception(timeout=5), TransactionTimeout) for f in waiting)
    later = [p.send(b"later", sequence_id=100 + i, partition_key=key) for i, key in enumerate(keys)]
    assert len({m.partition() for m in later}) == max(partitions, 1)
    s.kill9()
    s.start()
    client.close()
    client = pulsartxn.Client(s.url)
    p = client.create_producer("t", producer_name="p")
    for i, key in enumerate(keys):
        retry = p.send(b"w%d-retry" % i, sequence_id=i, partition_key=key)
        assert retry.entry_id() > later[i].entry_id()  # stored anew, after "later"
        assert retry.partition() == later[i].partition()
        assert p.send(b"again", sequence_id=i, partition_key=key) == retry
    assert scanned(client, "t", sort=True) == sorted(
        [b"later"] * len(keys) + [b"w%d-retry" % i for i in range(len(keys))]
    )
    client.close()


def test_sigterm_closes_cleanly(server):
    s = server()
    client = pulsartxn.Client(s.url)
    client.create_producer("t").send(b"kept")
    client.close()
    assert s.stop() == 0
    with pulsartxn.Broker(s.data_dir) as broker:
        assert broker.admin.topic_stats("t")["messages"] == 1


def test_batch_stream_sends_many_batches_in_one_transaction(server):
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("bs")
    txn = client.new_transaction()
    with producer.batch_stream(txn) as stream:
        for i in range(5):
            stream.write(pa.array([b"%d-%d" % (i, j) for j in range(100)], pa.binary()))
    assert stream.count == stream.close() == 500  # closed on leaving the block
    before = client.scan("bs")
    assert sum(b.num_rows for b in before) == 0  # not committed yet
    txn.commit()
    values = [v for b in client.scan("bs") for v in b.column("value").to_pylist()]
    assert values == [b"%d-%d" % (i, j) for i in range(5) for j in range(100)]  # in order
    stream = producer.batch_stream()
    stream.write(pa.array([b"a"], pa.binary()), pa.array(["k"], pa.string()))
    with pytest.raises(ValueError, match="differs"):
        stream.write(pa.array([b"b"], pa.binary()))  # the first batch fixed the schema
    assert stream.close() == 1
    done = client.new_transaction()
    done.abort()
    with pytest.raises(InvalidTxnStatus):
        with producer.batch_stream(done) as stream:
            stream.write(pa.array([b"late"], pa.binary()))
    client.close()


def test_a_commit_closes_its_open_batch_streams_first(server):
    """A transaction committed while a batch stream of it is open: the stream is closed
    first, so every batch written before the commit is in it (its last one was lost: the
    commit raced it and the stream's close then failed on the ended transaction)."""
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("open-stream")
    for round_ in range(10):  # the race it had was lost in some rounds only
        txn = client.new_transaction()
        stream = producer.batch_stream(txn)
        stream.write(pa.array([b"%d-a" % round_, b"%d-b" % round_], pa.binary()))
        stream.write(pa.array([b"%d-c" % round_], pa.binary()))
        if round_ % 2:
            txn.commit()
        else:
            with txn:
                pass  # the block's commit closes it the same way
        assert txn.state is TxnState.COMMITTED
        assert stream.close() == stream.count == 3  # closed already: its count
        with pytest.raises(pulsartxn.AlreadyClosed, match="closed by its transaction's commit"):
            stream.write(pa.array([b"late"], pa.binary()))
    values = [v for b in client.scan("open-stream") for v in b.column("value").to_pylist()]
    assert values == [b"%d-%s" % (r, c) for r in range(10) for c in (b"a", b"b", b"c")]
    # One that cannot be closed fails its transaction: the commit aborts it and raises.
    txn = client.new_transaction()
    stream = producer.batch_stream(txn)
    stream.write(pa.array([b"x"], pa.binary()))
    client.transaction(txn.id, capability=txn.capability).abort()  # ended elsewhere
    with pytest.raises(InvalidTxnStatus):
        txn.commit()
    client.close()


def test_a_commit_closes_the_streams_of_its_transaction_whatever_opened_them(server):
    """Every open batch stream of the client's that names the transaction is closed by its
    commit first: one opened with the bare TxnID, one through another handle, and those of a
    commit_all or commit_group naming it by handle or by id (all of it is then in it)."""
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("any-stream")
    group = "streams"
    for end in ("commit", "other-handle", "commit_all-id", "commit_group-id"):
        txn = client.new_transaction(group=group if end == "commit_group-id" else None)
        other = client.transaction(txn.id, capability=txn.capability)
        by_id = producer.batch_stream(txn.id)
        by_other = producer.batch_stream(other)
        by_id.write(pa.array([b"%s-id" % end.encode()], pa.binary()))
        by_other.write(pa.array([b"%s-other" % end.encode()], pa.binary()))
        if end == "commit":
            txn.commit()
        elif end == "other-handle":
            other.commit()
        elif end == "commit_all-id":
            client.commit_all([txn.id])
        else:
            client.commit_group(group, [txn.id])
        assert txn.state is TxnState.COMMITTED
        assert by_id.close() == by_other.close() == 1  # closed already: their counts
        with pytest.raises(pulsartxn.AlreadyClosed, match="closed by its transaction's commit"):
            by_id.write(pa.array([b"late"], pa.binary()))
    values = sorted(v for b in client.scan("any-stream") for v in b.column("value").to_pylist())
    assert values == sorted(
        b"%s-%s" % (e, w)
        for e in (b"commit", b"other-handle", b"commit_all-id", b"commit_group-id")
        for w in (b"id", b"other")
    )
    client.close()


def test_a_closed_or_cancelled_stream_takes_no_more(server):
    """A stream's close ends it: a later write raises AlreadyClosed (it does not open a new
    stream), and close() again is its count. A cancelled one (its with block raised) too."""
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("closed-stream")
    stream = producer.batch_stream()
    stream.write(pa.array([b"a", b"b"], pa.binary()))
    assert stream.close() == 2
    with pytest.raises(pulsartxn.AlreadyClosed, match="this batch stream is closed"):
        stream.write(pa.array([b"late"], pa.binary()))
    assert stream.close() == 2
    with pytest.raises(RuntimeError, match="user's"):
        with producer.batch_stream() as cancelled:
            cancelled.write(pa.array([b"c"], pa.binary()))
            raise RuntimeError("the user's")
    with pytest.raises(pulsartxn.AlreadyClosed, match="this batch stream is closed"):
        cancelled.write(pa.array([b"late"], pa.binary()))
    never = producer.batch_stream()
    assert never.close() == 0
    with pytest.raises(pulsartxn.AlreadyClosed, match="this batch stream is closed"):
        never.write(pa.array([b"late"], pa.binary()))
    values = [v for b in client.scan("closed-stream") for v in b.column("value").to_pylist()]
    assert values == [b"a", b"b", b"c"]  # a cancelled plain stream keeps what it wrote
    client.close()


def test_a_stream_of_another_client_is_refused_after_the_commit(server):
    """A batch stream another client (another process's session) opened on the transaction
    is that client's: the commit here neither waits for it nor closes it. What it stored
    before the decision is in the transaction; its batches after it are refused as late (at
    the latest by its close), and nothing of them is stored."""
    s = server()
    owner = pulsartxn.Client(s.url)
    other = pulsartxn.Client(s.url)
    txn = owner.new_transaction()
    handle = other.transaction(txn.id, capability=txn.capability)
    producer = other.create_producer("foreign-stream")
    with producer.batch_stream(handle) as stored:
        stored.write(pa.array([b"before"], pa.binary()))
    late = producer.batch_stream(handle)
    txn.commit()
    with pytest.raises((InvalidTxnStatus, TransactionNotFound)) as refused:
        late.write(pa.array([b"after"], pa.binary()))
        late.close()
    assert f"transaction {txn.id} has ended" in str(refused.value)
    with pytest.raises(pulsartxn.AlreadyClosed, match=f"transaction {txn.id} has ended"):
        late.write(pa.array([b"again"], pa.binary()))
    values = [v for b in owner.scan("foreign-stream") for v in b.column("value").to_pylist()]
    assert values == [b"before"]
    other.close()
    owner.close()


def test_a_failed_stream_named_by_id_fails_its_transaction(server):
    """A stream of the transaction whose call failed (here the broker refused a batch past
    its request limit) fails the transaction for this client, whatever named it: what the
    broker holds of the stream is unknown, so a commit aborts it, and commit_all refuses it
    before deciding anything. The stream is over: its calls raise AlreadyClosed naming why."""
    s = server("--max-request-bytes", str(1 << 20))
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("failed-stream")
    big = pa.array([b"x" * (2 << 20)], pa.binary())
    for end in ("commit", "commit_all"):
        txn = client.new_transaction()
        stream = producer.batch_stream(txn.id)
        stream.write(pa.array([b"kept"], pa.binary()))
        with pytest.raises(ValueError, match="exceeds the limit"):
            stream.write(big)
            stream.close()
        with pytest.raises(pulsartxn.AlreadyClosed, match="call failed: batch_stream: "):
            stream.write(pa.array([b"more"], pa.binary()))
        with pytest.raises(pulsartxn.AlreadyClosed, match="call failed: batch_stream: "):
            stream.close()
        if end == "commit":
            with pytest.raises(InvalidTxnStatus, match="cannot commit.*batch_stream"):
                txn.commit()
            assert txn.state is TxnState.ABORTED
        else:
            with pytest.raises(InvalidTxnStatus, match="a bulk send of it failed"):
                client.commit_all([txn.id])
            assert txn.state is TxnState.OPEN  # nothing was decided
            txn.abort()
    assert client.admin.topic_stats("failed-stream")["messages"] >= 1  # stored, never read
    assert scanned(client, "failed-stream") == []
    client.close()


def test_a_producers_close_closes_its_open_streams_first(server):
    """Closing a producer, or its client, under an open batch stream stores what was written
    (as Pulsar's close waits for the sends before it); the stream is then over."""
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("closing")
    plain = producer.batch_stream()
    plain.write(pa.array([b"plain"], pa.binary()))
    txn = client.new_transaction()
    in_txn = producer.batch_stream(txn)
    in_txn.write(pa.array([b"in-txn"], pa.binary()))
    producer.close()
    assert plain.close() == in_txn.close() == 1
    with pytest.raises(pulsartxn.AlreadyClosed, match="closed by its producer's close"):
        plain.write(pa.array([b"late"], pa.binary()))
    txn.commit()
    other = client.create_producer("closing")
    stream = other.batch_stream()
    stream.write(pa.array([b"client-close"], pa.binary()))
    client.close()
    with pytest.raises(pulsartxn.AlreadyClosed):
        stream.write(pa.array([b"after"], pa.binary()))  # never went through
    reader = pulsartxn.Client(s.url)
    assert sorted(scanned(reader, "closing")) == [b"client-close", b"in-txn", b"plain"]
    reader.close()


def test_sends_of_every_kind_land_in_the_order_they_were_made(server):
    """send_async batches, a sync send, a send_batch and a batch stream from one producer,
    in and out of a transaction: each lands after everything sent before it (a sync send
    waits for the queued async ones to be answered first, each answered once durable)."""
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("ordered", batching_max_publish_delay_ms=200)
    expected = []
    for round_ in range(2):
        txn = client.new_transaction() if round_ else None
        tag = b"t" if txn else b"p"
        futures = [producer.send_async(tag + b"a%d" % i, txn=txn) for i in range(5)]
        producer.send(tag + b"sync", txn=txn)
        assert all(f.done() for f in futures)  # answered before the sync send went out
        producer.send_batch([tag + b"b0", tag + b"b1"], txn=txn)
        futures = [producer.send_async(tag + b"c%d" % i, txn=txn) for i in range(3)]
        with producer.batch_stream(txn) as stream:
            stream.write(pa.array([tag + b"s0"], pa.binary()))
        assert all(f.done() for f in futures)
        if txn is not None:
            producer.send_async(tag + b"last", txn=txn)
            txn.commit()  # the queued send lands before the end
        expected += [tag + b"a%d" % i for i in range(5)] + [tag + b"sync", tag + b"b0"]
        expected += [tag + b"b1"] + [tag + b"c%d" % i for i in range(3)] + [tag + b"s0"]
        expected += [tag + b"last"] if txn else []
    reader = client.create_reader("ordered", pulsartxn.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(2000).data())
    assert got == expected, repr(got)


def test_concurrent_batches_and_sends_each_keep_a_sequence_id_of_their_own(server):
    """A partitioned topic: send_batch calls and batch streams between sends and from
    another thread at once: every message is stored once (a batch's messages take ids the
    producer reserved, so none of them passes for a later send's duplicate)."""
    import threading

    s = server()
    client = pulsartxn.Client(s.url)
    client.create_topic("mixed", 3)
    producer = client.create_producer("mixed", batching_max_publish_delay_ms=5)
    sent = []

    def bulk(tag):
        for i in range(6):
            values = [b"%s%d-%d" % (tag, i, j) for j in range(250)]
            if i % 2:
                producer.send_batch(values)
            else:
                with producer.batch_stream() as stream:
                    stream.write(pa.array(values[:100], pa.binary()))
                    stream.write(pa.array(values[100:], pa.binary()))
            sent.extend(values)

    for i in range(30):  # in one thread, in turn
        producer.send(b"s%d" % i) if i % 10 == 0 else producer.send_async(b"s%d" % i)
        sent.append(b"s%d" % i)
    bulk(b"a")
    for i in range(30, 60):
        producer.send_async(b"s%d" % i)
        sent.append(b"s%d" % i)
    thread = threading.Thread(target=bulk, args=(b"b",))
    thread.start()
    for i in range(60, 400):  # and at once
        producer.send(b"s%d" % i) if i % 50 == 0 else producer.send_async(b"s%d" % i)
        sent.append(b"s%d" % i)
    thread.join()
    producer.flush()
    got = [v for b in client.scan("mixed") for v in b.column("value").to_pylist()]
    assert len(got) == len(sent) and sorted(got) == sorted(sent)


def test_sync_and_async_sends_from_two_threads_are_all_stored(server):
    """One thread's send() calls while another's send_async calls go on: each message is
    stored once. Sequence ids are taken when a call goes on the wire, one call at a time, so
    the broker never sees an id below one it has stored (it would take it for a duplicate)."""
    import threading

    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("two-threads", batching_max_publish_delay_ms=1)
    sync_values = [b"sync%d" % i for i in range(150)]

    def sync_sends():
        for v in sync_values:
            producer.send(v)

    thread = threading.Thread(target=sync_sends)
    thread.start()
    async_values = [b"async%d" % i for i in range(1500)]
    futures = [producer.send_async(v) for v in async_values]
    thread.join()
    producer.flush()
    assert all(f.result().entry_id() >= 0 for f in futures)
    got = [v for b in client.scan("two-threads") for v in b.column("value").to_pylist()]
    assert sorted(got) == sorted(sync_values + async_values)


def _exists(client, topic: str) -> bool:
    try:
        return len(client.topic_partitions(topic)) > 0
    except pulsartxn.TopicNotFound:
        return False


def test_a_create_topic_re_sent_after_its_answer_was_lost_succeeds(server):
    """The broker creates the topic and the connection drops before its answer: the client
    re-sends the call, which finds the topic it made (the call's id is kept with it) and
    succeeds. Any other create of it is TopicAlreadyExists; a bad id changes nothing."""
    s, proxy, client, _ = _losing(server)
    direct = pulsartxn.Client(s.url)
    proxy.hold_answers()
    call, got = in_thread(lambda: client.create_topic("lost-answer", 3))
    wait_for(lambda: _exists(direct, "lost-answer"), what="the broker created the topic")
    assert got == []
    proxy.cut()
    call.join(30)
    assert got == [None]  # created
    assert len(client.topic_partitions("lost-answer")) == 3
    for c in (direct, client):  # new calls: the topic exists
        with pytest.raises(pulsartxn.TopicAlreadyExists):
            c.create_topic("lost-answer", 3)
    raw = flight.FlightClient(f"grpc://127.0.0.1:{s.port}")
    for bad in (5, "", "x" * 65):
        args = {"session": direct._session, "topic": "bad-id", "partitions": 0, "create_id": bad}
        with pytest.raises(flight.FlightError, match="create_id"):
            list(raw.do_action(flight.Action("create_topic", frame(args))))
    assert not _exists(direct, "bad-id")
    client.close()
    direct.close()
    proxy.close()


def _losing(server, **options):
    """A served broker, a client of it through a LosingProxy, and a producer of 5 messages
    on topic "t"."""
    s = server()
    proxy = LosingProxy(("127.0.0.1", s.port))
    client = pulsartxn.Client(f"pulsartxn://127.0.0.1:{proxy.port}", **options)
    producer = client.create_producer("t", batching_enabled=False)
    return s, proxy, client, producer


def _consumer(client, kind):
    """A consumer of kind `kind` on subscription "s" of topic "t", from the earliest."""
    return client.subscribe(
        "t", "s", subscription_type=kind, initial_position=pulsartxn.InitialPosition.Earliest
    )


def test_a_transactional_send_batch_whose_answer_was_lost_makes_its_transaction_abort(server):
    """The broker stores a transaction's send_batch and the connection drops before its
    answer: the caller gets BrokerUnavailable, which cannot say whether the batch is in the
    transaction (a bulk send is not re-sent: a re-send takes new sequence ids). So the
    transaction can only abort, as Pulsar's whose send failed: its commit aborts it and
    raises, and none of the batch is ever read. A batch_stream cut the same way too."""
    s, proxy, client, producer = _losing(server)
    direct = pulsartxn.Client(s.url)
    reader = direct.create_reader("t", pulsartxn.MessageId.earliest)
    for stream in (False, True):
        txn = client.new_transaction()
        producer.send(b"before", txn=txn)

        def bulk(txn=txn, stream=stream):
            if not stream:
                return producer.send_batch([b"a", b"b", b"c"], txn=txn)
            with producer.batch_stream(txn) as out:
                out.write([b"a", b"b", b"c"])
            return out.count

        got = answer_lost([proxy], bulk)  # stored within its half second, the answer lost
        assert isinstance(got[0], pulsartxn.BrokerUnavailable), got
        with pytest.raises(pulsartxn.InvalidTxnStatus):
            txn.commit()
        assert txn.state == pulsartxn.TxnState.ABORTED
    producer.send(b"after")
    assert reader.read_next(5000).data() == b"after"  # nothing of either transaction
    client.close()
    direct.close()
    proxy.close()


def test_an_end_whose_answer_was_lost_across_a_broker_restart_is_answered(server):
    """The broker commits (or aborts) a transaction, the answer is lost, and the broker is
    killed before the end is re-sent: the restarted broker no longer holds the transaction,
    but it kept how the transaction ended, so the re-sent end succeeds (it was reported
    TransactionNotFound, and a caller that then redid its work wrote it twice)."""
    s, proxy, client, producer = _losing(server)
    for end, state in (
        ("commit", pulsartxn.TxnState.COMMITTED),
        ("abort", pulsartxn.TxnState.ABORTED),
    ):
        txn = client.new_transaction()
        producer.send(end.encode(), txn=txn)
        direct = pulsartxn.Client(s.url)
        proxy.hold_answers()
        call, got = in_thread(getattr(txn, end))
        wait_for(lambda d=direct, t=txn, st=state: d.transaction(t.id).state is st, what=end)
        direct.close()
        s.kill9()
        s.start()  # on its port: the relay reaches it
        proxy.cut()
        call.join(60)
        assert got == [None], got
        assert txn.state is state
        with pytest.raises(pulsartxn.InvalidTxnStatus, match=state.value):
            client.transaction(txn.id).commit()  # another end is still refused
    reader = client.create_reader("t", pulsartxn.MessageId.earliest)
    assert reader.read_next(5000).data() == b"commit"
    assert not reader.has_message_available()
    client.close()
    proxy.close()


def test_a_receive_whose_answer_was_lost_gets_the_same_message_again(server):
    """The broker hands m0 to the consumer and the answer is lost with the connection: the
    receive made again gets m0, not m1 (m0 would be held by nobody until the consumer
    closes, and a cumulative ack of m4 would acknowledge it unprocessed)."""
    s, proxy, client, producer = _losing(server)
    consumer = _consumer(client, ConsumerType.Exclusive)
    ids = [producer.send(b"m%d" % i) for i in range(5)]
    proxy.hold_answers()
    call, got = in_thread(lambda: consumer.receive(10_000))
    admin = pulsartxn.Client(s.url).admin
    wait_for(lambda: admin.topic_stats("t")["subscriptions"]["s"]["unacked"] == 1)
    proxy.cut()
    call.join(30)
    got += [consumer.receive(2000) for _ in range(4)]
    assert [m.data() for m in got] == [b"m%d" % i for i in range(5)]
    assert [m.message_id() for m in got] == ids
    consumer.acknowledge_cumulative(got[-1])
    stats = admin.topic_stats("t")["subscriptions"]["s"]
    assert (stats["backlog"], stats["unacked"]) == (0, 0)
    client.close()
    proxy.close()


def test_a_batch_receive_or_a_receive_that_got_no_answer_leaves_its_messages_to_the_next(
    server,
):
    """A batch_receive whose connection drops is re-sent and gets what it was given; one
    (or a receive) not answered within the operation timeout raises OperationTimedOut, and
    the next call gets what it was given, first and in order."""
    s, proxy, client, producer = _losing(server, operation_timeout_seconds=1)
    consumer = _consumer(client, ConsumerType.Failover)
    for i in range(5):
        producer.send(b"m%d" % i)
    admin = pulsartxn.Client(s.url).admin
    proxy.hold_answers()
    call, got = in_thread(lambda: consumer.batch_receive(2, 5000))
    wait_for(lambda: admin.topic_stats("t")["subscriptions"]["s"]["unacked"] == 2)
    proxy.cut()
    call.join(30)
    assert [m.data() for m in got[0]] == [b"m0", b"m1"]
    proxy.hold_answers()
    with pytest.raises(Timeout):
        consumer.batch_receive(1, 0)  # m2 is handed over; no answer within 1 s
    proxy.cut()
    assert [m.data() for m in consumer.batch_receive(2, 5000)] == [b"m2"]
    proxy.hold_answers()
    with pytest.raises(Timeout):
        consumer.receive(0)  # m3, likewise
    proxy.cut()
    rest = [consumer.receive(2000).data() for _ in range(2)]
    assert rest == [b"m3", b"m4"]
    client.close()
    proxy.close()


def test_a_lost_call_of_one_kind_gives_its_messages_to_a_call_of_another(server):
    """A receive not answered in time, then a batch_receive: the batch starts with what the
    receive was given (m0 was neither held by nobody nor overtaken by m1). A batch_receive
    lost, then receives: they return its messages first, in order, then the next ones. A
    reader's read_next lost, then read_many: m0 first. No message comes twice."""
    s, proxy, client, producer = _losing(server, operation_timeout_seconds=1)
    consumer = _consumer(client, ConsumerType.Exclusive)
    reader = client.create_reader("t", pulsartxn.MessageId.earliest)
    ids = [producer.send(b"m%d" % i) for i in range(7)]
    admin = pulsartxn.Client(s.url).admin
    proxy.hold_answers()
    with pytest.raises(Timeout):
        consumer.receive(0)  # m0 handed over, no answer
    proxy.cut()
    first = consumer.batch_receive(2, 2000)
    assert [m.message_id() for m in first] == ids[:1]  # what the lost receive was given
    proxy.hold_answers()
    with pytest.raises(Timeout):
        consumer.batch_receive(3, 0)  # m1, m2, m3 handed over, no answer
    proxy.cut()
    assert consumer.has_message_available()
    got = [consumer.receive(2000) for _ in range(6)]
    assert [m.message_id() for m in got] == ids[1:]
    with pytest.raises(Timeout):
        consumer.receive(300)
    consumer.acknowledge_cumulative(got[-1])
    stats = admin.topic_stats("t")["subscriptions"]["s"]
    assert (stats["backlog"], stats["unacked"]) == (0, 0)

    proxy.hold_answers()
    with pytest.raises(Timeout):
        reader.read_next(0)  # m0 read, no answer
    proxy.cut()
    assert [m.message_id() for m in reader._read_many(3)] == ids[:1]
    assert [m.message_id() for m in reader._read_many(10)] == ids[1:]
    client.close()
    proxy.close()


def test_a_redelivery_after_a_lost_receive_delivers_its_message_once(server):
    """A receive is not answered within the operation timeout (the broker handed m0 over);
    the consumer then asks for a redelivery of what it holds: m0 comes again once, from the
    redelivery, and the number of the lost call does not bring it a second time."""
    s, proxy, client, producer = _losing(server, operation_timeout_seconds=1)
    consumer = _consumer(client, ConsumerType.Exclusive)
    ids = [producer.send(b"m%d" % i) for i in range(3)]
    admin = pulsartxn.Client(s.url).admin
    proxy.hold_answers()
    with pytest.raises(Timeout):
        consumer.receive(0)  # m0 is handed over; no answer within 1 s
    proxy.cut()
    assert admin.topic_stats("t")["subscriptions"]["s"]["unacked"] == 1
    consumer.redeliver_unacknowledged_messages()
    got = [consumer.receive(2000) for _ in range(3)]
    assert [m.message_id() for m in got] == ids
    with pytest.raises(Timeout):
        consumer.receive(300)  # nothing more: m0 came once
    consumer.acknowledge_cumulative(got[-1])
    stats = admin.topic_stats("t")["subscriptions"]["s"]
    assert (stats["backlog"], stats["unacked"]) == (0, 0)
    client.close()
    proxy.close()


def test_a_receive_whose_answer_was_lost_across_a_broker_restart_gets_its_message(server):
    """The broker hands m0 over, its answer is lost, and the broker is killed before the
    call is made again: the restarted broker kept no answer, and the re-sent receive gets m0
    from the redelivery of what was unacknowledged (not m1), then m1 and m2 once each."""
    s, proxy, client, producer = _losing(server)
    consumer = _consumer(client, ConsumerType.Exclusive)
    ids = [producer.send(b"m%d" % i) for i in range(3)]
    direct = pulsartxn.Client(s.url)
    proxy.hold_answers()
    call, got = in_thread(lambda: consumer.receive(30_000))
    wait_for(lambda: direct.admin.topic_stats("t")["subscriptions"]["s"]["unacked"] == 1)
    direct.close()
    s.kill9()
    s.start()  # on its port: the relay reaches it
    proxy.cut()
    call.join(60)
    got += [consumer.receive(10_000) for _ in range(2)]
    assert [m.message_id() for m in got] == ids
    with pytest.raises(Timeout):
        consumer.receive(300)
    consumer.acknowledge_cumulative(got[-1])
    stats = client.admin.topic_stats("t")["subscriptions"]["s"]
    assert (stats["backlog"], stats["unacked"]) == (0, 0)
    client.close()
    proxy.close()


def test_a_read_whose_answer_was_lost_skips_nothing_and_a_seek_starts_anew(server):
    """A reader's read_next made again after its answer was lost gets the same message (a
    reader has no redelivery: it would be skipped); after a seek, what a lost call was
    given is not given again."""
    s, proxy, client, producer = _losing(server, operation_timeout_seconds=1)
    ids = [producer.send(b"m%d" % i) for i in range(5)]
    reader = client.create_reader("t", pulsartxn.MessageId.earliest)
    proxy.hold_answers()
    call, got = in_thread(lambda: reader.read_next(10_000))
    time.sleep(0.5)
    proxy.cut()
    call.join(30)
    assert [got[0].data(), reader.read_next(2000).data()] == [b"m0", b"m1"]
    proxy.hold_answers()
    with pytest.raises(Timeout):
        reader.read_next(0)  # m2, not answered
    proxy.cut()
    reader.seek(pulsartxn.MessageId.earliest)
    assert reader.read_next(2000).message_id() == ids[0]
    client.close()
    proxy.close()


def test_an_admin_skip_or_delete_re_sent_after_its_answer_was_lost_runs_once(server):
    """A skip of 2 whose answer was lost, re-sent, skips 2 (not 4: skipped messages count
    as consumed); a delete_subscription re-sent does not say its subscription is gone."""
    s, proxy, client, producer = _losing(server)
    client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest).close()
    client.subscribe("t", "gone").close()
    for i in range(5):
        producer.send(b"m%d" % i)
    direct = pulsartxn.Client(s.url).admin

    def backlog() -> int:
        return direct.topic_stats("t")["subscriptions"]["s"]["backlog"]

    proxy.hold_answers()
    call, got = in_thread(lambda: client.admin.skip("t", "s", 2))
    wait_for(lambda: backlog() == 3, what="the skip")
    proxy.cut()
    call.join(30)
    assert not isinstance(got[0], Exception), got
    assert backlog() == 3
    proxy.hold_answers()
    call, got = in_thread(lambda: client.admin.delete_subscription("t", "gone"))
    wait_for(lambda: "gone" not in direct.topic_stats("t")["subscriptions"], what="the delete")
    proxy.cut()
    call.join(30)
    assert got == [None]
    with pytest.raises(pulsartxn.SubscriptionNotFound):
        client.admin.delete_subscription("t", "gone")  # a new call: it is gone
    assert client.admin.skip("t", "s", 1) == 1 and backlog() == 2
    client.close()
    proxy.close()


@pytest.mark.parametrize("partitions", [0, 2], ids=["topic", "partitioned"])
def test_admin_calls_re_sent_across_a_broker_restart_take_effect_once(server, partitions):
    """A skip, a delete or a create of a subscription, a delete of a topic and an
    unsubscribe, each landed and then the broker killed -9 before its answer: the client
    re-sends it to the restarted broker (its memory of the call is gone), which finds what
    the call did written with its effect. A skip of 6 skips 6, not 10 (skipped messages
    count as consumed), over both partitions of a partitioned topic; the others say nothing
    is amiss. A closed session's rows go with it."""
    s, proxy, client, _ = _losing(server)
    direct = pulsartxn.Client(s.url)
    t = "pt" if partitions else "t2"
    if partitions:
        for topic in (t, "gone"):
            direct.create_topic(topic, partitions)
    producer = client.create_producer(t, batching_enabled=False)
    client.subscribe(t, "s", initial_position=pulsartxn.InitialPosition.Earliest).close()
    client.subscribe(t, "gone").close()
    for i in range(10):
        producer.send(b"m%d" % i, partition_key=f"k{i}")
    direct.create_producer("gone").send(b"x")
    direct.close()

    def stats(topic=t):
        c = pulsartxn.Client(s.url)
        try:
            return c.admin.topic_stats(topic)
        finally:
            c.close()

    def across_a_restart(fn, landed):
        proxy.hold_answers()
        call, got = in_thread(fn)
        wait_for(landed, what="the call's effect")
        s.kill9()
        s.start()  # on its port: the relay reaches it
        proxy.cut()
        call.join(60)
        return got[0]

    backlog = lambda: stats()["subscriptions"]["s"]["backlog"]  # noqa: E731
    assert across_a_restart(lambda: client.admin.skip(t, "s", 6), lambda: backlog() == 4) == 6
    assert backlog() == 4
    gone = lambda: "gone" not in stats()["subscriptions"]  # noqa: E731
    assert across_a_restart(lambda: client.admin.delete_subscription(t, "gone"), gone) is None
    made = lambda: "new" in stats()["subscriptions"]  # noqa: E731
    assert across_a_restart(lambda: client.admin.create_subscription(t, "new"), made) is None

    def deleted():
        try:
            stats("gone")
        except pulsartxn.TopicNotFound:
            return True
        return False

    assert across_a_restart(lambda: client.admin.delete_topic("gone"), deleted) is None
    leaving = client.subscribe(t, "leaving")
    left = lambda: "leaving" not in stats()["subscriptions"]  # noqa: E731
    assert across_a_restart(leaving.unsubscribe, left) is None
    # New calls are new: each runs again.
    assert client.admin.skip(t, "s", 3) == 3 and backlog() == 1
    with pytest.raises(pulsartxn.SubscriptionNotFound):
        client.admin.delete_subscription(t, "gone")
    with pytest.raises(pulsartxn.SubscriptionAlreadyExists):
        client.admin.create_subscription(t, "new")
    with pytest.raises(pulsartxn.TopicNotFound):
        client.admin.delete_topic("gone")
    client.close()
    proxy.close()
    assert s.stop() == 0
    with pulsartxn.Broker(s.data_dir) as broker:  # the closed session's rows are gone
        assert once.owners(broker.storage) == set()


def test_a_once_call_in_flight_keeps_its_number_under_later_calls_after_a_reopen(server):
    """A call that must run once, in flight while the broker restarts, is re-sent with its
    number after the session is opened again. A call made meanwhile by another thread sends
    a `below` (the broker forgets what calls under it did) that must not pass it: the
    numbers taken before the reopen stay taken."""
    s = server()
    client = pulsartxn.Client(s.url)
    client.create_producer("t").close()
    in_flight = HeldNumbers()
    first = in_flight.at(client)["call"]
    generation = client._generation
    s.kill9()
    s.start()
    client.create_producer("t").close()  # finds the session lost, and opens it again
    assert client._generation > generation
    later = HeldNumbers()
    assert later.at(client)["call"] > first and later.at(client)["below"] == first
    in_flight.release()
    later.release()
    after = HeldNumbers()
    assert after.at(client)["below"] > first
    after.release()
    client.close()


def test_an_unsubscribe_re_sent_after_its_answer_was_lost_succeeds(server):
    """The broker drops the subscription and the answer is lost: the re-sent unsubscribe
    gets the first answer instead of finding its consumer gone (SessionLost)."""
    s, proxy, client, producer = _losing(server)
    consumer = client.subscribe("t", "s")
    direct = pulsartxn.Client(s.url).admin
    proxy.hold_answers()
    call, got = in_thread(consumer.unsubscribe)
    wait_for(lambda: "s" not in direct.topic_stats("t")["subscriptions"], what="the unsubscribe")
    proxy.cut()
    call.join(30)
    assert got == [None]
    assert "s" not in direct.topic_stats("t")["subscriptions"]
    client.subscribe("t", "s").unsubscribe()  # a new one of the same name: its own
    client.close()
    proxy.close()
