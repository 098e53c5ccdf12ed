"""operation_timeout_seconds against a real `pulsartxn serve` process stopped with SIGSTOP
(alive, silent): every call that is not a send ends with Timeout near it, as pulsar-client's,
instead of hanging; a receive's own wait is not cut by it; after SIGCONT the client goes on
and a commit retried reports the real outcome, stored once."""

from __future__ import annotations

import math
import signal
import threading
import time

import pyarrow as pa
import pytest

import pulsartxn
from pulsartxn import InitialPosition, TxnState
from pulsartxn.errors import BrokerUnavailable, InvalidTxnStatus, Timeout
from tests.helpers import Server, paused

from .test_send_timeout import timed

# Loose bounds: the machine is slow and shared. Never before the timeout, never near the
# client's reconnect_timeout_s (30 s), which is what a silent broker held a call for before.
OP_S = 1
EARLIEST, LATEST = OP_S * 0.9, 4.5


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # A long session timeout: the stopped server must not expire the client when it resumes.
    # A short grace at the end: the calls a client gave up on do not hold the stop.
    s = Server(
        tmp_path_factory.mktemp("optimeout") / "data",
        "--session-timeout-s",
        "60",
        "--shutdown-timeout-s",
        "1",
        "--operation-timeout-ms",
        "2000",
    )
    s.start()
    yield s
    s.proc.send_signal(signal.SIGCONT)
    s.stop()


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "1", True, None])
def test_a_bad_operation_timeout_is_refused_before_connecting(served, bad):
    with pytest.raises(ValueError, match="operation_timeout_seconds must be a positive number"):
        pulsartxn.Client(served.url, operation_timeout_seconds=bad)
    with pytest.raises(ValueError, match="operation_timeout_seconds"):
        pulsartxn.Client("pulsartxn://127.0.0.1:1,127.0.0.1:2", operation_timeout_seconds=bad)


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"reconnect_timeout_s": "30"}, TypeError, "reconnect_timeout_s must be a number"),
        ({"reconnect_timeout_s": -1}, ValueError, "reconnect_timeout_s must be a non-negative"),
        ({"reconnect_timeout_s": math.nan}, ValueError, "reconnect_timeout_s must be a non-neg"),
        ({"keepalive_s": 0}, ValueError, "keepalive_s must be a positive"),
        ({"keepalive_s": True}, TypeError, "keepalive_s must be a number"),
        ({"keepalive_s": math.inf}, ValueError, "keepalive_s must be a positive"),
        ({"token": 5}, TypeError, "token must be a str or None"),
    ],
)
def test_bad_client_options_are_refused_before_connecting(served, options, error, match):
    """keepalive_s=0 made the keep-alive call the broker without a pause; "30" for
    reconnect_timeout_s failed adding it to a float, a token of 5 in encode()."""
    for url in (served.url, "pulsartxn://127.0.0.1:1,127.0.0.1:2"):
        with pytest.raises(error, match=match):
            pulsartxn.Client(url, **options)
    assert pulsartxn.Client(served.url, reconnect_timeout_s=0, keepalive_s=0.5).close() is None


