"""How one broker of a cluster reaches another for a transaction: the participants it tells
(RemoteParticipant, on the coordinator's side) and the coordinators it asks (ForeignTxns, on a
participant's side). See docs/cluster.md, "Transactions across brokers"."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .. import errors
from .._native import TxnID
from ..cluster.metadata import bundle_of
from ..txn.participant import PARTITION
from ..txn.state import FINAL, TxnState

if TYPE_CHECKING:
    from .cluster import ClusterNode

_LOG = logging.getLogger("pulsartxn.cluster")


class RemoteParticipant:
    """A partition or subscription on another broker, told over the network (its owner is
    looked up at each call: a restarted broker may be at a new address)."""

    def __init__(self, node: ClusterNode, kind: str, name) -> None:
        self.node = node
        self.kind = kind
        self.name = name
        self.partition = name if kind == PARTITION else name[0]

    def _call(self, action: str, args: dict) -> dict:
        bundle = bundle_of(self.partition, self.node.bundles)
        address = self.node.address_of("bundle", bundle)
        name = self.name if self.kind == PARTITION else list(self.name)
        return self.node.call(address, action, {**args, "kind": self.kind, "name": name})

    def end_txn(self, txn_id: TxnID, commit: bool, low_watermark: int) -> None:
        self._call("peer_end", {"txn": str(txn_id), "commit": commit, "lwm": low_watermark})

    def __repr__(self) -> str:
        return f"RemoteParticipant({self.kind}, {self.name!r})"


class ForeignTxns:
    """The coordinators of other brokers, as this broker's participants see them
    (txn.coordinators.ForeignCoordinators). A transaction this broker registered its
    partitions or subscriptions for is known OPEN here until its end comes;
    any other is asked of its coordinator, the authority."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._open: dict[TxnID, set] = {}  # registered here, not ended: what was registered

    def _register(self, txn_id: TxnID, key: str, names: list) -> None:
        with self._lock:
            known = self._open.get(txn_id, ())
            new = [n for n in names if (key, _hashable(n)) not in known]
        if not new:
            return
        self.node.call_coordinator(txn_id, "peer_register", {key: new})
        with self._lock:
            self._open.setdefault(txn_id, set()).update((key, _hashable(n)) for n in new)

    def add_partitions(self, txn_id: TxnID, partitions) -> None:
        self._register(txn_id, "partitions", list(partitions))

    def add_subscriptions(self, txn_id: TxnID, subscriptions) -> None:
        self._register(txn_id, "subscriptions", [list(p) for p in subscriptions])

    def check_open(self, txn_id: TxnID, op: str) -> None:
        if txn_id in self._open:
            return
        state = self.state_of(txn_id)
        if state is not TxnState.OPEN:
            timed_out = state is TxnState.TIMEOUT
            cls = errors.TransactionTimeout if timed_out else errors.InvalidTxnStatus
            raise cls(f"cannot {op} transaction {txn_id}: it is {state.value}")

    def fail(self, txn_id: TxnID, exc: BaseException) -> None:
        try:
            self.node.call_coordinator(
                txn_id, "peer_fail", {"error": [type(exc).__name__, str(exc)]}
            )
        except errors.PulsarTxnError as err:
            # The op's caller got the error too (its client's commit aborts on it).
            _LOG.warning("could not tell transaction %s's coordinator a failure: %s", txn_id, err)

    def state_of(self, txn_id: TxnID) -> TxnState:
        state = TxnState(self.node.call_coordinator(txn_id, "peer_state", {})["state"])
        if state in FINAL:
            self.ended(txn_id)
        return state

    def known(self) -> set:
        with self._lock:
            return set(self._open)

    def known_open(self, txn_id: TxnID) -> None:
        with self._lock:
            self._open.setdefault(txn_id, set())

    def ended(self, txn_id: TxnID) -> None:
        """Its end came here: later ops are asked of the coordinator (which refuses them)."""
        with self._lock:
            self._open.pop(txn_id, None)

    def is_foreign(self, txn_id: TxnID) -> bool:
        """Whether the transaction's coordinator is on another broker."""
        return self.node.broker.txn.elsewhere(txn_id)


def _hashable(name):
    return tuple(name) if isinstance(name, list) else name
