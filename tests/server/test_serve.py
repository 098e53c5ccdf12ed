"""Stopping `pulsartxn serve`: a stop still under way after --stop-dump-s writes every
thread's stack to the server's stderr, with a log line saying so; a quick one writes nothing.
The slow stop is real: the server waits for a client's DoPut stream that is still open."""

from __future__ import annotations

import contextlib
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


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_a_stop_held_up_by_an_open_stream_dumps_every_stack_once(server):
    srv = server("--stop-dump-s", "1")
    client = pulsartxn.Client(srv.url, reconnect_timeout_s=0.2)  # its close finds no server
    stream = client.create_producer("t").batch_stream()
    stream.write(pa.array([b"a", b"b"], pa.binary()))
    # Stored: the server's DoPut call is past that batch, waiting for the next one.
    wait_until(lambda: scanned(client, "t") == [b"a", b"b"])
    srv.proc.send_signal(signal.SIGTERM)
    # The main thread's stack comes last: the dump is whole once its bottom frame is there.
    wait_until(lambda: "_run_module_as_main" in srv.log() and "stack is dumped" in srv.log())
    assert srv.proc.poll() is None  # still stopping: the stream's call holds it
    log = srv.log()
    assert "WARNING pulsartxn.server.serve stopping has taken over 1 s" in log
    assert log.count("Timeout (0:00:01)!") == 1
    assert "do_put" in log  # the stack that holds the stop is among them
    srv.proc.send_signal(signal.SIGTERM)  # again: the stop goes on as it was
    time.sleep(0.2)
    assert srv.proc.poll() is None
    with contextlib.suppress(errors.AlreadyClosed):  # its producer went with the sessions
        stream.close()
    assert srv.proc.wait(10) == 0
    assert "pulsartxn server stopped" in srv.proc.stdout.read()
    assert srv.log().count(DUMPED) == log.count(DUMPED)  # once only
    client.close()


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


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_delay_is_refused_before_anything_starts(tmp_path, bad):
    with pytest.raises(ValueError, match="--stop-dump-s must be a number of seconds >= 0"):
        serve(str(tmp_path / "data"), "127.0.0.1", 0, None, stop_dump_s=bad)
    with pytest.raises(TypeError, match="stop_dump_s must be a number, not str"):
        serve(str(tmp_path / "data"), "127.0.0.1", 0, None, stop_dump_s="10")
    assert not (tmp_path / "data").exists()


def test_the_option_takes_seconds(capsys):
    assert build_parser().parse_args(["serve"]).stop_dump_s == 10.0
    assert build_parser().parse_args(["serve", "--stop-dump-s", "2.5"]).stop_dump_s == 2.5
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--stop-dump-s", "soon"])
    assert exited.value.code == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
