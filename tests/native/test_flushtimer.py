"""The batch flusher's timer (native and twin): wait() returns once the due time set last has
come, an earlier time wakes a waiter at once, a later one postpones it, stop() ends it."""

from __future__ import annotations

import math
import threading
import time

import pytest

from pulsartxn._native import load

IMPLS = [load("native"), load("reference")]


@pytest.fixture(params=IMPLS, ids=lambda ns: ns.kind)
def timer(request):
    t = request.param.FlushTimer()
    yield t
    t.stop()


def _waiter(timer):
    """A thread in timer.wait(); the list gets (returned, when) once it returns."""
    out: list = []

    def run():
        ok = timer.wait()
        out.append((ok, time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_due_time_in_the_past_returns_at_once(timer):
    timer.set(0.0)
    assert timer.wait() is True
    timer.set(time.monotonic() - 1)
    assert timer.wait() is True


def test_waits_until_the_due_time(timer):
    start = time.monotonic()
    timer.set(start + 0.05)
    assert timer.wait() is True
    assert time.monotonic() - start >= 0.049


def test_an_earlier_time_wakes_the_waiter_and_a_later_one_postpones_it(timer):
    thread, out = _waiter(timer)  # nothing set: waits until a set() or stop()
    time.sleep(0.05)
    assert not out
    timer.set(time.monotonic() + 10)
    time.sleep(0.02)
    assert not out
    due = time.monotonic() + 0.05
    timer.set(due)  # earlier: the waiter sleeps until then now
    thread.join(2)
    assert out and out[0][0] is True and out[0][1] >= due - 0.001
    # Later while waiting: it returns at the later time, not the earlier.
    # `first` leaves the setting of `later` 0.3 s (it took over 30 ms in a loaded CI run).
    first = time.monotonic() + 0.3
    timer.set(first)
    thread, out = _waiter(timer)
    time.sleep(0.01)
    later = time.monotonic() + 0.4
    timer.set(later)
    thread.join(2)
    assert out and out[0][1] >= later - 0.001


def test_stop_ends_a_wait_and_every_later_one(timer):
    timer.set(math.inf)
    thread, out = _waiter(timer)
    time.sleep(0.02)
    timer.stop()
    thread.join(2)
    assert out and out[0][0] is False
    timer.set(0.0)
    assert timer.wait() is False
