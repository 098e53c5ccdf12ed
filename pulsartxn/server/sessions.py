"""The network service's sessions: what each may hold, who may call what, and the secrets
(capabilities) that let one session use another's transactions and groups.

A session that stops sending keep-alives (the client died or was cut off), or that its client
closes, is closed: its consumers' unacknowledged messages go back to be redelivered, its
producers are closed, and the open transactions only it held are aborted (nobody else could end
them), but those in a group, which their group's decision or their timeout ends. A server that
stops keeps its sessions' transactions: clients reconnect under the same session id and go on;
those whose session does not come back within the session timeout are aborted as above.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pyarrow.flight as flight

from .. import errors
from ..messaging import once
from ..messaging.topics import check_create_id
from ..txn.log import IN_PROCESS
from ..txn.state import FINAL
from .protocol import SessionLost, id_list

T = TypeVar("T")

log = logging.getLogger(__name__)

MAX_SESSIONS = 4096  # clients connected at once (each may hold SessionLimits)
# A session's transaction handles are pruned of ended ones when they exceed this (and twice
# what was left after the last pruning).
_PRUNE_TXNS_AT = 1024
CAPABILITY_KEY = b"server/capability-key"
# Creates of handles a session remembers by their id, for a cancel from its client (the last
# ones only: a cancel comes with the client's next calls); and how long a cancel waits for a
# create of it still under way.
_CREATES_KEPT = 1024
_CANCEL_WAIT_S = 10.0
# The ends whose spare a session remembers (the last ones), for a client that lost an end's
# answer and names that end in a later call.
_REMEMBERED_SPARES = 1024
# Group labels the server keeps as claimed (a claim is refused while its label is kept), the
# newest; and those each session is known to hold. Bounded: a client claiming label after
# label takes no more of the server's memory than this.
RESERVED_LABELS = 65_536
SESSION_LABELS = 1024
ADMIN, CLIENT = "admin", "client"


@dataclass(frozen=True)
class SessionLimits:
    """What one session may hold at once: past them, a typed QuotaExceeded, never memory or
    threads taken from the others."""

    consumers: int = 1024
    producers: int = 1024
    transactions: int = 10_000  # open transactions it opened or holds
    waiting_receives: int = 256  # receives parked on the server, each holding a thread
    streams: int = 256  # bulk streams open (DoPut, a scan's DoGet), each holding a thread

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"the session limit {name} must be at least 1, not {value!r}")


def create_id(args: dict) -> str | None:
    """The client's id of a create call (Session.keep), if it names one."""
    return check_create_id(args.get("create_id"))


def _hold(s: Session, count: str, limit: int, what: str) -> Callable[[], None]:
    """One more of what session `s` counts in its attribute `count`, within `limit`
    (QuotaExceeded past it); returns the release, which takes it back once."""
    with s.lock:
        room(getattr(s, count), limit, what)
        setattr(s, count, getattr(s, count) + 1)
    held = [True]

    def release() -> None:
        with s.lock:
            if held[0]:
                held[0] = False
                setattr(s, count, getattr(s, count) - 1)

    return release


def room(count: int, limit: int, what: str) -> None:
    if count >= limit:
        raise errors.QuotaExceeded(f"a session may hold at most {limit} {what}")


