"""A cluster client's routing: its connections per broker, lookups of owners and retries."""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING

from .. import errors
from ..messaging.topic_name import TopicName
from ..server.protocol import SessionLost
from .client import RemoteClient
from .handles import SendTimedOut, Unreachable

if TYPE_CHECKING:
    from .cluster import ClusterClient

# How long one connection retries an unreachable broker before the cluster client looks its
# partition or coordinator up again (it may be served elsewhere by then).
CONNECTION_RETRY_S = 1.0
_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 1.0


class ClusterRouting:
    """The part of ClusterClient that finds and follows owners (a mixin of ClusterClient; it
    uses the client's connections, owners, lock and timeouts)."""

    # -- connections and owners --------------------------------------------------------------

    @property
    def _retries(self) -> int:
        """Calls re-sent so far, over every connection (a transaction's end that was re-sent
        may have gone through the first time)."""
        with self._lock:
            conns = list(self._conns.values())
        return self._retry_count + sum(c._retries for c in conns)

    def _capability_of(self, txn: str | None) -> str | None:
        return None if txn is None else self._shared.capabilities.get(txn)

    def _check_open(self) -> None:
        if self._closed:
            raise errors.AlreadyClosed("client is closed")

    def _conn(self, address: str) -> RemoteClient:
        """The connection to the broker at `address`, opened at first use (Unreachable if it
        cannot be reached)."""
        self._check_open()
        with self._lock:
            conn = self._conns.get(address)
        if conn is not None:
            return conn
        conn = RemoteClient._connection(
            address,
            self._roots,
            self._token,
            min(self._reconnect_s, CONNECTION_RETRY_S),
            self._keepalive_s,
            self._shared,
            self._op_timeout_s,
        )
        with self._lock:
            kept = self._conns.setdefault(address, conn)
            closed = self._closed
        if kept is not conn or closed:
            conn.close()  # another thread opened it first, or the client closed meanwhile
            self._check_open()
        return kept

    def _any(self, fn):
        """fn(connection) on any live broker (the one last reached first), for what every
        broker answers (topics' metadata, lookups)."""
        deadline = None
        delay = _BACKOFF_FIRST_S
        while True:
            with self._lock:
                order = [self._home] + [
                    a for a in self._hosts + list(self._conns) if a != self._home
                ]
            last = None
            for address in dict.fromkeys(order):
                try:
                    out = fn(self._conn(address))
                except Unreachable as exc:
                    last = exc
                    continue
                self._home = address
                return out
            now = time.monotonic()
            deadline = deadline or now + self._reconnect_s
            with self._lock:
                self._retry_count += 1
            if now + delay > deadline:
                raise errors.BrokerUnavailable(
                    f"no broker of {self.service_url} could be reached: {last}"
                ) from None
            self._back_off(delay, last)
            delay = min(delay * 2, _BACKOFF_MAX_S)

    def _back_off(self, delay: float, cause) -> None:
        """Sleep `delay` seconds before a retry, but not past the thread's send deadline
        (SendTimedOut once it has passed)."""
        send_by = self._deadline.at
        if send_by is not None:
            left = send_by - time.monotonic()
            if left <= 0:
                raise SendTimedOut(str(cause)) from None
            delay = min(delay, left)
        time.sleep(delay)

    def _owner(self, kind: str, name) -> str:
        key = (kind, name)
        address = self._owners.get(key)
        if address is None:
            out = self._any(lambda c: c._json("lookup", {"kind": kind, "name": name}))
            address = out["address"]
            if not address:  # a broker that is no cluster's answers for itself
                address = self._home
            self._owners[key] = address
        return address

    def _follow(self, kind: str, name, fn):
        """fn(connection to the owner of partition or coordinator `name`); while the owner is
        down, unreachable or elsewhere (NotOwner), looked up again with backoff, up to
        reconnect_timeout_s from the first failure."""
        deadline = None
        delay = _BACKOFF_FIRST_S
        while True:
            conn = None
            try:
                conn = self._conn(self._owner(kind, name))
                seen = conn._generation
                return fn(conn)
            except (errors.BrokerUnavailable, SessionLost) as exc:
                if isinstance(exc, SessionLost):
                    if conn is None:
                        raise
                    _reopen(conn, seen)  # the broker restarted: the session opened again
                else:
                    self._owners.pop((kind, name), None)
                now = time.monotonic()
                deadline = deadline or now + self._reconnect_s
                with self._lock:
                    self._retry_count += 1
                self._check_open()
                if self._closing or now + delay > deadline:
                    raise
                self._back_off(delay, exc)
                delay = min(delay * 2, _BACKOFF_MAX_S)

    def _coordinator(self, coordinator_id: int) -> _CoordinatorRoute:
        return _CoordinatorRoute(self, coordinator_id)

    def _group_coordinator(self, group) -> int:
        if not isinstance(group, str) or not group:
            raise ValueError(f"group must be a non-empty str, not {errors.excerpt(group)}")
        return zlib.crc32(group.encode()) % self._coordinators

    def _partitions(self, topic: str, create: bool = True) -> list[str]:
        """The partitions of `topic` (itself, if not partitioned); an unknown topic is one
        of no partitions, made by its first producer or consumer (`create`)."""
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        try:
            return self.topic_partitions(topic)
        except errors.TopicNotFound:
            if not create:
                raise
            return [TopicName.parse(topic).full]


class _CoordinatorRoute:
    """Calls at the owner of one coordinator: what a RemoteTransaction's handle uses as its
    client (its state and its end go to the coordinator, wherever it is served)."""

    def __init__(self, cluster: ClusterClient, coordinator_id: int) -> None:
        self._cluster = cluster
        self.coordinator_id = coordinator_id

    @property
    def _spares(self):
        return self._cluster._spares

    @property
    def _streams(self):
        return self._cluster._shared.streams

    def _ended(self, kind, spare, txn, answered) -> None:
        self._cluster._ended(kind, spare, txn, answered)

    @property
    def _retries(self) -> int:
        return self._cluster._retries

    @property
    def _wait(self):
        return self._cluster._wait

    @property
    def _op_timeout_s(self) -> float:
        return self._cluster._op_timeout_s

    def _capability_of(self, txn):
        return self._cluster._capability_of(txn)

    def call(self, fn):
        self._cluster._check_open()
        return self._cluster._follow("coordinator", self.coordinator_id, fn)

    def _json(self, action: str, args: dict, payload: bytes = b"", owner=None) -> dict:
        return self.call(lambda c: c._json(action, args, payload))


def _reopen(conn: RemoteClient, seen: int) -> None:
    try:
        conn._reopen(seen)
    except (errors.BrokerUnavailable, SessionLost):
        pass  # retried as any call
