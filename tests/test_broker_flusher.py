"""The broker's batch flusher (pulsartxn/broker.py): a watched part is asked from its due
time on (the latest watch gives it), again every half delay while it answers False, and
never before it is due."""

from __future__ import annotations

import threading
import time

from pulsartxn.broker import _BatchFlusher


class Part:
    """Answers False `busy` times, then True; records when it was asked."""

    def __init__(self, busy: int = 0) -> None:
        self.asked: list[float] = []
        self.busy = busy
        self.lock = threading.Lock()

    def flush_if_older(self, seconds: float) -> bool:
        with self.lock:
            self.asked.append(time.monotonic())
            if self.busy:
                self.busy -= 1
                return False
            return True


def _until(predicate, timeout=5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def test_a_part_is_asked_at_its_due_time_and_a_later_watch_moves_it():
    flusher = _BatchFlusher(40.0)
    try:
        part = Part()
        now = time.monotonic()
        flusher.watch(part, now + 0.04)
        time.sleep(0.02)
        later = time.monotonic() + 0.06  # what it held was written; new work, due later
        flusher.watch(part, later)
        _until(lambda: part.asked)
        assert part.asked[0] >= later - 0.001
        time.sleep(0.1)
        assert len(part.asked) == 1  # it answered True: not asked again
    finally:
        flusher.stop()


def test_an_earlier_due_time_wakes_the_flusher_and_a_busy_part_is_asked_again():
    flusher = _BatchFlusher(20.0)
    try:
        slow, soon = Part(), Part(busy=2)
        flusher.watch(slow, time.monotonic() + 10)
        start = time.monotonic()
        flusher.watch(soon)  # at once
        _until(lambda: len(soon.asked) == 3)
        gaps = [b - a for a, b in zip(soon.asked, soon.asked[1:])]
        assert soon.asked[0] - start < 1.0
        assert all(g >= 0.0099 for g in gaps)  # every half delay
        assert not slow.asked
    finally:
        flusher.stop()


def test_parts_watched_while_another_keeps_moving_are_not_held_back():
    """One part watched again and again (a pipeline's acks, each taken by a commit) does not
    keep another's due time from coming."""
    flusher = _BatchFlusher(30.0)
    try:
        busy, idle = Part(), Part()
        due = time.monotonic() + 0.03
        flusher.watch(idle, due)
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            flusher.watch(busy, time.monotonic() + 0.03)
            time.sleep(0.002)
        assert idle.asked and idle.asked[0] >= due - 0.001 and idle.asked[0] < due + 0.1
        assert not busy.asked  # its due time kept moving on
    finally:
        flusher.stop()