def test_calls_to_a_stopped_broker_time_out_and_the_client_goes_on(served):
    client = pulsartxn.Client(served.url, operation_timeout_seconds=OP_S)
    topic = "optimeout"
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(
        topic, "sub", pulsartxn.ConsumerType.Shared, initial_position=InitialPosition.Earliest
    )
    for i in range(3):
        producer.send(b"m%d" % i)
    first, second, third = (consumer.receive(5000) for _ in range(3))
    txn, acking = client.new_transaction(), client.new_transaction()
    landed, lost = client.new_transaction(), client.new_transaction()
    plain = client.new_transaction()
    # No send timeout: the operation timeout bounds its calls (a separate topic: they may land).
    unbounded = client.create_producer("optimeout-0", "p0", send_timeout_millis=0)
    streamer = client.create_producer("optimeout-0", "p1", send_timeout_millis=0)
    stream = streamer.batch_stream()
    stream.write(pa.array([b"bs"], pa.binary()))
    producer.send(b"in-txn", txn=txn)
    ops = {
        "new_transaction": client.new_transaction,
        "ack": lambda: consumer.acknowledge(first),
        "ack in txn": lambda: consumer.acknowledge(second, txn=acking),
        "batch_receive": lambda: consumer.batch_receive(10, timeout_millis=200),
        "admin topic_stats": lambda: client.admin.topic_stats(topic),
        "subscribe": lambda: client.subscribe(topic, "other"),
        "scan": lambda: list(client.scan(topic)),
        "send_many": lambda: unbounded.send(b"s", sequence_id=0),
        "send_batch": lambda: unbounded.send_batch([b"b1", b"b2"]),
        "batch_stream close": stream.close,
        "end": lambda: txn.commit(timeout_ms=500),  # the server may wait 0.5 s more for it
        "end landed": lambda: landed.commit(timeout_ms=0),
        "end lost": lambda: lost.commit(timeout_ms=0),
        "end plain": plain.commit,  # the server's own wait: serve --operation-timeout-ms 2000
    }
    outcomes: dict = {}
    with paused(served.proc):
        # Concurrent calls on one connection: each ends on its own deadline.
        threads = [
            threading.Thread(target=lambda n=n, f=f: outcomes.__setitem__(n, timed(f)))
            for n, f in ops.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for name, (raised, took) in outcomes.items():
        assert isinstance(raised, Timeout), (name, raised)
        assert EARLIEST <= took <= LATEST, (name, took)
        assert served.url in str(raised) and "operation_timeout_seconds=1" in str(raised)
        call = name.split(" ")[0] if name.startswith(("end", "ack")) else name
        assert str(raised).split(":")[0].endswith(call) or call in str(raised), (name, raised)
    assert outcomes["end"][1] >= 1.4  # the commit's own 0.5 s on the server was left to it
    assert outcomes["end plain"][1] >= 2.9  # and the server's 2 s to one without its own
    assert "state is unknown to the client" in str(outcomes["end"][0])
    # A timed-out end may have gone through after all (the resumed broker may run it): here
    # another handle ends them too. A commit retried then returns if the transaction is
    # committed, else raises saying its state.
    for handle, end in ((landed, "commit"), (lost, "abort")):
        try:
            getattr(client.transaction(handle.id), end)()
        except InvalidTxnStatus:
            pass  # the timed-out commit got there first
    landed.commit()
    assert landed.state is TxnState.COMMITTED
    plain.commit(timeout_ms=5000)  # retried: returns whether or not the first one landed
    assert plain.state is TxnState.COMMITTED
    if lost.state is TxnState.ABORTED:
        with pytest.raises(InvalidTxnStatus, match="ABORTED"):
            lost.commit()
    else:
        lost.commit()
    # Back: the commit retried succeeds whether or not the first one went through, and its
    # message is stored once; the ack in a transaction that timed out leaves it abort-only.
    txn.commit(timeout_ms=5000)
    assert txn.state is TxnState.COMMITTED
    with pytest.raises(InvalidTxnStatus, match="COMMITTED"):
        txn.commit()  # once the client knows it ended, a commit is refused, as Pulsar's
    with pytest.raises(InvalidTxnStatus, match="cannot commit: an op of it failed") as failed:
        acking.commit()
    assert "ack: broker at" in str(failed.value) and "was aborted" in str(failed.value)
    assert acking.state in (TxnState.ABORTED, TxnState.ABORTING)
    reader = client.subscribe(topic, "check", initial_position=InitialPosition.Earliest)
    seen = [m.data() for m in reader.batch_receive(100, timeout_millis=1000)]
    assert sorted(seen) == [b"in-txn", b"m0", b"m1", b"m2"], seen
    assert sum(b.num_rows for b in client.scan(topic)) >= 4  # a scan is not cut either
    unbounded.send(b"s", sequence_id=0)  # re-sent: stored once, whether or not it had landed

    def stored() -> list:
        return [r for b in client.scan("optimeout-0") for r in b.column("value").to_pylist()]

    # The stream's batch lands once: the resumed broker finishes the stream the client left.
    deadline = time.monotonic() + 5
    while stored().count(b"bs") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    values = stored()
    assert values.count(b"s") == 1 and values.count(b"bs") == 1, values
    assert values.count(b"b1") <= 1, values
    consumer.acknowledge(third)
    again = client.new_transaction()
    again.commit()
    assert client.subscribe(topic, "other-2").subscription_name() == "other-2"
    assert client.admin.topic_stats(topic)
    client.close()


def _stream_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "pulsartxn-batch-stream"]


