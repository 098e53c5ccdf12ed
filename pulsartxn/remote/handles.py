"""The remote client's handles on what lives on the broker: the base of producers and
consumers (re-created in a new session when the old one is lost) and transactions.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .. import errors
from .._native import TxnID
from .._native.keywords import strict_class
from ..messaging.consumer import check_count
from ..messaging.message import Message, MessageId
from ..server import protocol
from ..server.protocol import SessionLost
from ..txn.state import FINAL, TxnState
from ..txn.transaction import TransactionContext, end_wait_s

if TYPE_CHECKING:
    from .client import RemoteClient


# The longest a close waits for a broker (a call that gets no answer); a broker that refuses
# connections is not retried on close, so close() then returns at once. Keepalive calls end
# within it too, so a closing client joins its keepalive thread by then.
CLOSE_TIMEOUT_S = 5.0


class Unreachable(errors.BrokerUnavailable):
    """The broker a call was sent to could not be reached (after retrying): another broker of
    a cluster may answer instead."""


class SendTimedOut(errors.Timeout):
    """A call made for a send ended at the send's deadline (send_timeout_millis): the broker
    was unreachable or did not answer. Whether it stored the messages is unknown."""


class OperationTimedOut(errors.Timeout):
    """A call not answered within the operation timeout (plus what the server may wait for
    it): the broker is alive but silent. Whether it did what was asked is unknown."""


# A call for a send that ended unanswered: at the send's deadline, or the operation timeout.
TIMED_OUT = (SendTimedOut, OperationTimedOut)


class ServerWait(threading.local):
    """What the server may wait on behalf of this thread's call: ("receive", s) up to its max
    wait, ("decide", s or None: its operation timeout) for an end. The call's deadline is the
    operation timeout plus that, so no call is cut while the server may still be working."""

    kind: str | None = None
    seconds: float | None = None

    @contextlib.contextmanager
    def allow(self, kind: str, seconds: float | None) -> Iterator[None]:
        outer = self.kind, self.seconds
        self.kind, self.seconds = kind, seconds
        try:
            yield
        finally:
            self.kind, self.seconds = outer


class SendDeadline(threading.local):
    """When the send this thread is making gives up (time.monotonic(); None: no send, or no
    send timeout): every call the thread makes on the client's connections ends by then."""

    at: float | None = None

    @contextlib.contextmanager
    def until(self, at: float) -> Iterator[None]:
        outer = self.at
        self.at = at if outer is None else min(outer, at)
        try:
            yield
        finally:
            self.at = outer

    def left(self) -> float | None:
        """Seconds left (None: no deadline); SendTimedOut once it has passed."""
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise SendTimedOut("not answered within the send timeout")
        return left


def unreachable(client, exc, renew: bool = True) -> Unreachable:
    """The error of a call that found the broker unreachable; the client's next calls go
    through a new channel (`renew`: not renewed here, by a caller that renewed it already)."""
    if renew:
        client._channel_lost()
    return Unreachable(f"broker at {client.service_url} unreachable: {exc}")


def txn_str(txn) -> str | None:
    """The wire form of a `txn=` argument (a RemoteTransaction, a TxnID, its str or int)."""
    if txn is None:
        return None
    if isinstance(txn, RemoteTransaction):
        return str(txn.id)
    if isinstance(txn, TxnID):
        return str(txn)
    if isinstance(txn, str):
        return str(TxnID.parse(txn))
    if isinstance(txn, int) and not isinstance(txn, bool):
        return str(TxnID.from_int(txn))
    raise TypeError(f"txn must be a Transaction or TxnID, not {type(txn).__name__}")


def mid_hex(msg_or_id) -> str:
    """The wire form of the id of a Message or MessageId."""
    if isinstance(msg_or_id, Message):
        msg_or_id = msg_or_id.message_id()
    if not isinstance(msg_or_id, MessageId):
        raise TypeError(f"expected a Message or MessageId, not {type(msg_or_id).__name__}")
    return msg_or_id.serialize().hex()


