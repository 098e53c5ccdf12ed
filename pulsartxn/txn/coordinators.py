"""The broker's transaction coordinators: ``num_coordinators`` :class:`Coordinator` objects
(ids 0..n-1), routing to them, the timer that drives their deadlines and finalize retries; their
growth is in :mod:`pulsartxn.txn.scaling`, decisions over many transactions in
:mod:`pulsartxn.txn.groups`."""

from __future__ import annotations

import itertools
import logging
import struct
import threading
import time
from typing import Protocol

from .._native import TxnID
from ..errors import (
    CoordinatorNotFound,
    CoordinatorUnavailable,
    PulsarTxnError,
    Timeout,
    excerpt,
)
from . import log
from .clean_close import BOOT_KEY, CLEAN_KEY, CleanClose, _boot_id
from .coordinator import ABORTED, COMMITTED, OPEN, Coordinator, TxnMeta
from .groups import GroupDecisions
from .participant import Participants
from .scaling import CoordinatorScaling
from .state import CoordinatorStatus, EndReason, TxnState
from .timer import TxnTimer

MAX_TIMEOUT_MS = 1 << 40  # beyond this a timeout is a mistake, not a wish (~35 years)


def check_timeout_ms(name: str, value: object) -> None:
    """A transaction's timeout: an int of 1..MAX_TIMEOUT_MS (TypeError, ValueError)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {excerpt(value)}")
    if not 1 <= value <= MAX_TIMEOUT_MS:
        raise ValueError(f"{name} {value} out of range 1..{MAX_TIMEOUT_MS}")


def check_ms(name: str, value: object, optional: bool = False) -> None:
    """ValueError unless `value` is a number of milliseconds in 0..MAX_TIMEOUT_MS (not a
    bool, not NaN), or None if `optional`."""
    if value is None and optional:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= MAX_TIMEOUT_MS
    ):
        raise ValueError(f"{name} must be a number of 0..2^40 ms, not {excerpt(value)}")


LWM_PUSH_S = 0.1  # how often the timer tells participants a coordinator's low watermark
_LOG = logging.getLogger("pulsartxn.txn")


class Placement(Protocol):
    """Which coordinators a broker of a cluster serves, and how it reaches the others."""

    foreign: ForeignCoordinators

    def owns(self, coordinator_id: int, has_txns: bool) -> bool:
        """Whether this broker serves the coordinator (`has_txns`: its log here holds some,
        so it must be this broker's, or the cluster is misconfigured: raise)."""


class ForeignCoordinators(Protocol):
    """What a participant asks of a transaction whose coordinator is on another broker:
    ``Coordinators``' methods of the same names."""

    def add_partitions(self, txn_id, partitions) -> None: ...
    def add_subscriptions(self, txn_id, subscriptions) -> None: ...
    def check_open(self, txn_id, op: str) -> None: ...
    def fail(self, txn_id, exc: BaseException) -> None: ...
    def state_of(self, txn_id) -> TxnState: ...


def _no_record(lmdb_txn) -> None:
    """A registration held by another broker's coordinator: nothing rides in this write."""


def _landed(ok: bool) -> None:
    pass


class Coordinators(CoordinatorScaling, CleanClose):
    def __init__(self, broker, participants: Participants, placement: Placement | None = None):
        cfg = broker.config
        self.broker = broker
        self.storage = broker.storage
        self.max_active = cfg.max_active_txns_per_coordinator
        self.default_timeout_ms = cfg.default_txn_timeout_ms
        self.max_timeout_ms = cfg.max_txn_timeout_ms
        self.durable_begin = bool(cfg.durable_begin)
        self.operation_timeout_s = cfg.operation_timeout_ms / 1000.0
        self.participants = participants  # wired by the broker
        self.placement = placement  # None: a broker of its own, serving every coordinator
        self.closed = False
        self._lock = threading.Lock()  # the coordinator list
        self._scale_lock = threading.Lock()
        self._round_robin = itertools.count()
        self.groups = GroupDecisions(self)
        with self.storage.read() as lmdb_txn:
            raw = lmdb_txn.get(log.COORDINATORS_KEY, db=self.storage.meta)
        stored = struct.unpack("<I", bytes(raw))[0] if raw is not None else 0
        n = self._open_count(stored)
        self.claimed = n  # coordinators that have, or are taking, a named database each
        self.coordinators: list[Coordinator] = [Coordinator(self, i) for i in range(n)]
        if n != stored:
            self._store_count(n)  # once they opened: a count that cannot open is never saved
        self._pushed: dict[int, int] = {}  # coordinator id -> low watermark last pushed
        self._push_at = 0.0
        self.timer = TxnTimer(cfg.txn_timeout_tick_ms, self._expire_all)
        boot = _boot_id()
        with self.storage.read() as lmdb_txn:
            closed = lmdb_txn.get(CLEAN_KEY, db=self.storage.meta) is not None
            raw = lmdb_txn.get(BOOT_KEY, db=self.storage.meta)
            last_boot = bytes(raw) if raw is not None else None
        self.clean_start = closed or (boot is not None and last_boot == boot)
        self._first_start = not closed and last_boot is None  # (or a host without boot ids)

        def opened(t) -> None:
            t.delete(CLEAN_KEY, db=self.storage.meta)
            if boot is not None:
                t.put(BOOT_KEY, boot, db=self.storage.meta)

        if closed or last_boot != boot:
            self.storage.write(opened)
        self._recover()

    # -- recovery --------------------------------------------------------------------------

    def _recover(self) -> None:
        began = time.monotonic()
        decided = self.groups.read()
        to_finalize: list[tuple[Coordinator, TxnMeta]] = []
        for c in self.coordinators:
            for meta in c.recover(decided, self.clean_start):
                to_finalize.append((c, meta))
            self._place(c)
        self.groups.recovered([m for c in self.coordinators for m in c.txns.values()])
        self._recovered = to_finalize
        self._reserve_ahead(self.coordinators)
        self._log_recovery(time.monotonic() - began)

    def _log_recovery(self, took_s: float) -> None:
        """One INFO line: what the coordinators' logs held and what became of it."""
        totals: dict[str, int] = {}
        for c in self.coordinators:
            for key, value in c.recovery.items():
                if key != "recover_time_ms":
                    totals[key] = totals.get(key, 0) + value
        failed = [c.id for c in self.coordinators if c.status is CoordinatorStatus.ERROR]
        _LOG.info(
            "%d transaction coordinators recovered in %.1f ms (%s start): %d transactions "
            "replayed, %d open, %d to finalize, %d timed out while down, %d orphaned%s",
            len(self.coordinators),
            took_s * 1000.0,
            "clean" if self.clean_start else "first" if self._first_start else "unclean",
            totals.get("recovered_txns", 0),
            totals.get("recovered_open", 0),
            totals.get("recovered_finalizing", 0),
            totals.get("recovered_timed_out", 0),
            totals.get("recovered_orphaned", 0),
            f"; coordinators {failed} cannot read their logs" if failed else "",
        )
        for c in self.coordinators:
            if c.status is CoordinatorStatus.ERROR:
                _LOG.error("%s", c.error)

    def _place(self, c: Coordinator) -> None:
        """In a cluster, a coordinator another broker owns serves nothing here (before the
        timer could push its empty low watermark over the owner's transactions)."""
        if self.placement is not None and c.status is CoordinatorStatus.READY:
            if not self.placement.owns(c.id, bool(c.txns)):
                c.status = CoordinatorStatus.ELSEWHERE

    def serve(self, coordinator_id: int) -> Coordinator:
        """The coordinator, taken up if the cluster gave it to this broker since it started
        (NotOwner if another broker owns it)."""
        c = self.coordinator(coordinator_id)
        if c.status is CoordinatorStatus.ELSEWHERE and self.placement.owns(c.id, False):
            with c.lock:
                c.status = CoordinatorStatus.READY
        c.check_ready()
        return c

    def elsewhere(self, txn_id) -> bool:
        """Whether another broker of the cluster owns the transaction's coordinator."""
        coords = self.coordinators
        cid = txn_id.coordinator_id
        return cid < len(coords) and coords[cid].status is CoordinatorStatus.ELSEWHERE

    def _foreign(self, txn_id) -> ForeignCoordinators | None:
        """The way to a transaction whose coordinator another broker owns, else None."""
        if self.placement is None:
            return None
        if self.of(txn_id).status is CoordinatorStatus.ELSEWHERE:
            return self.placement.foreign
        return None

    def start(self) -> None:
        """Finalize what recovery found mid-end (called once the broker is fully open)."""
        for c, meta in self._recovered:
            self.timer.submit(c.finalize, meta)
        self._recovered = []

    # -- routing ---------------------------------------------------------------------------

    def coordinator(self, coordinator_id) -> Coordinator:
        if isinstance(coordinator_id, bool) or not isinstance(coordinator_id, int):
            raise TypeError(f"coordinator_id must be an int, not {excerpt(coordinator_id)}")
        coords = self.coordinators
        if not 0 <= coordinator_id < len(coords):
            raise CoordinatorNotFound(
                f"transaction coordinator {coordinator_id} does not exist "
                f"(this broker has {len(coords)}: 0..{len(coords) - 1})"
            )
        return coords[coordinator_id]

    def of(self, txn_id) -> Coordinator:
        cid = txn_id.coordinator_id  # a TxnID's: an int >= 0
        coords = self.coordinators
        return coords[cid] if cid < len(coords) else self.coordinator(cid)

    # -- single transactions ---------------------------------------------------------------

    def new_transaction(
        self, timeout_ms=None, coordinator_id=None, group=None, owner=log.IN_PROCESS
    ) -> TxnMeta:
        """Begin a transaction; `owner`: log.IN_PROCESS (aborted when this process ends) or
        the id of the network session that opened it."""
        if timeout_ms is None:
            timeout_ms = self.default_timeout_ms
        check_timeout_ms("timeout_ms", timeout_ms)
        timeout_ms = min(timeout_ms, self.max_timeout_ms)  # capped by the broker's maximum
        if group is not None:
            if not isinstance(group, str) or not group:
                raise ValueError(f"group must be a non-empty str, not {excerpt(group)}")
            if len(group.encode()) > log.MAX_NAME_BYTES:
                raise ValueError(f"group label of {len(group.encode())} bytes is too long")
        if coordinator_id is not None:
            coordinator = self.serve(coordinator_id)
        else:
            coordinator = self._pick()
        meta = coordinator.new(timeout_ms, group, owner)
        if group is not None:
            self.groups.joined(group, meta.txn_id)
        return meta

    def _pick(self) -> Coordinator:
        coords = self.coordinators
        n = len(coords)
        turn = self._round_robin
        ready = CoordinatorStatus.READY
        for _ in range(n):
            c = coords[next(turn) % n]
            if c.status is ready:
                return c
        raise CoordinatorUnavailable("no transaction coordinator is available")

    def add_partitions(self, txn_id, partitions) -> None:
        if (foreign := self._foreign(txn_id)) is not None:
            return foreign.add_partitions(txn_id, list(partitions))
        self.of(txn_id).add(txn_id.sequence, log.PARTITIONS, list(partitions))

    def add_subscriptions(self, txn_id, subscriptions) -> None:
        pairs = [(str(p), str(s)) for p, s in subscriptions]
        if (foreign := self._foreign(txn_id)) is not None:
            return foreign.add_subscriptions(txn_id, pairs)
        self.of(txn_id).add(txn_id.sequence, log.SUBSCRIPTIONS, pairs)

    def stage_partitions(self, txn_id, partitions):
        """(apply, done): the registration rides in the data write (see Coordinator.stage);
        with a coordinator on another broker, it is made there first (durable there)."""
        if (foreign := self._foreign(txn_id)) is not None:
            foreign.add_partitions(txn_id, list(partitions))
            return _no_record, _landed
        return self.of(txn_id).stage(txn_id.sequence, log.PARTITIONS, list(partitions), True)

    def stage_subscriptions(self, txn_id, subscriptions):
        """(apply, done): the registration rides in the pending-ack log write that holds the
        transaction's acks there, or in its commit (see Coordinator.stage)."""
        pairs = [(str(p), str(s)) for p, s in subscriptions]
        if (foreign := self._foreign(txn_id)) is not None:
            foreign.add_subscriptions(txn_id, pairs)
            return _no_record, _landed
        return self.of(txn_id).stage(txn_id.sequence, log.SUBSCRIPTIONS, pairs, False)

    def check_open(self, txn_id, op: str) -> None:
        """Raise unless the transaction is OPEN (participants ask before taking its ops)."""
        if (foreign := self._foreign(txn_id)) is not None:
            return foreign.check_open(txn_id, op)
        self.of(txn_id).check_open(txn_id.sequence, op)

    def fail(self, txn_id, exc: BaseException) -> None:
        """A send or an ack of the transaction failed: its commit aborts it."""
        try:
            if (foreign := self._foreign(txn_id)) is not None:
                return foreign.fail(txn_id, exc)
            self.of(txn_id).fail(txn_id.sequence, exc)
        except CoordinatorNotFound:
            pass

    def end(
        self,
        txn_id,
        commit: bool,
        timeout_s: float | None = None,
        expected_acks=None,
        riding=(),
        expected_sends=None,
    ) -> TxnState:
        """Commit or abort; returns once the decision is durable and every participant has
        its part, or one has failed its part (finalized in the background from then on: the
        state is then COMMITTING or ABORTING). Raises Timeout after `timeout_s` (default: the
        broker's operation timeout) saying the state. A commit that cannot happen for good
        (a failed op, lost sends or acks) aborts the transaction and raises."""
        c = self.of(txn_id)
        wait_s = self.operation_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        try:
            meta = c.end(
                txn_id.sequence,
                commit,
                EndReason.CLIENT,
                expected_acks,
                riding,
                expected_sends,
                deadline,
            )
        except PulsarTxnError as exc:
            if commit and getattr(exc, "abort_only", False):
                self._abort_after(c, txn_id, exc, deadline)
            raise
        if not c.wait_settled(meta, deadline):
            raise Timeout(
                f"transaction {txn_id} is {meta.state.value} after {wait_s:g} s: its "
                "decision is durable, its participants are still being finalized"
            )
        return meta.state

    def _abort_after(self, c, txn_id, exc: BaseException, deadline: float) -> None:
        """A commit that cannot happen: abort the transaction; the error says so."""
        try:
            meta = c.end(txn_id.sequence, False, EndReason.CLIENT, deadline=deadline)
            c.wait_settled(meta, deadline)
        except PulsarTxnError:
            return  # ended meanwhile (a timeout), or the broker is closing
        exc.args = (f"{exc.args[0] if exc.args else exc}; the transaction was aborted",)

    def check_known(self, txn_id) -> None:
        """Raise unless the transaction is known (CoordinatorNotFound, TransactionNotFound).
        One whose coordinator is on another broker is checked by its first op here (its
        registration there), not by a call of its own."""
        if self._foreign(txn_id) is None:
            self.state_of(txn_id)

    def state_of(self, txn_id) -> TxnState:
        if (foreign := self._foreign(txn_id)) is not None:
            return foreign.state_of(txn_id)
        state, reason = self.of(txn_id).state_of(txn_id.sequence)
        if state is ABORTED and reason == EndReason.TIMEOUT:
            return TxnState.TIMEOUT
        return state

    def meta_of(self, txn_id) -> TxnMeta:
        c = self.of(txn_id)
        with c.lock:
            return c.live(txn_id.sequence, "look up")

    # -- decisions over many transactions: GroupDecisions -----------------------------------

    def commit_all(self, txn_ids, expected=None) -> dict:
        return self.groups.commit_all(txn_ids, expected)

    def commit_group(self, group: str, winners, idempotency_key=None, expected=None) -> dict:
        return self.groups.commit_group(group, winners, idempotency_key, expected)

    def abort_group(self, group: str) -> dict:
        return self.groups.abort_group(group)

    def group_members(self, group: str) -> set:
        return self.groups.members(group)

    # -- deadlines, lifecycle --------------------------------------------------------------

    def _expire_all(self, now: float) -> None:
        for c in self.coordinators:
            if c.status is not CoordinatorStatus.READY:
                continue
            for seq in c.expire(now):
                self.timer.submit(c.timeout, seq)
        if now >= self._push_at:
            self._push_at = now + LWM_PUSH_S
            moved = []
            for c in self.coordinators:
                if c.status is CoordinatorStatus.READY:
                    lwm = c.low_watermark()
                    if lwm > self._pushed.get(c.id, 0):
                        self._pushed[c.id] = lwm
                        moved.append((c.id, lwm))
                    c.prune_outcomes()
            if moved:
                self.timer.submit(self._push, moved)

    def _push(self, moved: list) -> None:
        """Tell the local participants the low watermarks that moved: what they still hold
        of transactions below them is dropped without waiting for more traffic."""
        for cid, lwm in moved:
            self.broker.low_watermark_moved(cid, lwm)

    # -- transactions whose client is gone -------------------------------------------------

    def owned(self, keep=None) -> list[TxnMeta]:
        """The OPEN transactions for which keep(meta) is true (all of them without `keep`)."""
        out = []
        for c in self.coordinators:
            with c.lock:
                out.extend(
                    m for m in c.txns.values() if m.state is OPEN and (keep is None or keep(m))
                )
        return out

    def live(self, txn_ids) -> set:
        """Those of `txn_ids` that are still live (not COMMITTED or ABORTED) here."""
        out = set()
        coords = self.coordinators
        for txn_id in txn_ids:
            cid = txn_id.coordinator_id
            if cid < len(coords) and txn_id.sequence in coords[cid].txns:
                out.add(txn_id)
        return out

    def abort_orphans(self, metas) -> int:
        """Abort these transactions: their client is gone, nobody else can end them. Returns
        how many were aborted here (others ended meanwhile)."""
        n = 0
        deadline = time.monotonic() + self.operation_timeout_s
        for meta in metas:
            c = self.of(meta.txn_id)
            try:
                ended = c.end(meta.seq, False, EndReason.ORPHANED, deadline=deadline)
            except PulsarTxnError:
                continue  # ended meanwhile, or its coordinator cannot now
            c.wait_settled(ended, deadline)
            n += 1
        return n

    def close(self) -> None:
        """Abort the open in-process transactions (nobody can end them after this), log the
        begun ones of network sessions (they live on), stop the timer."""
        if not self.closed:
            self.abort_orphans(self.owned(lambda m: m.owner == log.IN_PROCESS))
            self._log_begun()
        self.closed = True
        self.timer.stop()
        for c in self.coordinators:
            with c.lock:
                c.cond.notify_all()

    def slow(self, min_open_ms: float) -> list[dict]:
        out = []
        now = time.monotonic()
        for c in self.coordinators:
            with c.lock:
                metas = [m for m in c.txns.values() if (now - m.started) * 1000.0 >= min_open_ms]
                out.extend(c.metadata(m) for m in metas)
        out.sort(key=lambda d: -d["open_ms"])
        return out


__all__ = ["Coordinators", "COMMITTED", "ABORTED", "TxnID"]
