"""The answers of a consumer's or reader's delivering calls, kept until its client has them.

A receive hands its message to the consumer (held, unacknowledged, until it is acked or the
consumer closes); a reader's read moves the reader on. If the answer is lost with the
connection, the client's call made again would get the next message: the lost one would be
held by nobody (an Exclusive or Failover consumer's order broken, and a cumulative ack past
it acknowledging what was never processed) or skipped (a reader). So each delivering call
carries a number, the same when it is made again; the server keeps what it delivered under
that number and gives it again, until the client says it has every answer below a number.
Calls that a second run would not answer as the first (an admin skip would skip again, an
unsubscribe find its consumer gone) are kept the same way, per session.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from .. import errors

# Kept a handle at most (its newest answer always): a client has one a call in flight, and
# says with each call which it has.
KEEP = 4
KEEP_BYTES = 8 << 20
_MAX_CALL = (1 << 63) - 1


def call_numbers(args: dict) -> tuple[int | None, int | None]:
    """A delivering call's ("call", "below") numbers, if it gives them."""
    out = []
    for name in ("call", "below"):
        value = args.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_CALL
        ):
            raise TypeError(f"{name} must be an int of 0..2**63-1, not {errors.excerpt(value)}")
        out.append(value)
    return out[0], out[1]


class Replays:
    """Per handle (its consumer or reader object, weakly: a closed one takes its answers
    with it), the answers of its numbered delivering calls; per session, those of its calls
    that must not run twice (an unsubscribe, protocol.ADMIN_ONCE_METHODS)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def run(self, handle: object, args: dict, deliver: Callable[[], Any], kind: str) -> Any:
        """deliver()'s answer for the call `args` names; a call made again (of the same
        `kind`: one message, a list, an admin answer) gets the answer its first attempt had,
        waiting for it while it runs. An answer that is empty (an empty list) or an error is
        not kept: the next attempt delivers anew."""
        call, below = call_numbers(args)
        if call is None:
            return deliver()
        with self._lock:
            kept = self._of.get(handle)
            if kept is None:
                kept = self._of[handle] = _Kept()
        return kept.run((kind, call), below, deliver)

    def forget(self, handle: object) -> None:
        """Drop what `handle`'s calls were given (a seek, a redelivery)."""
        with self._lock:
            self._of.pop(handle, None)


class _Kept:
    """A handle's answers by (kind, call number); numbers are the client's, one counter a
    handle whatever the kind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: dict[tuple[str, int], Any] = {}
        self.running: dict[tuple[str, int], threading.Event] = {}

    def run(self, call: tuple[str, int], below: int | None, deliver: Callable[[], Any]) -> Any:
        while True:
            with self.lock:
                if below is not None:
                    for k in [k for k in self.answers if k[1] < below]:
                        del self.answers[k]
                if call in self.answers:
                    return self.answers[call][0]
                first = self.running.get(call)
                if first is None:
                    done = self.running[call] = threading.Event()
                    break
            first.wait()  # the first attempt is under way: bounded by its own wait
        try:
            out = deliver()
            if out is not None and not (isinstance(out, list) and not out):
                with self.lock:
                    self.answers[call] = (out, _size(out))
                    while len(self.answers) > 1 and (
                        len(self.answers) > KEEP
                        or sum(n for _, n in self.answers.values()) > KEEP_BYTES
                    ):
                        del self.answers[min(self.answers, key=_number)]
            return out
        finally:
            with self.lock:
                del self.running[call]
            done.set()


def _size(answer) -> int:
    """Bytes of an answer: an encoded message, a list of them, a list of Messages, or an
    admin call's (a small dict, counted as nothing)."""
    if isinstance(answer, dict):
        return 0
    if isinstance(answer, list):
        return sum(len(m) if isinstance(m, bytes) else len(m.data()) for m in answer)
    return len(answer)


def _number(key: tuple[str, int]) -> int:
    return key[1]
