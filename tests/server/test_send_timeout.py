"""send_timeout_millis against a real `pulsartxn serve` process that is stopped (SIGSTOP: alive
but silent) or killed while a remote producer sends: sends, futures, callbacks, batches and
flush fail with Timeout near the timeout, as pulsar-client's; after the broker is back a
re-send with the same sequence id is stored once."""

from __future__ import annotations

import signal
import threading
import time

import pyarrow as pa
import pytest

import pulsartxn
from pulsartxn import TxnState
from pulsartxn.errors import BrokerUnavailable, InvalidTxnStatus, Timeout
from tests.helpers import Server, paused, scanned

TIMEOUT_MS = 400
# Loose bounds: the machine is slow and shared. Never before the timeout; well before the
# client's reconnect_timeout_s (30 s), which is what a send waited for before.
EARLIEST, LATEST = TIMEOUT_MS / 1000 * 0.9, 5.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # A long session timeout: the stopped server must not expire the client when it resumes.
    s = Server(tmp_path_factory.mktemp("sendtimeout") / "data", "--session-timeout-s", "60")
    s.start()
    yield s
    s.proc.send_signal(signal.SIGCONT)
    s.stop()


def timed(fn, wait_s: float = 10.0):
    """(what fn raised or returned, seconds it took), run in a thread: without a send timeout
    a call to a stopped broker never ends, and the test fails instead of hanging."""
    out: list = []

    def run():
        start = time.monotonic()
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - the caller asserts on it
            out.append(exc)
        out.append(time.monotonic() - start)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(wait_s)
    assert not t.is_alive(), f"still waiting after {wait_s} s"
    return out[0], out[1]


def test_sends_to_a_stopped_broker_time_out_and_a_resend_is_stored_once(served):
    client = pulsartxn.Client(served.url, reconnect_timeout_s=30)
    topic = "stopped"
    producer = client.create_producer(
        topic, producer_name="p-stopped", send_timeout_millis=TIMEOUT_MS
    )
    other = client.create_producer(topic, send_timeout_millis=TIMEOUT_MS)
    first = producer.send(b"a", sequence_id=0)
    early = producer.send_async(b"b", sequence_id=1)
    producer.flush()
    txn, grouped = client.new_transaction(), client.new_transaction()
    called: list = []
    with paused(served.proc):
        raised, took = timed(lambda: producer.send(b"c", sequence_id=2))
        assert isinstance(raised, Timeout) and "send_timeout_millis=400" in str(raised)
        assert EARLIEST <= took <= LATEST, took
        # Every queued message fails once the oldest one timed out, each future and callback
        # with its own Timeout; those stored before stay stored.
        start = time.monotonic()
        futures = [
            producer.send_async(b"d", lambda r, m: called.append((r, m)), sequence_id=3),
            producer.send_async(b"e", sequence_id=4),
            producer.send_async(b"t", txn=txn, sequence_id=5),
        ]
        errors = [f.exception(LATEST) for f in futures]
        assert EARLIEST <= time.monotonic() - start <= LATEST
        assert all(isinstance(e, Timeout) for e in errors), errors
        assert "message 3" in str(errors[0]) and "message 4" in str(errors[1])
        assert early.result() is not None and early.exception() is None
        # Concurrent senders each get theirs.
        outcomes: list = []
        threads = [
            threading.Thread(
                target=lambda i=i: outcomes.append(timed(lambda: other.send(b"x%d" % i)))
            )
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outcomes) == 4
        assert all(isinstance(r, Timeout) and took <= LATEST for r, took in outcomes)
        raised, took = timed(lambda: other.send(b"u", txn=grouped))
        assert isinstance(raised, Timeout) and took <= LATEST
        raised, took = timed(lambda: other.send_batch([b"f", b"g"]))
        assert isinstance(raised, Timeout) and took <= LATEST
        # flush() itself times out while the broker is silent.
        raised, took = timed(producer.flush)
        assert isinstance(raised, Timeout) and EARLIEST <= took <= LATEST
    # Re-sent with their sequence ids, in order and before anything newer (a sequence id
    # below the highest stored counts as a duplicate): each stored once, the first id kept.
    assert resent(producer, b"a", 0) == first
    for seq, value in ((2, b"c"), (3, b"d"), (4, b"e")):
        producer.send(value, sequence_id=seq)
    assert called and isinstance(called[0][0], Timeout) and called[0][1] is None
    # A transaction with a send that timed out cannot commit: it is aborted (Pulsar's).
    with pytest.raises(InvalidTxnStatus, match="cannot commit"):
        txn.commit()
    assert txn.state is TxnState.ABORTED
    with pytest.raises(InvalidTxnStatus, match="cannot commit"):  # nothing decided
        client.commit_all([grouped])
    assert grouped.state is TxnState.OPEN
    grouped.abort()
    producer.close()
    other.close()
    values = scanned(client, topic)
    for value in (b"a", b"b", b"c", b"d", b"e"):
        assert values.count(value) == 1, (value, values)
    assert b"t" not in values and b"u" not in values  # their transactions aborted
    assert values.count(b"f") <= 1 and values.count(b"g") <= 1
    client.close()


def resent(producer, value: bytes, seq: int, wait_s: float = 10.0):
    """After SIGCONT: `value` re-sent under `seq` until the broker, catching up, answers."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return producer.send(value, sequence_id=seq)
        except Timeout:
            if time.monotonic() > deadline:
                raise


def test_flush_raises_the_last_sends_timeout_once(served):
    client = pulsartxn.Client(served.url, reconnect_timeout_s=30)
    producer = client.create_producer("flushed", send_timeout_millis=TIMEOUT_MS)
    with paused(served.proc):
        fut = producer.send_async(b"lost")
        assert isinstance(fut.exception(LATEST), Timeout)
    with pytest.raises(Timeout, match="timed out"):
        producer.flush()
    producer.flush()  # reported once
    producer.send_async(b"y").result(10)
    producer.flush()
    # A later message stored clears it, as Pulsar's last send future.
    with paused(served.proc):
        assert isinstance(producer.send_async(b"z").exception(LATEST), Timeout)
    producer.send(b"w")
    producer.flush()
    client.close()


def test_a_killed_broker_times_out_sends_and_zero_retries_up_to_reconnect(served):
    client = pulsartxn.Client(served.url, reconnect_timeout_s=2)
    producer = client.create_producer(
        "killed", producer_name="p-killed", send_timeout_millis=TIMEOUT_MS
    )
    patient = client.create_producer("killed", producer_name="p-patient", send_timeout_millis=0)
    kept = producer.send(b"k0", sequence_id=0)
    served.kill9()
    try:
        raised, took = timed(lambda: producer.send(b"k1", sequence_id=1))
        assert isinstance(raised, Timeout) and EARLIEST <= took <= LATEST, (raised, took)
        fut = producer.send_async(b"k2", sequence_id=2)
        assert isinstance(fut.exception(LATEST), Timeout)
        # 0: no send timeout; retried with backoff up to reconnect_timeout_s, as before.
        raised, took = timed(lambda: patient.send(b"z"))
        assert isinstance(raised, BrokerUnavailable) and not isinstance(raised, Timeout)
        assert took >= 1.0, took
    finally:
        served.start()
    assert resent(producer, b"k0", 0) == kept  # de-duplicated after the restart
    producer.send(b"k1", sequence_id=1)
    producer.send(b"k2", sequence_id=2)
    producer.send_batch(pa.array([b"k3"], pa.binary()))
    producer.close()
    patient.close()
    assert scanned(client, "killed") == [b"k0", b"k1", b"k2", b"k3"]
    client.close()
