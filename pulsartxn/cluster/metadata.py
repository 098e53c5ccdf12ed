"""The cluster's metadata in ZooKeeper, through kazoo. Under the cluster's root:

    config                    persistent: the cluster's coordinator and bundle counts and
                              its capability key (set by its first broker)
    brokers/<broker id>       ephemeral: the broker is live; its data is its address
    owners/<kind>/<id>        persistent: the broker whose data directory holds it
    topics/<quoted full name> persistent: a topic's partition count and the id of the
                              call that created it

Ownership sticks: a partition's data lives in its owner's store (there is no replication), so
a bundle or coordinator is served by that broker only, and is unavailable while it is down.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import threading
import time
import zlib
from urllib.parse import quote

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from ..errors import BrokerUnavailable, InvalidConfiguration, TopicAlreadyExists, excerpt
from ..messaging.topic_name import TopicName

KINDS = ("bundle", "coordinator")
_FORM = "a cluster URL is zk://HOST:PORT[,HOST:PORT...]/ROOT"
_HOST = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$")
_ID = re.compile(r"^[A-Za-z0-9._:=\-]{1,200}$")
DEFAULT_BUNDLES = 16  # per namespace, as Pulsar's defaultNumberOfNamespaceBundles (4) x 4


def bundle_of(partition: str, bundles: int) -> str:
    """The namespace bundle a partition (or non-partitioned topic) hashes onto: the namespace
    and one of `bundles` equal ranges of the 32-bit hash of its full name (Pulsar's bundles
    are hash ranges too)."""
    name = TopicName.parse(partition)
    h = zlib.crc32(name.full.encode())
    width = (1 << 32) // bundles
    i = min(h // width, bundles - 1)
    hi = 0xFFFFFFFF if i == bundles - 1 else (i + 1) * width
    return f"{name.tenant}:{name.namespace}:0x{i * width:08x}_0x{hi:08x}"


def parse_cluster_url(url: str) -> tuple[str, str]:
    """``zk://HOST:PORT[,HOST:PORT...]/ROOT`` -> (kazoo's hosts string, root path)."""
    if not isinstance(url, str) or not url.startswith("zk://"):
        raise InvalidConfiguration(
            f"a cluster URL is zk://HOST:PORT[,...]/ROOT, not {excerpt(url)}"
        )
    rest = url[len("zk://") :]
    hosts, slash, root = rest.partition("/")
    parts = hosts.split(",")
    if not slash or not root or not all(_HOST.match(h) for h in parts):
        raise InvalidConfiguration(
            f"a cluster URL is zk://HOST:PORT[,...]/ROOT, not {excerpt(url)}"
        )
    if not all(_ID.match(p) for p in root.split("/")):
        raise InvalidConfiguration(f"cluster root {excerpt(root)}: names of [A-Za-z0-9._:-]")
    return ",".join(parts), "/" + root