class Session:
    """One remote client's session: its in-process client and the handles it holds."""

    def __init__(self, sid: str, client) -> None:
        self.id = sid
        self.client = client
        self.producers: dict[int, object] = {}
        self.consumers: dict[int, object] = {}
        self.txns: dict[str, object] = {}
        # Group labels it holds (claimed, or their capability presented), the last used
        # SESSION_LABELS: past them it presents a label's capability again, as its client does.
        self.groups: OrderedDict[str, None] = OrderedDict()
        self.waiting = 0  # receives parked on the server
        self.streams = 0  # bulk streams open
        self._prune_at = _PRUNE_TXNS_AT
        self.last_seen = time.monotonic()
        self.lock = threading.Lock()
        self.closed = False  # nothing is kept once set (under the lock)
        # create id -> (table, handle) it made, or None: cancelled (a late create is refused)
        self._creates: OrderedDict[str, tuple[dict, int] | None] = OrderedDict()
        self._making: dict[str, threading.Event] = {}  # creates under way, by id
        # ended transaction -> the spare begun with its end (remote/spare.py), the last ones
        self._spares: OrderedDict[str, str] = OrderedDict()

    def remember(self, key: str, txn) -> None:
        """Keep the handle of a transaction this session uses (its acks and pending sends are
        counted there). Those that have ended are dropped once they pile up: a long session
        runs millions of transactions, and one that timed out is never ended by its client.
        Not those in ERROR (not in FINAL): a coordinator that cannot answer now may hold one
        open."""
        with self.lock:
            self.txns[key] = txn
            if len(self.txns) > self._prune_at:
                self.txns = {k: t for k, t in self.txns.items() if t.state not in FINAL}
                self._prune_at = max(_PRUNE_TXNS_AT, 2 * len(self.txns))

    def prune(self) -> None:
        """Drop the handles of transactions that have ended."""
        with self.lock:
            self.txns = {k: t for k, t in self.txns.items() if t.state not in FINAL}

    def forget(self, key: str) -> None:
        with self.lock:
            self.txns.pop(key, None)

    def holds_label(self, label: str) -> None:
        with self.lock:
            self.groups[label] = None
            self.groups.move_to_end(label)
            if len(self.groups) > SESSION_LABELS:
                self.groups.popitem(last=False)

    def take_spare(self, ended: str) -> str | None:
        """The spare begun with the end of `ended`, if one is remembered (forgotten here)."""
        with self.lock:
            return self._spares.pop(ended, None)

    def spare_begun(self, ended: str, spare: str) -> None:
        with self.lock:
            self._spares[ended] = spare
            if len(self._spares) > _REMEMBERED_SPARES:
                self._spares.popitem(last=False)

    def keep(
        self, table: dict, handle: int, make: Callable[[], T], create_id: str | None = None
    ) -> T:
        """Make a producer, consumer or reader of this session and keep it in `table` under
        `handle`. One made while the session is being closed is closed again: SessionLost,
        so its client makes it anew (else it would outlive its session, holding its place).
        `create_id`: the client's name for this create, which it cancels if it gave up waiting
        for the answer; a create cancelled before or while it is made keeps nothing. The same
        create sent again (its answer was lost with the connection) replaces what it made."""
        earlier = None
        if create_id is not None:
            with self.lock:
                if create_id in self._creates:
                    kept = self._creates.pop(create_id)
                    if kept is None:
                        raise errors.PulsarTxnError(
                            f"create {errors.excerpt(create_id)} was cancelled"
                        )
                    earlier = kept[0].pop(kept[1], None)
                done = self._making[create_id] = threading.Event()
        try:
            if earlier is not None:
                with contextlib.suppress(errors.PulsarTxnError):
                    earlier.close()
            try:
                made = make()
            except errors.AlreadyClosed:
                if self.closed:
                    raise SessionLost("the session was closed") from None
                raise
            with self.lock:
                cancelled = create_id is not None and create_id in self._creates
                if not self.closed and not cancelled:
                    table[handle] = made
                    if create_id is not None:
                        self._remember_create(create_id, (table, handle))
                    return made
            made.close()
            if cancelled:  # nobody waits for this answer: its client gave up on it
                raise errors.PulsarTxnError(f"create {errors.excerpt(create_id)} was cancelled")
            raise SessionLost("the session was closed")
        finally:
            if create_id is not None:
                with self.lock:
                    self._making.pop(create_id, None)
                done.set()

    def cancel(self, create_ids) -> None:
        """The client gave up on these creates (not answered in time): what they made is
        closed, and one not yet made never will be (a create under way is waited for)."""
        for create_id in id_list(create_ids, "cancel", "create ids (str)"):
            with self.lock:
                under_way = self._making.get(create_id)
            if under_way is not None:
                under_way.wait(_CANCEL_WAIT_S)
            made = None
            with self.lock:
                kept = self._creates.get(create_id)
                if kept is not None:
                    table, handle = kept
                    made = table.pop(handle, None)
                self._remember_create(create_id, None)
            if made is not None:
                with contextlib.suppress(errors.PulsarTxnError):
                    made.close()

    def _remember_create(self, create_id: str, kept) -> None:
        self._creates[create_id] = kept
        self._creates.move_to_end(create_id)
        while len(self._creates) > _CREATES_KEPT:
            self._creates.popitem(last=False)

    def close(self) -> None:
        with self.lock:
            self.closed = True
        for c in list(self.consumers.values()):
            try:
                c.close()  # unacknowledged messages are redelivered to others
            except errors.PulsarTxnError:
                pass
        try:
            self.client.close()
        except errors.PulsarTxnError:
            pass


class Role(flight.ServerMiddleware):
    """What the call's credentials allow: ADMIN (every call) or CLIENT (no admin call)."""

    def __init__(self, role: str) -> None:
        self.role = role


