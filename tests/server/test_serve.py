"""Stopping `pulsartxn serve`: the calls under way get --shutdown-timeout-s to finish, then
every client connection is closed, whatever the clients hold open (a DoPut stream, a receive);
a stop still under way after --stop-dump-s writes every thread's stack to the server's stderr,
with a log line saying so; a quick one writes nothing."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pyarrow as pa
import pytest

import pulsartxn
from pulsartxn import errors
from pulsartxn.cli import build_parser
from pulsartxn.server.serve import serve, stacks_dumped_after
from tests.helpers import scanned

DUMPED = "most recent call first"  # faulthandler's line above each thread's stack
STOPPING = "INFO pulsartxn.server.serve stopping: the calls under way get up to"


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def values(*items: bytes) -> pa.Array:
    return pa.array(list(items), pa.binary())


def test_a_stop_ends_open_streams_and_receives_after_the_grace(server):
    srv = server("--shutdown-timeout-s", "1")
    writer = pulsartxn.Client(srv.url, reconnect_timeout_s=20)
    txn = writer.new_transaction(timeout_ms=60_000)
    stream = writer.create_producer("t").batch_stream(txn)
    stream.write(values(b"a", b"b"))
    stream.write(values(b"c"))
    reader = pulsartxn.Client(srv.url, reconnect_timeout_s=20)
    consumer = reader.subscribe("r", "s")
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(consumer.receive(30_000)))
    waiting.start()
    # Stored: the server's DoPut call is past both batches, waiting for the next one.
    wait_until(lambda: writer.admin.topic_stats("t")["msg_in"] == 3)
    time.sleep(0.2)  # the receive is parked on the server
    start = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(1 + 4) == 0
    assert 1 <= time.monotonic() - start
    assert "pulsartxn server stopped" in srv.proc.stdout.read()
    log = srv.log()
    assert "calls still under way after 1 s: closed" in log
    assert "Traceback" not in log
    with pytest.raises(errors.BrokerUnavailable, match="unreachable"):
        stream.write(values(b"d"))
    # The stream is over: the client cannot know what the broker took of it.
    with pytest.raises(errors.AlreadyClosed, match="call failed: batch_stream: .*unreachable"):
        stream.close()
    assert waiting.is_alive()  # its client retries while the broker is away

    srv.start()  # the same data directory: what was stored is there, once
    assert "(clean start)" in srv.log()  # the stop closed the store
    # The transaction outlived the stop, as its session did, but a stream of it failed: its
    # commit aborts it, and none of the stream's batches is ever read.
    with pytest.raises(errors.InvalidTxnStatus, match="failed \\(batch_stream: .*aborted"):
        txn.commit()
    assert txn.state is pulsartxn.TxnState.ABORTED
    assert scanned(writer, "t") == []
    writer.create_producer("r").send(b"after")
    waiting.join(15)
    assert [m.data() for m in got] == [b"after"]
    writer.close()
    reader.close()


def test_a_failed_stream_kept_by_its_client_holds_no_call_a_stop_waits_for(server):
    """A batch stream whose call failed (here its transaction had ended) and the error it
    raised, both kept by the client, hold no call at the broker open: a stop waited out its
    grace for it (4.5-5 s of 5, in several test teardowns)."""
    srv = server("--shutdown-timeout-s", "20")
    client = pulsartxn.Client(srv.url, reconnect_timeout_s=0.2)
    producer = client.create_producer("t")
    done = client.new_transaction()
    done.abort()
    stream = producer.batch_stream(done)
    with pytest.raises(errors.InvalidTxnStatus) as refused:
        stream.write(values(b"late"))
        stream.close()
    client.close()
    start = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(20) == 0
    assert time.monotonic() - start < 2.5, "the stop waited for a call the kept stream held"
    # Both were kept all along (this frame holds them): the stream, over, names its failure.
    with pytest.raises(pulsartxn.AlreadyClosed, match="call failed"):
        stream.write(values(b"after"))
    assert isinstance(refused.value, errors.InvalidTxnStatus)


def test_a_stream_finished_in_the_grace_is_answered_and_a_slow_stop_dumped(server):
    srv = server("--shutdown-timeout-s", "30", "--stop-dump-s", "0.5")
    client = pulsartxn.Client(srv.url, reconnect_timeout_s=0.2)  # its close finds no server
    stream = client.create_producer("t").batch_stream()
    stream.write(values(b"a", b"b"))
    wait_until(lambda: scanned(client, "t") == [b"a", b"b"])
    srv.proc.send_signal(signal.SIGTERM)
    # The main thread's stack comes last: the dump is whole once its bottom frame is there.
    wait_until(lambda: "_run_module_as_main" in srv.log() and "stack is dumped" in srv.log())
    log = srv.log()
    assert STOPPING + " 30 s to finish" in log
    assert "WARNING pulsartxn.server.serve stopping has taken over 0.5 s" in log
    assert log.count("Timeout (0:00:00.500000)!") == 1
    assert "do_put" in log  # the stack that holds the stop is among them
    srv.proc.send_signal(signal.SIGTERM)  # again: the stop goes on as it was
    time.sleep(0.2)
    assert srv.proc.poll() is None
    stream.write(values(b"c"))  # in the grace: taken and answered as ever
    assert stream.close() == 3
    assert srv.proc.wait(5) == 0  # once the calls are done, not at the grace's end
    assert "pulsartxn server stopped" in srv.proc.stdout.read()
    assert srv.log().count(DUMPED) == log.count(DUMPED)  # once only
    assert "closed" not in srv.log().split(STOPPING)[1]  # no connection was cut
    client.close()
    srv.extra = ["--shutdown-timeout-s", "1"]  # the fixture's stop: no dump, a short grace
    srv.start()
    with pulsartxn.Client(srv.url) as again:
        assert scanned(again, "t") == [b"a", b"b", b"c"]


def test_a_block_that_ends_in_time_writes_nothing(capfd, caplog):
    with caplog.at_level(logging.WARNING, "pulsartxn.server.serve"):
        with stacks_dumped_after(0.2, "stopping"):
            time.sleep(0.05)
        time.sleep(0.4)  # past the delay: the dump was cancelled
    assert DUMPED not in capfd.readouterr().err
    assert caplog.records == []
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


def test_a_block_still_running_writes_every_stack_once(capfd, caplog):
    with caplog.at_level(logging.WARNING, "pulsartxn.server.serve"):
        with stacks_dumped_after(0.2, "stopping"):
            wait_until(lambda: caplog.records, 5)
            time.sleep(0.1)
        time.sleep(0.3)
    err = capfd.readouterr().err
    assert err.count("Timeout (0:00:00.200000)!") == 1
    assert f'File "{__file__}"' in err  # this thread's stack, where it waited
    assert [r.getMessage() for r in caplog.records] == [
        "stopping has taken over 0.2 s: every thread's stack is dumped to stderr"
    ]


def test_zero_turns_the_dump_off(capfd):
    with stacks_dumped_after(0, "stopping"):
        time.sleep(0.05)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("option", ["stop_dump_s", "shutdown_timeout_s"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_delay_is_refused_before_anything_starts(tmp_path, option, bad):
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} must be a number of seconds >= 0"):
        serve(str(tmp_path / "data"), "127.0.0.1", 0, None, **{option: bad})
    with pytest.raises(TypeError, match=f"{option} must be a number, not str"):
        serve(str(tmp_path / "data"), "127.0.0.1", 0, None, **{option: "10"})
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("flag", "default"), [("stop-dump-s", 10.0), ("shutdown-timeout-s", 5.0)])
def test_the_options_take_seconds(capsys, flag, default):
    attr = flag.replace("-", "_")
    assert getattr(build_parser().parse_args(["serve"]), attr) == default
    assert getattr(build_parser().parse_args(["serve", f"--{flag}", "2.5"]), attr) == 2.5
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", f"--{flag}", "soon"])
    assert exited.value.code == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
