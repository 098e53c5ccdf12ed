"""A broker of a cluster (``pulsartxn serve --cluster zk://...``): its id, what it owns, and
the calls between brokers that a transaction across them needs (seeds: TC deep dive).

Ownership is in ZooKeeper (:mod:`pulsartxn.cluster.metadata`) and sticks to the broker whose
data directory holds it. A participant broker registers a partition or subscription with the
transaction's coordinator before it takes the first op of the transaction there, and answers
that transaction's sends and acks once they are durable (as Pulsar's and Kafka's brokers do),
so a commit decides at once, then ends each participant broker (markers, acks) over the
network, retried until done. See docs/cluster.md.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading

import pyarrow.flight as flight

from .. import errors
from .._native import TxnID
from ..cluster.metadata import ClusterMetadata, bundle_of
from ..messaging.topic_name import TopicName
from ..txn.participant import PARTITION, SUBSCRIPTION
from ..txn.state import FINAL, TxnState
from . import protocol
from .peers import ForeignTxns, RemoteParticipant
from .protocol import frame, unframe

BROKER_ID_KEY = b"cluster/broker-id"
CLUSTER_KEY = b"cluster/url"
PEER_TIMEOUT_S = 10.0  # one call between brokers (an end is retried after it)
ZK_SESSION_S = 4.0  # a killed broker's bundles are shown down this long after
RECONCILE_S = 2.0  # how often held transactions of other brokers' coordinators are checked
_LOG = logging.getLogger("pulsartxn.cluster")


class ClusterNode:
    """This broker's place in its cluster: what ``Broker(cluster=...)`` and the server use."""

    def __init__(
        self,
        url: str,
        num_coordinators: int = 16,
        admin_token: str | None = None,
        tls_roots: bytes | None = None,
        session_timeout_s: float = ZK_SESSION_S,
    ) -> None:
        self.url = url
        self.meta = ClusterMetadata(url, session_timeout_s).start()
        settings = self.meta.config(num_coordinators)
        self.coordinators: int = settings["coordinators"]
        self.bundles: int = settings["bundles"]
        self.capability_key = bytes.fromhex(settings["capability_key"])
        self.broker_id: str | None = None
        self.address: str | None = None
        self.broker = None
        headers = [(b"authorization", b"Bearer " + admin_token.encode())] if admin_token else []
        self._options = flight.FlightCallOptions(headers=headers, timeout=PEER_TIMEOUT_S)
        self._scheme = "grpc+tls" if tls_roots is not None else "grpc"
        self._tls_roots = tls_roots
        self._peers: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()
        self.foreign = ForeignTxns(self)
        self._stop = threading.Event()
        self._mine: list[int] = []  # coordinators this broker owns, once it knows any
        self._picks = itertools.count()
        self._reconciler: threading.Thread | None = None

    # -- identity and ownership --------------------------------------------------------------

    def attach(self, storage) -> str:
        """This broker's id, kept in its store (made at its first start in the cluster); a
        store of another cluster is refused (its data is owned there)."""
        with storage.read() as lmdb_txn:
            raw_id = lmdb_txn.get(BROKER_ID_KEY, db=storage.meta)
            raw_url = lmdb_txn.get(CLUSTER_KEY, db=storage.meta)
        root = f"{self.meta.root}"
        if raw_id is not None:
            if raw_url is not None and bytes(raw_url).decode() != root:
                raise errors.InvalidConfiguration(
                    f"this data directory belongs to the cluster rooted at "
                    f"{bytes(raw_url).decode()}, not {root}"
                )
            self.broker_id = bytes(raw_id).decode()
            return self.broker_id
        broker_id = f"broker-{secrets.token_hex(4)}"

        def apply(lmdb_txn) -> None:
            lmdb_txn.put(BROKER_ID_KEY, broker_id.encode(), db=storage.meta)
            lmdb_txn.put(CLUSTER_KEY, root.encode(), db=storage.meta)

        storage.write(apply)
        self.broker_id = broker_id
        return broker_id

    def bind(self, broker) -> None:
        """Serve `broker` (open on this node): its participants ask from now on after the
        transactions of other brokers' coordinators they hold (after a restart, nobody
        may be left to tell them)."""
        self.broker = broker
        self._reconciler = threading.Thread(
            target=self._reconcile_loop, name="pulsartxn-reconcile", daemon=True
        )
        self._reconciler.start()

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(RECONCILE_S):
            try:
                self.reconcile()
            except errors.AlreadyClosed:
                return
            except Exception:  # noqa: BLE001 - the next round asks again
                _LOG.exception("reconciling held transactions failed")

    def _held(self) -> dict:
        """Transactions of coordinators elsewhere that participants here hold and that this
        broker does not know to be open: txn id -> those participants."""
        elsewhere = self.broker.txn.elsewhere
        known = self.foreign.known()
        held: dict = {}

        def hold(participant, ids) -> None:
            for t in ids:
                if t not in known and elsewhere(t):
                    held.setdefault(t, []).append(participant)

        for part in self.broker.topics.loaded():
            with part.buffer.lock:
                hold(part.buffer, list(part.buffer.ongoing))
            for sub in list(part.subscriptions.values()):
                with sub.pending_ack.lock:
                    hold(sub.pending_ack, list(sub.pending_ack.counts))
        return held

    def reconcile(self) -> None:
        """Ask the coordinators of the transactions held here that this broker does not
        know to be open (those recovered after a restart): an ended one ends here too, one
        its coordinator does not know was never decided (it aborts); an open one is known
        open from now on; one being ended is told by its coordinator."""
        for t, parts in self._held().items():
            try:
                state = TxnState(self.call_coordinator(t, "peer_state", {})["state"])
            except errors.TransactionNotFound:
                state = TxnState.ABORTED
            except errors.PulsarTxnError:
                continue  # its coordinator is down: asked again next round
            if state is TxnState.OPEN:
                self.foreign.known_open(t)
            elif state in FINAL:
                for participant in parts:
                    participant.end_txn(t, state is TxnState.COMMITTED, 0)

    def owns(self, coordinator_id: int, has_txns: bool) -> bool:
        """Placement: whether this broker serves the coordinator. One whose log here holds
        transactions is this broker's (taken if nobody has it; refused if another has)."""
        ident = str(coordinator_id)
        owner = self.meta.owner("coordinator", ident)
        if owner is None and has_txns:
            owner = self.meta.take("coordinator", ident, self.broker_id)
        if has_txns and owner != self.broker_id:
            raise errors.InvalidConfiguration(
                f"this data directory holds transactions of coordinator {coordinator_id}, "
                f"which broker {owner} owns"
            )
        return owner == self.broker_id

    def local_coordinator(self) -> int:
        """A coordinator this broker serves, for a transaction that names none: one it owns,
        else one nobody owns yet, taken (NotOwner when every one is another broker's)."""
        if not self._mine:  # owners stick: once known, never read again
            owned = self.meta.owned("coordinator").get(self.broker_id, [])
            self._mine = sorted(int(i) for i in owned)
        if self._mine:
            return self._mine[next(self._picks) % len(self._mine)]
        for cid in range(self.coordinators):
            if self.meta.take("coordinator", str(cid), self.broker_id) == self.broker_id:
                self._mine = [cid]
                return cid
        raise errors.NotOwner(
            "this broker serves no transaction coordinator: look one up (lookup coordinator)"
        )

    def settle(self, txn_id: TxnID, acked=None) -> None:
        """Before this broker answers sends (or, `acked`: (partition, subscription), acks) of
        a transaction whose coordinator is another broker's: they are durable, so its commit
        decides without asking this broker again (one round trip fewer on every commit)."""
        if not self.foreign.is_foreign(txn_id):
            return
        if acked is None:
            self.broker.storage.write(_nothing)  # what was stored before is durable now
            return
        pending = self.broker.txn.participants.local(SUBSCRIPTION, tuple(acked))
        if pending is not None:
            pending.prepare(txn_id)

    def register(self, address: str) -> None:
        """Live at `address` from now on (the server is up)."""
        self.address = address
        self.meta.register(self.broker_id, address)

    def stop(self) -> None:
        """Stop asking after held transactions (before the broker closes)."""
        self._stop.set()
        if self._reconciler is not None:
            self._reconciler.join()

    def close(self) -> None:
        self.stop()
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for client in peers:
            client.close()
        self.meta.close()

    def owner_of(self, partition: str, claim: bool) -> str | None:
        """The broker owning the bundle `partition` hashes onto (`claim`: given to the least
        loaded live broker if nobody has it yet)."""
        bundle = bundle_of(partition, self.bundles)
        if claim:
            return self.meta.claim("bundle", bundle)
        return self.meta.owner("bundle", bundle)

    def address_of(self, kind: str, ident: str) -> str:
        """The address of the live owner of a bundle or coordinator (BrokerUnavailable while
        it is down; TransactionNotFound for a coordinator nobody ever served)."""
        owner = self.meta.owner(kind, ident)
        if owner is None:
            raise errors.TransactionNotFound(f"{kind} {ident} has never been served")
        address = self.meta.address(owner)
        if address is None:
            raise errors.BrokerUnavailable(f"{kind} {ident} is owned by broker {owner}, down")
        return address

    def participant(self, kind: str, name):
        """A participant on another broker, or None for this broker's own."""
        partition = name if kind == PARTITION else name[0]
        owner = self.owner_of(partition, claim=False)
        if owner is None or owner == self.broker_id:
            return None
        return RemoteParticipant(self, kind, name)

    # -- topics ------------------------------------------------------------------------------

    def serve_topic(self, topic: str, create: bool = True) -> None:
        """Before this broker serves `topic`: it is known here as the cluster knows it (a
        non-partitioned topic auto-created cluster-wide), and every partition of it is
        this broker's (NotOwner otherwise: look it up, ask its owner)."""
        name = TopicName.parse(topic)
        base = name.base if name.partition_index >= 0 else name
        n = self.meta.topic(base.full)
        if n is None:
            if name.partition_index >= 0 or not create:
                raise errors.TopicNotFound(f"topic {name.full} does not exist")
            try:
                self.meta.create_topic(base.full, 0)
            except errors.TopicAlreadyExists:
                pass
            n = self.meta.topic(base.full)
        if name.partition_index >= n:
            raise errors.TopicNotFound(f"partition {name.full} does not exist")
        try:
            self.broker.create_topic(base.full, n)
        except errors.TopicAlreadyExists:
            pass
        names = (
            [name.full]
            if name.partition_index >= 0 or n == 0
            else [base.partition(i).full for i in range(n)]
        )
        for full in names:
            owner = self.owner_of(full, claim=True)
            if owner != self.broker_id:
                raise errors.NotOwner(f"{full} is served by broker {owner}: look it up")

    def create_topic(self, topic: str, partitions: int, create_id: str | None = None) -> None:
        name = TopicName.parse(topic)
        if name.partition_index >= 0:
            raise errors.InvalidTopicName(f"{name.full} names a partition; create its topic")
        name.check_new(partitions)
        self.meta.create_topic(name.full, partitions, create_id)

    def topic_partitions(self, topic: str) -> list[str]:
        name = TopicName.parse(topic)
        base = name.base if name.partition_index >= 0 else name
        n = self.meta.topic(base.full)
        if n is None or name.partition_index >= max(n, 1 if name.partition_index < 0 else 0):
            raise errors.TopicNotFound(f"topic {name.full} does not exist")
        if name.partition_index >= 0:
            return [name.full]
        return [base.partition(i).full for i in range(n)] if n else [name.full]

    def lookup(self, kind, name) -> dict:
        if kind == "coordinator":
            if isinstance(name, bool) or not isinstance(name, int):
                raise TypeError(f"a coordinator is an int, not {errors.excerpt(name)}")
            if not 0 <= name < self.coordinators:
                raise errors.CoordinatorNotFound(
                    f"transaction coordinator {name} does not exist (0..{self.coordinators - 1})"
                )
            broker, address = self.meta.lookup("coordinator", str(name))
        elif kind == "partition":
            full = TopicName.parse(name).full
            broker, address = self.meta.lookup("bundle", bundle_of(full, self.bundles))
        else:
            raise ValueError(f"lookup kind must be partition or coordinator, not {kind!r}")
        return {"broker": broker, "address": address}

    def info(self) -> dict:
        return {
            "cluster": True,
            "broker": self.broker_id,
            "coordinators": self.coordinators,
            "brokers": self.meta.live_brokers(),
        }

    # -- admin views (client.admin on a cluster) ----------------------------------------------

    def cluster(self) -> dict:
        """Live brokers, and which broker owns each bundle and coordinator."""
        live = self.meta.live_brokers(fresh=True)
        return {
            "brokers": {b: {"address": a, "live": True} for b, a in live.items()},
            "bundles": self.meta.owned("bundle"),
            "coordinators": {
                b: sorted(int(i) for i in ids) for b, ids in self.meta.owned("coordinator").items()
            },
            "coordinator_count": self.coordinators,
            "bundle_count": self.bundles,
        }

    def _each_broker(self, method: str, *args) -> dict:
        """An admin call on every live broker: broker id -> its answer (or its error)."""
        out = {}
        for broker_id, address in sorted(self.meta.live_brokers(fresh=True).items()):
            try:
                out[broker_id] = self.call(address, "peer_admin", {"method": method, "args": args})[
                    "result"
                ]
            except errors.PulsarTxnError as exc:
                out[broker_id] = {"error": f"{type(exc).__name__}: {exc}"}
        return out

    def cluster_transactions(self, min_open_ms: float = 0) -> list[dict]:
        """Every live broker's transactions open at least min_open_ms, oldest first."""
        rows = []
        for broker_id, answer in self._each_broker("slow_transactions", min_open_ms).items():
            if isinstance(answer, dict):  # that broker could not answer
                continue
            rows.extend({**row, "broker": broker_id} for row in answer)
        rows.sort(key=lambda r: -r.get("open_ms", 0))
        return rows

    def list_topics(self) -> list[dict]:
        """Every live broker's topics, each once by name (admin.list_topics on a cluster)."""
        found: dict[str, int] = {}
        for answer in self._each_broker("list_topics").values():
            if isinstance(answer, list):
                for row in answer:
                    found[row["topic"]] = max(found.get(row["topic"], 0), row["partitions"])
        return [{"topic": t, "partitions": n} for t, n in sorted(found.items())]

    def cluster_coordinators(self) -> list[dict]:
        """The coordinators each broker serves (ELSEWHERE ones left out)."""
        rows = []
        for broker_id, answer in self._each_broker("coordinators").items():
            if isinstance(answer, dict):
                continue
            rows.extend(
                {**row, "broker": broker_id} for row in answer if row.get("state") != "ELSEWHERE"
            )
        rows.sort(key=lambda r: r.get("coordinator_id", 0))
        return rows

    # -- calls to other brokers --------------------------------------------------------------

    def call(self, address: str, action: str, args: dict) -> dict:
        """One call to the broker at `address` (BrokerUnavailable if it cannot be reached;
        its errors raised as theirs)."""
        with self._lock:
            client = self._peers.get(address)
            if client is None:
                client = flight.FlightClient(
                    f"{self._scheme}://{address}", tls_root_certs=self._tls_roots
                )
                self._peers[address] = client
        try:
            results = client.do_action(flight.Action(action, frame(args)), self._options)
            out = [r.body.to_pybytes() for r in results]
            if not out:  # every action answers once: none is an answer lost on the way
                raise flight.FlightUnavailableError(f"{action}: the answer was lost")
        except (flight.FlightUnavailableError, flight.FlightTimedOutError) as exc:
            with self._lock:  # the next call a new channel (RemoteClient._channel_lost)
                if self._peers.get(address) is client:
                    del self._peers[address]
            raise errors.BrokerUnavailable(f"broker at {address} unreachable: {exc}") from None
        except flight.FlightError as exc:
            raise protocol.from_flight_error(exc) from None
        return unframe(out[0], 1 << 62)[0]

    def call_coordinator(self, txn_id: TxnID, action: str, args: dict) -> dict:
        address = self.address_of("coordinator", str(txn_id.coordinator_id))
        return self.call(address, action, {**args, "txn": str(txn_id)})

    # -- what other brokers ask of this one --------------------------------------------------

    def peer_actions(self) -> dict:
        return {
            "peer_register": self._on_register,
            "peer_state": self._on_state,
            "peer_fail": self._on_fail,
            "peer_end": self._on_end,
            "peer_admin": self._on_admin,
        }

    _READ_ONLY = ("slow_transactions", "coordinators", "list_topics")

    def _on_admin(self, args, payload) -> dict:
        method = args.get("method")
        if method not in self._READ_ONLY:
            raise ValueError(f"unknown peer admin call {errors.excerpt(method)}")
        return {"result": protocol.jsonable(getattr(self.broker.admin, method)(*args["args"]))}

    def _on_register(self, args, payload) -> dict:
        txn_id = TxnID.parse(args["txn"])
        service = self.broker.txn
        if args.get("partitions"):
            service.add_partitions(txn_id, [str(p) for p in args["partitions"]])
        if args.get("subscriptions"):
            pairs = [(str(p), str(s)) for p, s in args["subscriptions"]]
            service.add_subscriptions(txn_id, pairs)
        return {}

    def _on_state(self, args, payload) -> dict:
        return {"state": self.broker.txn.state_of(TxnID.parse(args["txn"])).value}

    def _on_fail(self, args, payload) -> dict:
        name, message = args["error"]
        self.broker.txn.fail(TxnID.parse(args["txn"]), protocol.error_named(name, message))
        return {}

    def _participant(self, args):
        kind, name = args["kind"], args["name"]
        if kind == SUBSCRIPTION:
            name = (str(name[0]), str(name[1]))
        elif kind != PARTITION:
            raise ValueError(f"unknown participant kind {errors.excerpt(kind)}")
        self.broker.check_open()
        return kind, name, self.broker.txn.participants.local(kind, name)

    def _on_end(self, args, payload) -> dict:
        txn_id = TxnID.parse(args["txn"])
        kind, name, participant = self._participant(args)
        if participant is not None:
            participant.end_txn(txn_id, bool(args["commit"]), int(args["lwm"]))
        self.foreign.ended(txn_id)
        return {}


def _nothing(lmdb_txn) -> None:
    pass
