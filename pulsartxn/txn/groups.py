"""Decisions over many transactions at once (``commit_all``, ``commit_group``,
``abort_group``: beyond Pulsar, for Spark). One record decides them all; it stays until every
transaction it names is finished, so a crash in between finalizes them again."""

from __future__ import annotations

import struct
import threading
import time
from typing import TYPE_CHECKING

from ..errors import CorruptEntry, InvalidTxnStatus, Timeout, excerpt
from ..storage import WriteOp
from . import log
from .coordinator import OPEN, TxnMeta, status_error
from .state import EndReason, TxnState

if TYPE_CHECKING:
    from .coordinators import Coordinators

_IDEM = struct.Struct("<Q")
MAX_APP_ID_BYTES = 255  # an idempotency key's app id: an LMDB key, at most 511 bytes


class GroupDecisions:
    def __init__(self, coordinators: Coordinators) -> None:
        self.coordinators = coordinators
        self.storage = coordinators.storage
        self._lock = threading.Lock()  # groups and decisions
        self._decision_lock = threading.Lock()  # one decision written at a time
        self._groups: dict[str, set] = {}  # label -> its live TxnIDs
        self._decisions: dict[int, set] = {}  # decision id -> TxnIDs not yet finished
        self._next_decision = 1
        self._pending: dict[int, set] = {}  # read at open, until recovered()
        self._decisions_db = self.storage.open_db(log.DECISIONS_DB)
        self._group_keys_db = self.storage.open_db(log.GROUP_KEYS_DB)
        self.errors: list[str] = []

    def read(self) -> dict:
        """At open: the decision records, as TxnID -> (decision id, commit). A damaged one
        cannot decide anything: its transactions stay as their own logs say (OPEN ones time
        out); it is kept for inspection and reported in `errors`."""
        decided: dict = {}
        corrupt = []
        with self.storage.read() as lmdb_txn:
            for key, value in lmdb_txn.cursor(db=self._decisions_db):
                try:
                    d = log.decode_decision(value)
                except CorruptEntry as exc:
                    corrupt.append((bytes(key), exc))
                    if len(key) == 8:
                        self._next_decision = max(
                            self._next_decision, int.from_bytes(bytes(key), "big") + 1
                        )
                    continue
                self._next_decision = max(self._next_decision, d.decision_id + 1)
                self._pending[d.decision_id] = set(d.commits) | set(d.aborts)
                for t in d.commits:
                    decided[t] = (d.decision_id, True)
                for t in d.aborts:
                    decided[t] = (d.decision_id, False)
        self.errors = [f"decision record {k.hex()}: {exc}" for k, exc in corrupt]
        return decided

    def recovered(self, live: list[TxnMeta]) -> None:
        """The coordinators have replayed their logs: `live` are their transactions. A
        decision stays while one it names is live."""
        for meta in live:
            if meta.group is not None:
                self._groups.setdefault(meta.group, set()).add(meta.txn_id)
        ids = {m.txn_id for m in live}
        for did, named in self._pending.items():
            remaining = named & ids
            if remaining:
                self._decisions[did] = remaining
            else:
                self._delete_decision(did)
        self._pending = {}

    def joined(self, group: str, txn_id) -> None:
        with self._lock:
            self._groups.setdefault(group, set()).add(txn_id)

    def commit_all(self, txn_ids, expected=None) -> dict:
        """`expected`: TxnID -> (acks, sends) its committer made (see end()), where known."""
        ids = list(dict.fromkeys(txn_ids))
        if not ids:
            raise ValueError("commit_all needs at least one transaction")
        return self._decide(ids, [], None, None, expected)

    def commit_group(self, group: str, winners, idempotency_key=None, expected=None) -> dict:
        _check_label(group)
        winners = list(dict.fromkeys(winners))
        key = _idempotency(idempotency_key)
        with self._decision_lock:
            if key is not None and self._already_decided(key):
                return {"committed": [], "aborted": [], "duplicate": True}
            with self._lock:
                members = set(self._groups.get(group, ()))
            for w in winners:
                if w not in members:
                    c = self.coordinators.of(w)
                    with c.lock:
                        c.live(w.sequence, "commit")  # unknown or finished: its own error
                    raise InvalidTxnStatus(f"transaction {w} is not in group {excerpt(group)}")
            losers = sorted(members.difference(winners))
            return self._decide_locked(winners, losers, group, key, expected)

    def members(self, group: str) -> set:
        """The live transactions labelled `group`."""
        with self._lock:
            return set(self._groups.get(group, ()))

    def abort_group(self, group: str) -> dict:
        _check_label(group)
        with self._lock:
            members = sorted(self._groups.get(group, ()))
        return self._decide([], members, group, None)

    def _decide(self, commits, aborts, group, key, expected=None) -> dict:
        with self._decision_lock:
            return self._decide_locked(commits, aborts, group, key, expected)

    def _decide_locked(self, commits, aborts, group, key, expected=None) -> dict:
        """One record decides every transaction named: commits must all be OPEN and able to
        commit (else nothing is decided); aborts that are no longer OPEN are left as they
        are. Returns once every one is finalized or has a participant retried in the
        background (the operation timeout bounds the waits)."""
        expected = expected or {}
        deadline = time.monotonic() + self.coordinators.operation_timeout_s
        coords = sorted({t.coordinator_id for t in list(commits) + list(aborts)})
        locked = [self.coordinators.coordinator(cid) for cid in coords]
        for c in locked:
            c.check_ready()
        decision_id = self._next_decision
        metas_c: list[TxnMeta] = []
        metas_a: list[TxnMeta] = []
        for c in locked:
            c.lock.acquire()
        try:
            for t in commits:
                c = self.coordinators.of(t)
                meta = c.live(t.sequence, "commit")
                if meta.state is not OPEN or not meta.durable:
                    raise status_error(t, meta.state, meta.reason, meta.timeout_ms, "commit")
                metas_c.append(meta)
            for t in aborts:
                meta = self.coordinators.of(t).txns.get(t.sequence)
                if meta is not None and meta.state is OPEN and meta.durable:
                    metas_a.append(meta)
            for meta in metas_c:
                meta.state, meta.reason, meta.decision = (
                    TxnState.COMMITTING,
                    EndReason.GROUP,
                    decision_id,
                )
            for meta in metas_a:
                meta.state, meta.reason, meta.decision = (
                    TxnState.ABORTING,
                    EndReason.GROUP,
                    decision_id,
                )
        finally:
            for c in reversed(locked):
                c.lock.release()
        everyone = metas_c + metas_a
        try:
            for meta in everyone:
                c = self.coordinators.of(meta.txn_id)
                with c.lock:
                    while meta.inflight:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise Timeout(
                                f"transaction {meta.txn_id}: a write that registers its "
                                "participants has not landed; nothing was decided"
                            )
                        c.cond.wait(left)
            for meta in metas_c:
                acks, sends = expected.get(meta.txn_id, (None, None))
                c = self.coordinators.of(meta.txn_id)
                c._committable(meta, acks, sends)
                c.prepare(meta, acks)
        except BaseException:
            for meta in everyone:
                self.coordinators.of(meta.txn_id).reopen(meta)
            raise
        if not everyone and key is None:
            return {"committed": [], "aborted": [], "duplicate": False}
        record = log.encode_decision(
            log.Decision(
                decision_id,
                [m.txn_id for m in metas_c],
                [m.txn_id for m in metas_a],
                EndReason.GROUP,
                group,
            )
        )
        dkey = log.DECISION_KEY.pack(decision_id)
        ddb, kdb = self._decisions_db, self._group_keys_db

        def apply(lmdb_txn):
            if everyone:
                lmdb_txn.put(dkey, record, db=ddb)
            if key is not None:
                lmdb_txn.put(key[0], _IDEM.pack(key[1]), db=kdb)

        try:
            op = WriteOp(apply, nbytes=len(record))
            self.storage.wait(self.storage.submit(op))
        except BaseException:
            for meta in everyone:
                self.coordinators.of(meta.txn_id).reopen(meta)
            raise
        self._next_decision = decision_id + 1
        if everyone:
            with self._lock:
                self._decisions[decision_id] = {m.txn_id for m in everyone}
        for meta in everyone:
            self.coordinators.of(meta.txn_id).finalize(meta)
        for meta in everyone:
            self.coordinators.of(meta.txn_id).wait_settled(meta, deadline)
        return {
            "committed": [m.txn_id for m in metas_c],
            "aborted": [m.txn_id for m in metas_a],
            "duplicate": False,
        }

    def _already_decided(self, key) -> bool:
        with self.storage.read() as lmdb_txn:
            raw = lmdb_txn.get(key[0], db=self._group_keys_db)
        return raw is not None and _IDEM.unpack(bytes(raw))[0] >= key[1]

    def left(self, meta: TxnMeta) -> None:
        """A transaction is COMMITTED or ABORTED: it leaves its group."""
        if meta.group is None:
            return
        with self._lock:
            members = self._groups.get(meta.group)
            if members is not None:
                members.discard(meta.txn_id)
                if not members:
                    del self._groups[meta.group]

    def release(self, meta: TxnMeta) -> None:
        """A transaction's participants have all landed their part: the decision record that
        names it is deleted once it names no other unfinished transaction."""
        if meta.decision is None:
            return
        with self._lock:
            did = meta.decision
            if did is None:
                return
            remaining = self._decisions.get(did)
            if remaining is None:
                return
            remaining.discard(meta.txn_id)
            if remaining:
                return
            del self._decisions[did]
        self._delete_decision(did)

    def _delete_decision(self, decision_id: int) -> None:
        key, db = log.DECISION_KEY.pack(decision_id), self._decisions_db
        if not self.storage.closed:
            try:
                op = WriteOp(lambda t: t.delete(key, db=db), nbytes=8, durable=False)
                self.storage.submit(op, lazy=True)
            except Exception:  # noqa: BLE001 - recovery deletes it next time
                pass


def _check_label(group) -> None:
    if not isinstance(group, str) or not group:
        raise ValueError(f"group must be a non-empty str, not {excerpt(group)}")
    if len(group.encode()) > log.MAX_NAME_BYTES:
        raise ValueError(f"group label of {len(group.encode())} bytes is too long")


def _idempotency(key):
    if key is None:
        return None
    if (
        not isinstance(key, tuple)
        or len(key) != 2
        or not isinstance(key[0], str)
        or not key[0]
        or isinstance(key[1], bool)
        or not isinstance(key[1], int)
        or not 0 <= key[1] < 1 << 64
    ):
        raise ValueError(
            f"idempotency_key must be (app_id: str, version: int >= 0), not {excerpt(key)}"
        )
    app_id = key[0].encode()
    if len(app_id) > MAX_APP_ID_BYTES:
        raise ValueError(
            f"idempotency_key app_id of {len(app_id)} bytes is too long: at most "
            f"{MAX_APP_ID_BYTES} (it is a key of the store)"
        )
    return app_id, key[1]
