"""The remote client's calls to its broker: the session's hello, one call retried while the
broker is unreachable (up to reconnect_timeout_s or a send's deadline) and ended at the
operation timeout when it does not answer, a call in the session (opened again if the broker
lost it), and the keep-alive."""

from __future__ import annotations

import time
import uuid

import pyarrow.flight as flight

from .. import errors
from ..server import protocol
from ..server.protocol import SessionLost, frame, unframe
from .handles import CLOSE_TIMEOUT_S, OperationTimedOut, SendTimedOut, unreachable

# Actions whose answer may be no result at all (a read that found nothing).
MAY_ANSWER_NOTHING = frozenset({"read_many"})
# What a broker waits at most for a receive and for a decision when its hello does not say.
SERVER_MAX_WAIT_MS = 10_000
SERVER_OPERATION_TIMEOUT_MS = 30_000


class Calls:
    """The part of RemoteClient that makes calls (a mixin: it uses the client's _flight,
    _session, _headers, _deadline, _wait, _op_timeout_s, _op_options, _reconnect_s,
    _closing, _stop, _generation and service_url, and SessionGate's reopen)."""

    def _hello(self) -> bool:
        """Open the session (or keep it, after a reconnect); whether it is new there."""
        (out,) = self._raw("hello", {"version": protocol.VERSION})
        answer = unframe(out, 1 << 62)[0]
        self._in_cluster = bool(answer.get("cluster"))
        self._max_wait_s = answer.get("max_wait_ms", SERVER_MAX_WAIT_MS) / 1000.0
        self._decide_s = answer.get("operation_timeout_ms", SERVER_OPERATION_TIMEOUT_MS) / 1000.0
        return answer.get("new", True)

    def _raw(self, action: str, args: dict, payload: bytes = b"", seen=None) -> list[bytes]:
        """One call, retried while the broker is unreachable (with backoff) up to
        reconnect_timeout_s, or to the thread's send deadline (SendTimedOut, also when the
        broker does not answer); without one, an unanswered attempt ends at the operation
        timeout (OperationTimedOut). `seen`: the generation a handle in `args` was made in; once
        the session has been opened again the call is not re-sent with it (SessionLost: the
        caller makes the handle again; a restarted broker numbers handles afresh)."""
        body = frame({**args, "session": self._session}, payload)
        name = f"admin {args.get('method')}" if action == "admin" else action

        def attempt(options) -> list[bytes]:
            results = self._flight.do_action(flight.Action(action, body), options)
            out = [r.body.to_pybytes() for r in results]
            if not out and action not in MAY_ANSWER_NOTHING:
                # Every other action answers at least once: none is an answer lost on the
                # way (never a raw unpacking error to the caller), retried as one.
                raise flight.FlightUnavailableError(f"{name}: the broker's answer was lost")
            return out

        return self._retrying(name, seen, attempt)

    def _retrying(self, name: str, seen, attempt):
        """attempt(call options) (a Flight call), made again as ``_raw`` says; `name` is the
        call's in the error of one not answered in time."""
        deadline = time.monotonic() + self._reconnect_s
        delay = 0.05
        while True:
            if seen is not None:
                self._check_generation(seen)
            try:
                return attempt(self._call_options())
            except flight.FlightUnavailableError as exc:
                if self._closing.is_set():  # a closing client does not wait for the broker
                    raise unreachable(self, exc) from None
                self._retries += 1
                self._channel_lost()
                send_by = self._deadline.at
                if send_by is not None and send_by <= deadline:  # the send gives up first
                    left = send_by - time.monotonic()
                    self._closing.wait(max(min(delay, left), 0.0))
                    if left <= delay:
                        raise SendTimedOut(str(unreachable(self, exc, False))) from None
                elif time.monotonic() + delay > deadline:
                    raise unreachable(self, exc, False) from None  # renewed above
                else:
                    self._closing.wait(delay)
                delay = min(delay * 2, 1.0)
            except flight.FlightTimedOutError:
                raise self._unanswered(name) from None
            except flight.FlightError as exc:
                raise protocol.from_flight_error(exc) from None

    def _create(self, action: str, args: dict) -> dict:
        """A create of a producer, consumer or reader, named by an id of its own. One the
        broker did not answer in time may still be made once it gets on (a create held up in
        the broker), holding its place (an Exclusive subscription, a producer's name) for as
        long as the session lives: its id is cancelled with this client's next calls (a
        create, the keep-alive), and the broker closes what it made, or never makes it."""
        create_id = uuid.uuid4().hex
        try:
            out = self._raw_cancelling(action, {**args, "create_id": create_id})
        except errors.Timeout:
            with self._cancels_lock:
                self._cancels.append(create_id)
            raise
        return unframe(out[0], 1 << 62)[0]

    def _raw_cancelling(self, action: str, args: dict) -> list[bytes]:
        """_raw, carrying the creates to cancel (at most MAX_CANCELS); the broker has taken
        them once the call is answered."""
        cancel = self._cancels[: protocol.MAX_CANCELS]
        out = self._raw(action, {**args, "cancel": cancel})
        if cancel:
            with self._cancels_lock:
                self._cancels = [c for c in self._cancels if c not in cancel]
        return out

    def _call_options(self) -> flight.FlightCallOptions:
        """A call's options: with the time left to the thread's send deadline, if any, else
        the operation timeout plus what the server may wait for the call."""
        left = self._deadline.left()
        if left is not None:
            return flight.FlightCallOptions(headers=self._headers, timeout=left)
        wait = self._server_wait()
        if not wait:
            return self._op_options
        return flight.FlightCallOptions(headers=self._headers, timeout=self._op_timeout_s + wait)

    def _server_wait(self) -> float:
        """Seconds this broker may wait on behalf of the thread's call (see ServerWait)."""
        kind, seconds = self._wait.kind, self._wait.seconds
        if kind == "receive":
            return self._max_wait_s if seconds is None else min(seconds, self._max_wait_s)
        if kind == "decide":
            return self._decide_s if seconds is None else seconds
        return 0.0

    def _unanswered(self, call: str) -> errors.Timeout:
        """The error of a call the broker did not answer in time: SendTimedOut under the
        thread's send deadline, else the operation timeout's (OperationTimedOut)."""
        if self._deadline.at is not None:
            return SendTimedOut(f"broker at {self.service_url} did not answer")
        return self._timed_out(call)

    def _timed_out(self, call: str) -> OperationTimedOut:
        wait = self._server_wait()
        extra = f" (+{wait:g} s the broker may wait for it)" if wait else ""
        return OperationTimedOut(
            f"{call}: broker at {self.service_url} did not answer within "
            f"operation_timeout_seconds={self._op_timeout_s:g}{extra}"
        )

    def _call(self, action: str, args: dict, payload: bytes = b"", owner=None) -> list[bytes]:
        """A call in this session; a lost session (the broker restarted) is opened again and
        the owner's handle re-created, then the call is made once more."""
        if self._closed:
            raise errors.AlreadyClosed("client is closed")
        for attempt in (0, 1):
            if owner is not None:
                args = {**args, "handle": owner._ensure()}
            # A handle's calls name the generation it was made in (see _raw).
            seen = owner._generation if owner is not None else self._generation
            try:
                return self._raw(action, args, payload, seen if owner is not None else None)
            except SessionLost:
                if attempt:
                    raise
                self._reopen(seen)
        raise AssertionError("unreachable")

    def _json(self, action: str, args: dict, payload: bytes = b"", owner=None) -> dict:
        (out,) = self._call(action, args, payload, owner)
        return unframe(out, 1 << 62)[0]

    def _json_once(self, action: str, args: dict, owner=None, held=None) -> dict:
        """``_json`` of a call that a second run would not answer as the first (an admin
        skip or delete, an unsubscribe): numbered, so that re-sent after its answer was lost
        it gets the first answer (server/replay.py). Its number is never another call's.
        `held` (HeldNumbers): the numbers of a call its caller makes again, kept by it."""
        if held is not None:
            return self._json(action, {**args, **held.at(self)}, owner=owner)
        held = HeldNumbers()
        try:
            return self._json(action, {**args, **held.at(self)}, owner=owner)
        finally:
            held.release()

    def _keep_alive(self, every: float) -> None:
        while not self._stop.wait(every):
            if self._closing.is_set():  # no call starts that close() would have to wait for
                return
            seen = self._generation
            try:
                # Bounded, so a paused broker holds neither this thread nor a reopen for ever.
                with self._deadline.until(time.monotonic() + CLOSE_TIMEOUT_S):
                    try:
                        self._raw_cancelling("keepalive", {})
                    except SessionLost:
                        self._reopen(seen)
            except errors.PulsarTxnError:
                pass
            except Exception:  # noqa: BLE001 - closed under it ("FlightClient is closed")
                if self._stop.is_set():
                    return
                raise


class HeldNumbers:
    """The numbers one call that must run once took at each broker it went to, kept until
    it is over: a cluster client that makes it again (its owner restarted or was out of
    reach) sends a broker the number it had there, so the broker finds what it did
    (messaging/once.py) rather than doing it twice. The numbers of a session's calls stay
    taken across its reopening: a call in flight keeps the broker's rows under it."""

    __slots__ = ("_taken",)

    def __init__(self) -> None:
        self._taken: dict[int, tuple] = {}  # id(connection) -> (connection, call, numbers)

    def at(self, conn) -> dict:
        got = self._taken.get(id(conn))
        if got is None:
            call, numbers = conn._once.take(0)  # one generation: never forgotten
            got = self._taken[id(conn)] = (conn, call, numbers)
        return got[2]

    def release(self) -> None:
        for conn, call, _ in self._taken.values():
            conn._once.done(call)
        self._taken.clear()