def _until(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_a_batch_stream_write_a_silent_broker_does_not_take_times_out(served):
    """A stream's write blocks once the broker stops reading (its window is full): it raises
    Timeout at the operation timeout instead of waiting for ever, and the stream is over."""
    topic = "optimeout-stream"
    client = pulsartxn.Client(served.url, operation_timeout_seconds=OP_S)
    producer = client.create_producer(topic, send_timeout_millis=0)
    txn = client.new_transaction()
    stream = producer.batch_stream(txn)
    big = pa.array([b"x" * 1000] * 1000, pa.binary())
    stream.write(big)
    written = [1]

    def fill():
        while True:
            stream.write(big)
            written[0] += 1

    with paused(served.proc):
        raised, took = timed(fill)
    assert isinstance(raised, Timeout), raised
    assert str(raised).startswith("batch_stream write: broker at " + served.url), raised
    assert EARLIEST <= took <= LATEST and written[0] >= 2, (took, written)
    # Over: neither a write nor the close goes on with a stream that lost a batch's fate.
    with pytest.raises(
        pulsartxn.AlreadyClosed,
        match="ended when a call failed: batch_stream write: .* did not answer",
    ):
        stream.write(big)
    with pytest.raises(
        pulsartxn.AlreadyClosed,
        match="ended when a call failed: batch_stream write: .* did not answer",
    ):
        stream.close()
    stream.cancel()  # nothing left to drop
    # Its transaction holds an unknown part of the stream: it can only abort.
    with pytest.raises(InvalidTxnStatus, match="cannot commit: an op of it failed"):
        txn.commit()
    assert txn.state in (TxnState.ABORTED, TxnState.ABORTING)
    # The write left running ends once the broker reads again; its thread with it.
    assert _until(lambda: not _stream_threads()), _stream_threads()
    # The producer goes on: a new stream stores its batches, and only those are read.
    with producer.batch_stream() as again:
        again.write(pa.array([b"a", b"b"], pa.binary()))
    assert again.count == 2
    values = [v for b in client.scan(topic) for v in b.column("value").to_pylist()]
    assert values == [b"a", b"b"], len(values)
    client.close()


def test_a_batch_stream_left_unclosed_ends_its_thread(served):
    assert _until(lambda: not _stream_threads())  # those of closed streams have ended
    with pulsartxn.Client(served.url) as client:
        stream = client.create_producer("optimeout-unclosed").batch_stream()
        stream.write(pa.array([b"v"], pa.binary()))
        assert len(_stream_threads()) == 1
        del stream  # never closed: its worker ends with it
        assert _until(lambda: not _stream_threads()), _stream_threads()


def test_a_receive_waits_its_own_timeout_beyond_the_operation_timeout(served):
    with pulsartxn.Client(served.url, operation_timeout_seconds=OP_S) as client:
        consumer = client.subscribe("optimeout-empty", "sub")
        start = time.monotonic()
        with pytest.raises(Timeout) as raised:
            consumer.receive(timeout_millis=2500)
        assert 2.4 <= time.monotonic() - start <= 6.0
        assert "operation_timeout_seconds" not in str(raised.value)
        start = time.monotonic()
        assert consumer.batch_receive(10, timeout_millis=1500) == []
        assert 1.4 <= time.monotonic() - start <= 5.0


def test_a_multi_host_url_tries_the_next_broker_after_a_silent_one(served):
    # The first broker is paused, the second refuses: every one is tried, then it gives up
    # at reconnect_timeout_s, as when all are down (a silent one no longer stops the round).
    url = f"{served.url},127.0.0.1:1"
    with paused(served.proc):
        raised, took = timed(
            lambda: pulsartxn.Client(url, operation_timeout_seconds=OP_S, reconnect_timeout_s=1)
        )
    assert isinstance(raised, BrokerUnavailable), raised
    assert "operation_timeout_seconds=1" in str(raised) or "127.0.0.1:1" in str(raised)
    assert took <= LATEST + 1, took


def test_the_admin_command_gives_up_on_a_silent_server_at_its_timeout(served):
    """`pulsartxn admin --timeout 1` against a paused server: one line on stderr and exit 2
    within a few seconds, not a hang."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "pulsartxn", "admin", "--url", served.url]
    subprocess.run([*command, "topics", "list"], check=True, capture_output=True, timeout=60)
    with paused(served.proc):
        start = time.monotonic()
        done = subprocess.run(
            [*command, "--timeout", "1", "topics", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - start
    assert done.returncode == 2 and took <= 15, (done, took)
    assert len(done.stderr.strip().splitlines()) == 1 and "did not answer" in done.stderr