def _unavailable(method):
    """ZooKeeper out of reach is a retriable BrokerUnavailable with its cause, never kazoo's
    own exception. A call that lost its connection or session (ZooKeeper restarted, this
    process paused past its session timeout) waits for the client's next connection, up to the
    session timeout, and is made again: a request arriving while the session is renewed is
    served, not refused. So every method here may run twice: its creates find their own node
    on the second run when the first went through (an owner, a registration, the config are
    read back; a topic carries the id of the call that created it)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        deadline = None
        while True:
            seen = self._connections
            try:
                return method(self, *args, **kwargs)
            except (ConnectionLoss, SessionExpiredError) as exc:
                deadline = deadline or time.monotonic() + self._session_timeout_s
                if not self._connected_after(seen, deadline):
                    raise BrokerUnavailable(
                        f"ZooKeeper: {type(exc).__name__}, no connection again within "
                        f"{self._session_timeout_s:g} s"
                    ) from None
            except KazooTimeoutError:
                raise BrokerUnavailable(
                    f"ZooKeeper did not answer within {self._session_timeout_s:g} s"
                ) from None
            except KazooException as exc:
                raise BrokerUnavailable(
                    f"ZooKeeper: {type(exc).__name__}{': ' + str(exc) if str(exc) else ''}"
                ) from None

    return call


def _check_id(what: str, value: object) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise InvalidConfiguration(f"{what} must be 1-200 of [A-Za-z0-9._:-], not {excerpt(value)}")
    return value


class ClusterMetadata:
    """One broker's or client's connection to the cluster's metadata."""

    def __init__(self, url: str, session_timeout_s: float = 10.0) -> None:
        hosts, self.root = parse_cluster_url(url)
        self._session_timeout_s = session_timeout_s
        # Reconnection tries at most a second apart (kazoo's own delay grows to an hour).
        retry = KazooRetry(max_tries=-1, max_delay=1.0)
        self._zk = KazooClient(hosts=hosts, timeout=session_timeout_s, connection_retry=retry)
        self._registered: tuple[str, bytes] | None = None
        self._lock = threading.Lock()
        # Bumped each time the client connects (under a new session or the same one again).
        self._connections = 0
        self._connected = threading.Condition(self._lock)
        # Live brokers as last read (None: read again), dropped when the set changes or the
        # connection does; and owners, which never change once recorded.
        self._live: dict[str, str] | None = None
        self._live_gen = 0  # bumped when it is dropped: a read begun before is not kept
        self._owners: dict[tuple[str, str], str] = {}
        self._topics: dict[str, int] = {}
        self._zk.add_listener(self._on_state)

    def start(self, timeout_s: float = 15.0) -> ClusterMetadata:
        try:
            self._zk.start(timeout=timeout_s)
        except KazooTimeoutError:
            self._zk.close()
            raise BrokerUnavailable(f"ZooKeeper did not answer within {timeout_s} s") from None
        for kind in KINDS:
            self._zk.ensure_path(f"{self.root}/owners/{kind}")
        self._zk.ensure_path(f"{self.root}/brokers")
        self._zk.ensure_path(f"{self.root}/topics")
        self._zk.ChildrenWatch(f"{self.root}/brokers", self._brokers_changed)
        return self

    # kazoo's own calls wait for ever while ZooKeeper is away (a request queued for the next
    # connection): each waits here at most the session timeout (KazooTimeoutError).
    def _create(self, path: str, data: bytes, ephemeral: bool = False) -> None:
        self._zk.create_async(path, data, ephemeral=ephemeral).get(timeout=self._session_timeout_s)

    def _get(self, path: str):
        return self._zk.get_async(path).get(timeout=self._session_timeout_s)

    def _children(self, path: str) -> list[str]:
        return self._zk.get_children_async(path).get(timeout=self._session_timeout_s)

    def _brokers_changed(self, children) -> None:
        with self._lock:
            self._live = None
            self._live_gen += 1

    # -- the cluster's settings and topics ---------------------------------------------------

    @_unavailable
    def config(self, coordinators: int, bundles: int = DEFAULT_BUNDLES) -> dict:
        """The cluster's settings: those of its first broker (the arguments), for good."""
        path = f"{self.root}/config"
        value = {
            "coordinators": coordinators,
            "bundles": bundles,
            "capability_key": secrets.token_hex(32),
        }
        try:
            self._create(path, json.dumps(value).encode())
        except NodeExistsError:
            data, _ = self._get(path)
            value = json.loads(data)
        return value

    def _topic_path(self, full: str) -> str:
        return f"{self.root}/topics/{quote(full, safe='')}"

    def create_topic(self, full: str, partitions: int, create_id: str | None = None) -> None:
        """Record a topic (TopicAlreadyExists if it is). `create_id` names the call (a
        random one if not given): a call made again after its answer was lost (here, or
        re-sent by a client through another broker) finds the node its first attempt wrote
        and succeeds."""
        self._create_topic(full, partitions, create_id or secrets.token_hex(8))

    @_unavailable
    def _create_topic(self, full: str, partitions: int, create_id: str) -> None:
        path = self._topic_path(full)
        record = {"partitions": partitions, "create_id": create_id}
        try:
            self._create(path, json.dumps(record).encode())
        except NodeExistsError:
            try:
                found = json.loads(self._get(path)[0])
            except NoNodeError:
                found = None
            if found != record:  # another call's, or a bare count written before ids
                raise TopicAlreadyExists(f"topic {full} already exists") from None

    @_unavailable
    def topic(self, full: str) -> int | None:
        """A topic's partition count (0: non-partitioned), None if it does not exist. Counts
        never change once recorded: read once."""
        found = self._topics.get(full)
        if found is not None:
            return found
        try:
            data, _ = self._get(self._topic_path(full))
        except NoNodeError:
            return None
        # {"partitions": n, "create_id": ...}; a bare count as written before create ids.
        found = json.loads(data)
        if isinstance(found, dict):
            found = found["partitions"]
        self._topics[full] = found
        return found

    def close(self) -> None:
        self._zk.stop()
        self._zk.close()

    def __enter__(self) -> ClusterMetadata:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- brokers ---------------------------------------------------------------------------

    @_unavailable
    def register(self, broker_id: str, address: str) -> None:
        """This broker is live at `address` for as long as its session lasts; registered again
        after a session expires (ZooKeeper restarted, a long pause)."""
        _check_id("broker_id", broker_id)
        data = json.dumps({"address": address}).encode()
        with self._lock:
            self._registered = (broker_id, data)
        self._create_registration()

    def _create_registration(self) -> None:
        with self._lock:
            registered = self._registered
        if registered is None:
            return
        broker_id, data = registered
        path = f"{self.root}/brokers/{broker_id}"
        # A node of another session may be a killed process's, until its session expires
        # (ZooKeeper's session timeout, longer across a ZooKeeper restart): waited out.
        deadline = time.monotonic() + 3 * self._session_timeout_s
        while True:
            try:
                self._create(path, data, ephemeral=True)
                return
            except NodeExistsError:
                try:
                    _, stat = self._get(path)
                except NoNodeError:
                    continue  # gone meanwhile: create it
                if stat.ephemeralOwner == self._zk.client_id[0]:
                    return  # ours, from before a reconnection
                if time.monotonic() > deadline:
                    raise InvalidConfiguration(
                        f"broker {broker_id} is already registered by another live process"
                    ) from None
                time.sleep(0.2)

    def _on_state(self, state) -> None:
        # Kazoo's thread: nothing blocking here. While the connection is down (SUSPENDED)
        # the brokers last seen live stay so; once back, or the session lost, read again.
        # A new session lost the ephemeral node: register again.
        if state != KazooState.SUSPENDED:
            with self._lock:
                self._live = None
                self._live_gen += 1
                if state == KazooState.CONNECTED:
                    self._connections += 1
                    self._connected.notify_all()
        if state == KazooState.CONNECTED and self._registered is not None:
            self._zk.handler.spawn(self._reregister)

    def _connected_after(self, seen: int, deadline: float) -> bool:
        """Wait until the client connected again since `seen` (False past `deadline`)."""
        with self._lock:
            while self._connections == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._connected.wait(left)
            return True

    def _reregister(self) -> None:
        try:
            self._create_registration()
        except Exception:  # noqa: BLE001 - the next reconnection tries again
            pass

    @_unavailable
    def live_brokers(self, fresh: bool = False) -> dict[str, str]:
        """broker id -> address of every live broker (as last read: a change shows once its
        watch event has come; `fresh`: read now)."""
        with self._lock:
            if self._live is not None and not fresh:
                return dict(self._live)
            gen = self._live_gen
        out = {}
        for broker_id in self._children(f"{self.root}/brokers"):
            try:
                data, _ = self._get(f"{self.root}/brokers/{broker_id}")
            except NoNodeError:
                continue  # gone meanwhile
            out[broker_id] = json.loads(data)["address"]
        with self._lock:
            if gen == self._live_gen:
                self._live = dict(out)
        return out

    # -- ownership -------------------------------------------------------------------------

    def _path(self, kind: str, ident: str) -> str:
        if kind not in KINDS:
            raise InvalidConfiguration(f"kind must be one of {KINDS}, not {excerpt(kind)}")
        return f"{self.root}/owners/{kind}/{_check_id(kind, ident)}"

    @_unavailable
    def owner(self, kind: str, ident: str) -> str | None:
        """The broker that holds `ident`, live or not; None if nobody took it yet."""
        found = self._owners.get((kind, ident))
        if found is not None:
            return found
        try:
            data, _ = self._get(self._path(kind, ident))
        except NoNodeError:
            return None
        self._owners[kind, ident] = found = data.decode()
        return found

    @_unavailable
    def owned(self, kind: str) -> dict[str, list[str]]:
        """broker id -> the idents of `kind` it holds."""
        out: dict[str, list[str]] = {}
        base = f"{self.root}/owners/{kind}"
        for ident in self._children(base):
            try:
                data, _ = self._get(f"{base}/{ident}")
            except NoNodeError:
                continue
            out.setdefault(data.decode(), []).append(ident)
        return out

    @_unavailable
    def claim(self, kind: str, ident: str) -> str:
        """The owner of `ident`: the broker holding it, else (new) the live broker holding
        the fewest of `kind`, recorded once for good (the first claim wins a race)."""
        path = self._path(kind, ident)
        found = self.owner(kind, ident)
        if found is not None:
            return found
        live = self.live_brokers()
        if not live:
            raise BrokerUnavailable(f"no live broker to own {kind} {ident}")
        load = {b: 0 for b in live}
        for broker_id, idents in self.owned(kind).items():
            if broker_id in load:
                load[broker_id] = len(idents)
        chosen = min(sorted(load), key=lambda b: load[b])
        try:
            self._create(path, chosen.encode())
        except NodeExistsError:
            return self.owner(kind, ident)
        return chosen

    @_unavailable
    def take(self, kind: str, ident: str, broker_id: str) -> str:
        """Record `broker_id` as the owner of `ident` unless somebody is; the owner."""
        try:
            self._create(self._path(kind, ident), _check_id("broker_id", broker_id).encode())
        except NodeExistsError:
            return self.owner(kind, ident)
        return broker_id

    def address(self, broker_id: str) -> str | None:
        """The address of a live broker, None when it is down (a broker missing from what
        was last read is read again: it may have just come back)."""
        address = self.live_brokers().get(broker_id)
        if address is None:
            address = self.live_brokers(fresh=True).get(broker_id)
        return address

    @_unavailable
    def lookup(self, kind: str, ident: str) -> tuple[str, str]:
        """(owner, address) of `ident`, claiming it if new; BrokerUnavailable while its owner
        is down (retry: it takes it back when it returns)."""
        owner = self.claim(kind, ident)
        address = self.address(owner)
        if address is None:
            raise BrokerUnavailable(f"{kind} {ident} is owned by broker {owner}, which is down")
        return owner, address