class AuthFactory(flight.ServerMiddlewareFactory):
    """Bearer tokens, as Pulsar's roles: the admin token allows every call, the client token
    every call but the admin ones. A kind without a token is open to all (no token at all:
    development on loopback)."""

    def __init__(self, token: str | None, admin_token: str | None) -> None:
        self._client = b"Bearer " + token.encode() if token else None
        self._admin = b"Bearer " + admin_token.encode() if admin_token else None

    def start_call(self, info, headers):
        values = headers.get("authorization") or headers.get("Authorization") or []
        got = values[0].encode() if values else b""
        # Both compared, in constant time, whatever the first says.
        is_admin = self._admin is not None and hmac.compare_digest(got, self._admin)
        is_client = self._client is not None and hmac.compare_digest(got, self._client)
        if is_admin or (self._admin is None and self._client is None):
            return Role(ADMIN)
        if is_client or self._client is None:
            return Role(CLIENT)
        raise flight.FlightUnauthenticatedError("missing or wrong bearer token")


class Sessions:
    """The server's sessions (opened by hello, reaped when silent) and the capabilities that
    let a session use what another opened. The role of the call in this thread decides
    whether capabilities are needed (an admin's call needs none)."""

    def __init__(self, broker, timeout_s: float, limits: SessionLimits, max_sessions: int) -> None:
        self.broker = broker
        self.timeout_s = timeout_s
        self.limits = limits
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        # Sessions being closed: a hello of the same id waits until what they held is gone
        # (an exclusive consumer made again would find the old one still there).
        self._closing: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # the call's role
        self._key = _capability_key(broker)
        # Group labels claimed (their capability given out), oldest first: RESERVED_LABELS.
        self._reserved: OrderedDict[str, None] = OrderedDict()
        self._claims = threading.Lock()  # a label is claimed by one session
        self._stopped = threading.Event()
        self._started = time.monotonic()
        self._swept = False  # the transactions of sessions gone with a previous server
        self._reaper = threading.Thread(target=self._reap, name="pulsartxn-sessions", daemon=True)
        self._reaper.start()

    # -- lifecycle -------------------------------------------------------------------------

    def open(self, sid) -> bool:
        """Open session `sid` (a hello), or keep the one of that id (a reconnect); whether
        it is new here (what the client had in it is gone)."""
        if not isinstance(sid, str) or not 8 <= len(sid) <= 64:
            raise ValueError("hello needs a session id of 8..64 characters")
        while True:
            with self._lock:
                closing = self._closing.get(sid)
                if closing is None:
                    return self._open(sid)
            closing.wait()

    def _open(self, sid: str) -> bool:
        """open(), the lock held and no session of that id being closed."""
        if sid not in self._sessions:
            if len(self._sessions) >= self.max_sessions:
                raise errors.QuotaExceeded(
                    f"the server holds its limit of {self.max_sessions} sessions "
                    "(pulsartxn serve --max-sessions)"
                )
            self._sessions[sid] = Session(sid, self.broker.client(session=sid))
            return True
        return False

    def get(self, args: dict) -> Session:
        """The session a call names (it is alive: its last call is now)."""
        sid = args.get("session")
        with self._lock:
            s = self._sessions.get(sid) if isinstance(sid, str) else None
        if s is None:
            raise SessionLost(f"unknown session {errors.excerpt(sid)}")
        s.last_seen = time.monotonic()
        if args.get("cancel"):  # creates its client gave up on (Session.cancel)
            s.cancel(args["cancel"])
        return s

    def count(self) -> int:
        """Sessions open now (a dict's length, read without the lock: for metrics)."""
        return len(self._sessions)

    def live(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def close(self, sid) -> None:
        """Close session `sid` (its client said so), if it is open."""
        with self._lock:
            s = self._sessions.pop(sid, None)
            if s is not None:
                self._closing[sid] = threading.Event()
        if s is not None:
            self._close(s)

    def _close(self, s: Session) -> None:
        """Close a session taken out of the live ones (and in _closing), and its orphans."""
        try:
            s.close()
            self.abort_orphans(s)
            with contextlib.suppress(errors.PulsarTxnError):  # the broker is closing
                once.forget(self.broker.storage, [s.id])  # its calls can come no more
        finally:
            with self._lock:
                self._closing.pop(s.id).set()

    def shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for s in sessions:
            s.close()

    def close_consumers(self) -> None:
        """Close every session's consumers and readers: a receive parked on the server wakes
        (a stop whose clients were cut off); producers stay until their calls end."""
        for s in self.live():
            for c in list(s.consumers.values()):
                with contextlib.suppress(errors.PulsarTxnError):
                    c.close()

    def _reap(self) -> None:
        while not self._stopped.wait(min(1.0, self.timeout_s / 4)):
            now = time.monotonic()
            with self._lock:
                dead = [s for s in self._sessions.values() if now - s.last_seen > self.timeout_s]
                for s in dead:
                    del self._sessions[s.id]
                    self._closing[s.id] = threading.Event()
            for s in dead:
                log.info("a session expired: closing its consumers and producers")
                self._close(s)
            if not self._swept and now - self._started > self.timeout_s:
                self._swept = True
                self.abort_orphans(None)
                self._forget_gone()

    def _forget_gone(self) -> None:
        """Drop the once-call rows of sessions that did not come back after a restart."""
        storage = self.broker.storage
        with contextlib.suppress(errors.PulsarTxnError):
            once.forget(storage, sorted(once.owners(storage) - {s.id for s in self.live()}))

    def abort_orphans(self, gone: Session | None) -> None:
        """Abort the open transactions no live session holds (opened, or used by id) and no
        group claims: those of the session `gone`, or (None) those of sessions that did not
        come back after a restart."""
        live = self.live()
        sids = {s.id for s in live}
        held = {key for s in live for key in list(s.txns)}
        mine = set(gone.txns) if gone is not None else set()

        def orphan(meta) -> bool:
            if meta.group is not None or meta.owner is None or meta.owner == IN_PROCESS:
                return False
            key = str(meta.txn_id)
            if meta.owner in sids or key in held:
                return False
            return gone is None or meta.owner == gone.id or key in mine

        try:
            self.broker.txn.abort_orphans(self.broker.txn.owned(orphan))
        except errors.PulsarTxnError:
            pass  # the broker is closing

    @contextlib.contextmanager
    def waiting(self, s: Session):
        """A receive parked on the server for `s` (each holds a server thread)."""
        release = _hold(s, "waiting", self.limits.waiting_receives, "receives waiting at once")
        try:
            yield
        finally:
            release()

    def stream(self, s: Session) -> Callable[[], None]:
        """A bulk stream opened for `s` (a DoPut, a scan's DoGet: each holds a server thread
        while its client writes or reads, however slowly); returns its release."""
        return _hold(s, "streams", self.limits.streams, "streams open at once")

    # -- roles and capabilities: a secret per transaction and per group label --------------

    def set_role(self, admin: bool) -> None:
        """The role of the call this thread serves."""
        self._local.admin = admin

    def admin(self) -> bool:
        return getattr(self._local, "admin", True)

    def capability(self, what: bytes) -> str:
        return hmac.new(self._key, what, "sha256").hexdigest()[:32]

    def _holds(self, what: bytes, capability) -> bool:
        return isinstance(capability, str) and hmac.compare_digest(
            capability.encode(), self.capability(what).encode()
        )

    def txn(self, s: Session, value, required: bool = False, capability=None):
        """The session's handle on a transaction: one it opened or was given the capability
        of (an admin's call needs none)."""
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise TypeError(f"txn must be a TxnID string, not {errors.excerpt(value)}")
        txn = s.txns.get(value)
        if txn is None:
            if not self.admin() and not self._holds(b"txn:" + value.encode(), capability):
                raise errors.NotAuthorized(
                    f"transaction {errors.excerpt(value)} belongs to another session: "
                    "present its capability"
                )
            txn = s.client.transaction(value)
            s.remember(value, txn)
        return txn

    def group(self, s: Session, label, capability, claim: bool) -> str | None:
        """The capability of group `label` for session `s`: it holds it, presents it, or (with
        `claim`) takes it while nobody else does (no live member, not among the claims kept)."""
        if not isinstance(label, str):
            return None  # the call refuses the label itself
        what = b"group:" + label.encode()
        if self.admin() or label in s.groups or self._holds(what, capability):
            s.holds_label(label)
            return self.capability(what)
        if claim:
            with self._claims:
                free = label not in self._reserved and not self.broker.txn.group_members(label)
                if free:
                    self._reserved[label] = None
                    if len(self._reserved) > RESERVED_LABELS:
                        # The oldest claim goes: its holders keep their capability, and it
                        # can be claimed again only while it has no live member.
                        self._reserved.popitem(last=False)
            if free:
                s.holds_label(label)
                return self.capability(what)
        raise errors.NotAuthorized(
            f"group {errors.excerpt(label)} belongs to another session: present its capability"
        )


def _capability_key(broker) -> bytes:
    """The server's secret for capabilities, kept in the broker's store (a restarted server
    honours those it gave out): made at the first start; a cluster's is in its metadata."""
    if broker.cluster is not None:
        return broker.cluster.capability_key  # one cluster-wide: any broker checks them
    storage = broker.storage
    with storage.read() as txn:
        raw = txn.get(CAPABILITY_KEY, db=storage.meta)
        if raw is not None:
            return bytes(raw)
    key = secrets.token_bytes(32)  # the data directory is this process's alone (locked)
    storage.write(lambda t: t.put(CAPABILITY_KEY, key, db=storage.meta))
    return key