class DeliveringCalls:
    """The numbers of a consumer's or reader's delivering calls (see Handle._delivering):
    fresh for each call but one whose answer was lost, which the next call of the same kind
    takes over (a receive's answer is one message, a batch's a list); with each, the lowest
    number still unanswered (`below`: the broker forgets the answers under it). A new
    server-side handle (the session opened again) starts anew; so do a seek and a
    redelivery (`forget`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._open: dict[int, str] = {}  # call -> its kind
        self._lost: list[tuple[int, str]] = []
        self._generation = None

    def take(self, generation: int, kind: str = "") -> tuple[int, dict]:
        with self._lock:
            if generation != self._generation:
                self._generation, self._open, self._lost = generation, {}, []
            lost = next((i for i, (_, k) in enumerate(self._lost) if k == kind), None)
            if lost is not None:
                call = self._lost.pop(lost)[0]
            else:
                call, self._next = self._next, self._next + 1
            self._open[call] = kind
            below = min([*self._open, *(c for c, _ in self._lost)])
        return call, {"call": call, "below": below}

    def done(self, call: int, lost: bool = False) -> None:
        with self._lock:
            kind = self._open.pop(call, None)
            if kind is not None and lost:
                self._lost.append((call, kind))

    @contextlib.contextmanager
    def numbered(self, generation: int, kind: str) -> Iterator[dict]:
        """The numbers of a delivering call of `kind`, for its arguments; one that raises
        without an answer (Unreachable, SendTimedOut, OperationTimedOut) leaves its number
        to the next call of its kind."""
        call, numbers = self.take(generation, kind)
        lost = False
        try:
            yield numbers
        except (Unreachable, SendTimedOut, OperationTimedOut):
            lost = True
            raise
        finally:
            self.done(call, lost)

    def lost_mixed(self, generation: int, kind: str) -> list[str]:
        """The kinds of the lost calls, oldest first, when one of them is not of `kind` (what
        it was given cannot be the answer of a call of `kind`); else none."""
        with self._lock:
            if generation != self._generation or all(k == kind for _, k in self._lost):
                return []
            return [k for _, k in sorted(self._lost)]

    def forget(self) -> None:
        with self._lock:
            self._open, self._lost = {}, []


class Handle:
    """A server-side object re-created in a new session when the old one is lost."""

    def __init__(self, client: RemoteClient) -> None:
        self._client = client
        self._handle = None
        self._generation = -1
        self._closed = False
        self._calls = DeliveringCalls()
        # Messages given to lost calls of another kind, made again (_given_first): the next
        # delivering calls return them first, in order (those of the server-side handle of
        # _recovered_in: a new one delivers them again itself).
        self._recovered: list[Message] = []
        self._recovered_in = -1
        self._recovering = threading.Lock()

    def _ensure(self) -> int:
        if self._closed:
            raise errors.AlreadyClosed(f"{type(self).__name__} is closed")
        if self._generation != self._client._generation or self._handle is None:
            try:
                with self._client._making() as generation:
                    self._handle = self._create()
            except SessionLost:  # the server restarted before the client noticed
                self._client._reopen(generation)
                with self._client._making() as generation:
                    self._handle = self._create()
            self._generation = generation
        return self._handle

    def _wait_for_message(self, action: str, timeout_millis: int | None) -> Message:
        """One message by `action` (receive, read_next) within timeout_millis (None: for
        ever); the server waits at most its max wait a call, so a longer wait asks again."""
        check_count("timeout_millis", timeout_millis, least=0, optional=True)
        given = self._given_first(action, 1)
        if given:
            return given[0]
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        while True:
            left = None if deadline is None else max(int((deadline - time.monotonic()) * 1000), 0)
            wait = None if left is None else left / 1000.0
            try:
                with self._client._wait.allow("receive", wait):
                    (body,) = self._delivering(action, {"timeout_millis": left})
            except OperationTimedOut:
                raise  # the broker did not answer: not a wait that ended empty
            except errors.Timeout:
                if deadline is None or time.monotonic() < deadline:
                    continue  # the server's wait ended before ours
                raise
            return protocol.decode_message(body)

    def _delivering(self, action: str, args: dict) -> list[bytes]:
        """A call that hands messages over (receive, read_next, read_many), numbered: made
        again after its answer was lost, it gets the same messages (server/replay.py). One
        whose answer never came (unreachable, not answered in time) leaves its number to the
        next such call, which then gets what that one was given."""
        with self._calls.numbered(self._generation, action) as numbers:
            return self._client._call(action, {**args, **numbers}, owner=self)

    def _given_first(self, kind: str, n: int) -> list[Message]:
        """Up to `n` messages that lost calls were given, for a delivering call of `kind` to
        return before asking for more. A lost call's number passes to the next call of its
        kind; when one is of another kind (a receive lost, then a batch_receive), every lost
        call is made again now, oldest first and waiting for nothing, and what they were
        given comes first, in order: never held by nobody, never overtaken by later ones."""
        with self._recovering:
            self._ensure()
            if self._recovered_in != self._generation:
                self._recovered.clear()
            if not self._recovered:
                self._recovered_in = self._generation
                for lost in self._calls.lost_mixed(self._generation, kind):
                    self._recovered.extend(self._again(lost))
            given, self._recovered[:n] = self._recovered[:n], []
        return given

    def _again(self, kind: str) -> list[Message]:
        """A lost call of `kind` made again under its number, waiting for nothing."""
        if kind == "read_many":
            bodies = self._delivering(kind, {"max_num_messages": 1})
        else:  # receive, read_next
            try:
                bodies = self._delivering(kind, {"timeout_millis": 0})
            except OperationTimedOut:
                raise
            except errors.Timeout:
                return []  # it had been given nothing: there is nothing to return
        return [protocol.decode_message(body) for body in bodies]

    def _message_available(self) -> bool:
        """A consumer's or reader's has_message_available: one kept from a lost call, or one
        the broker has."""
        if self._recovered:
            return True
        return self._client._json("has_message_available", {}, owner=self)["value"]

    def _forget_given(self) -> None:
        """A seek or a redelivery: nothing given before is given again by a lost call."""
        with self._recovering:
            self._calls.forget()
            self._recovered.clear()

    # Subclasses define close(), which a with-block calls on exit.

    def is_connected(self) -> bool:
        """Whether it is still open (as the embedded producer's and consumer's)."""
        return not self._closed

    def _close_remote(self, action: str, handle) -> None:
        """Close the server-side object, if it belongs to the live session (one of a lost
        session went with it); the server's errors are not the caller's concern here."""
        if handle is not None and self._generation == self._client._generation:
            try:
                with self._client._deadline.until(time.monotonic() + CLOSE_TIMEOUT_S):
                    self._client._raw(action, {"handle": handle})
            except errors.PulsarTxnError:
                pass

    def _close_handle(self, action: str) -> None:
        """Close it here and at the broker, and stop its listener: within CLOSE_TIMEOUT_S (a
        listener's call the broker does not answer is not waited for past it)."""
        if self._closed:
            return
        handle = self._handle
        self._closed = True
        close_by = time.monotonic() + CLOSE_TIMEOUT_S
        with self._client._deadline.until(close_by):
            self._close_remote(action, handle)
            close_by = self._client._deadline.at  # a client's close may bound it sooner
        listener = getattr(self, "_listener", None)
        if listener is not None:
            listener.stop(max(close_by - time.monotonic(), 0.0))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@strict_class
class RemoteTransaction(TransactionContext):
    def __init__(
        self,
        client: RemoteClient,
        txn_id: TxnID,
        counted: bool = True,
        capability: str | None = None,
    ) -> None:
        self._client = client
        self.id = txn_id
        # The secret that lets another session end or use it: give it, with the id, to the
        # process that is to (client.transaction(id, capability=...)).
        self.capability = capability
        # Acks per (partition, subscription) and messages per partition made through this
        # handle; `counted`: it opened the transaction, so they are all of them (its commit
        # states them, and the broker checks it still holds them).
        self._ack_counts: dict = {}
        self._send_counts: dict = {}
        self._counted = counted
        self._producers: weakref.WeakSet = weakref.WeakSet()  # with queued sends of this txn
        self._error: BaseException | None = None  # a send of it that timed out
        self._end_unknown = False  # an end of it was not answered: it may have gone through

    def _send_failed(self, exc: BaseException) -> None:
        """A send or an ack of it timed out (it may or may not be in it): it can only abort
        now, as Pulsar's transaction whose op failed."""
        if self._error is None:
            self._error = exc

    def _check_committable(self, outcome: str = "abort it") -> None:
        if self._error is not None:
            raise errors.InvalidTxnStatus(
                f"transaction {self.id} cannot commit: an op of it failed ({self._error}); "
                f"{outcome}"
            ) from self._error

    def _stored(self, partitions) -> None:
        for name, n in partitions:
            self._send_counts[name] = self._send_counts.get(name, 0) + n

    @property
    def state(self) -> TxnState:
        out = self._client._json("txn_state", {"txn": str(self.id), "capability": self.capability})
        return TxnState(out["state"])

    def _flush_for_commit(self) -> None:
        # Everything sent in the transaction lands (or fails) first: its batch streams are
        # closed, whatever handle or id they were opened with (what was written to them is in
        # it; one that failed fails it), its producers' queued sends answered.
        error = self._client._streams.close_for_commit(str(self.id))
        if error is not None:
            self._send_failed(error)
        self._queued_answered()

    def _queued_answered(self) -> None:
        """Its producers' queued sends sent and answered (SendTimedOut past the thread's
        send deadline, which they share)."""
        for producer in list(self._producers):
            producer._answered()

    def _end(self, commit: bool, timeout_ms) -> None:
        wait = end_wait_s(timeout_ms)
        if commit:
            self._flush_for_commit()
            if self._error is not None:
                outcome = "it was aborted"
                try:
                    self._end(False, timeout_ms)
                except errors.PulsarTxnError as exc:
                    outcome = f"its abort failed too ({exc})"
                self._check_committable(outcome)
        else:
            # Its queued sends go first, as a commit's do: stored in it, then aborted with
            # it, their sequence ids do not count (after a restart too), and their futures
            # are answered now, not when the batching delay would have sent them.
            try:
                self._queued_answered()
            except errors.PulsarTxnError:
                pass  # not answered in time: the abort goes on, later sends are late
        retries = self._client._retries
        what = "commit" if commit else "abort"
        kind = self._client._spares.wanted()
        begin_next = None if kind is None else {"timeout_ms": kind[0], "coordinator_id": kind[1]}
        out = None
        try:
            with self._client._wait.allow("decide", wait):
                out = self._client._json(
                    "end",
                    {
                        "txn": str(self.id),
                        "capability": self.capability,
                        "commit": commit,
                        "timeout_ms": timeout_ms,
                        "counted": self._counted,
                        "expected_acks": [[list(k), n] for k, n in self._ack_counts.items()],
                        "expected_sends": sorted(self._send_counts.items()),
                        "next": begin_next,  # a spare transaction (remote/spare.py)
                    },
                )
        except OperationTimedOut as exc:
            self._end_unknown = True
            raise OperationTimedOut(
                f"{what} of transaction {self.id}: {exc}; its state is unknown to the client "
                f"(the broker may still {what} it): read its state, or {what} again (a "
                f"repeated {what} is idempotent)"
            ) from None
        except errors.InvalidTxnStatus:
            # Re-sent after a lost connection or an unanswered end, the first attempt may
            # have gone through.
            wanted = TxnState.COMMITTED if commit else TxnState.ABORTED
            if self._client._retries == retries and not self._end_unknown:
                raise
            if not self._settles_as(wanted):
                raise
        finally:
            spare = None if out is None else out.get("next")
            self._client._ended(kind, spare, str(self.id), out is not None)
        self._end_unknown = False
        self._client._streams.ended(str(self.id))

    def _settles_as(self, wanted: TxnState) -> bool:
        """Whether the transaction ends `wanted` (an end still finishing is waited for, up to
        the operation timeout)."""
        by = time.monotonic() + self._client._op_timeout_s
        while True:
            state = self.state
            if state is wanted or state in FINAL or time.monotonic() > by:
                return state is wanted
            time.sleep(0.05)

    def commit(self, timeout_ms: float | None = None) -> None:
        self._end(True, timeout_ms)

    def abort(self, timeout_ms: float | None = None) -> None:
        self._end(False, timeout_ms)

    def __repr__(self) -> str:
        return f"RemoteTransaction({self.id})"
