"""The server's transaction actions: begin, state, commit or abort, and the decisions over
many transactions (``commit_all``, ``commit_group``, ``abort_group``). Part of
``BrokerServer``."""

from __future__ import annotations

from .. import errors
from ..txn.state import FINAL
from ..txn.transaction import as_txn_id
from .protocol import id_list, jsonable
from .sessions import room


class TxnActions:
    """Flight actions of transactions (``BrokerServer`` defines the helpers they call)."""

    def _on_new_transaction(self, args, payload):
        s = self.sessions.get(args)
        self._drop_spares(s, args.get("drop"), args.get("lost"))
        self._room_for_one(s)
        label = args.get("group")
        group_capability = None
        if label is not None:
            group_capability = self.sessions.group(
                s, label, args.get("group_capability"), claim=True
            )
        out = self._begin(s, args.get("timeout_ms"), args.get("coordinator_id"), label)
        return {**out, "group_capability": group_capability}

    def _begin(self, s, timeout_ms, coordinator_id, label=None) -> dict:
        """A new transaction of session `s` (its room checked): its id and capability."""
        if coordinator_id is None and self.cluster is not None:
            coordinator_id = self.cluster.local_coordinator()
        txn = s.client.new_transaction(timeout_ms, coordinator_id, label)
        s.remember(str(txn.id), txn)
        return {
            "txn": str(txn.id),
            "capability": self.sessions.capability(b"txn:" + str(txn.id).encode()),
        }

    def _room_for_one(self, s) -> None:
        if len(s.txns) >= self.sessions.limits.transactions:
            s.prune()  # those that ended through other handles or timed out go first
            room(len(s.txns), self.sessions.limits.transactions, "open transactions")

    def _on_drop_spares(self, args, payload):
        """What a new_transaction's `drop` and `lost` do, for a client whose begin goes
        elsewhere (a cluster client: the spare lives at the broker that ended the last one)."""
        self._drop_spares(self.sessions.get(args), args.get("drop"), args.get("lost"))
        return {}

    @staticmethod
    def _drop_spares(s, drop, lost=None) -> None:
        """Abort the spare transactions the client began with an end and never handed out
        (remote/spare.py): those named in `drop`, and those begun with the ends named in
        `lost` (ends whose answer, and the spare in it, never reached the client). Only the
        session's own, and those still open."""
        drop, lost = id_list(drop, "drop", "TxnID strings"), id_list(lost, "lost", "TxnID strings")
        for key in drop + [k for k in map(s.take_spare, lost) if k is not None]:
            txn = s.txns.get(key)
            if txn is None:
                continue
            try:
                if txn.state not in FINAL:
                    txn.abort()
            except errors.PulsarTxnError:
                pass  # it timed out or ended meanwhile: nothing to drop
            s.forget(key)

    def _on_group_capability(self, args, payload):
        s = self.sessions.get(args)
        label = args["group"]
        if not isinstance(label, str) or not label:
            raise ValueError(f"group must be a non-empty str, not {errors.excerpt(label)}")
        return {"capability": self.sessions.group(s, label, args.get("capability"), claim=True)}

    def _on_txn_state(self, args, payload):
        s = self.sessions.get(args)
        value, capability = args["txn"], args.get("capability")
        if value in s.txns or self.sessions.admin() or capability is not None:
            # A handle on it: the session holds it from now on (it outlives its opener's).
            return {"state": self.sessions.txn(s, value, True, capability).state.value}
        # Reading a state needs no capability (using or ending it does).
        return {"state": self.broker.txn.state_of(as_txn_id(value)).value}

    def _on_end(self, args, payload):
        s = self.sessions.get(args)
        begin = args.get("next")  # the client's next transaction, begun after this end
        if begin is not None and (
            not isinstance(begin, dict) or set(begin) - {"timeout_ms", "coordinator_id"}
        ):
            raise TypeError(
                f"next must name timeout_ms and coordinator_id only, not {errors.excerpt(begin)}"
            )
        txn = self.sessions.txn(s, args["txn"], required=True, capability=args.get("capability"))
        if args.get("commit"):
            counts = None
            if args.get("counted"):  # the client's handle opened it: its counts are whole
                acks = {tuple(k): n for k, n in args.get("expected_acks") or []}
                sends = {str(k): n for k, n in args.get("expected_sends") or []}
                counts = (acks, sends)
            txn.commit(args.get("timeout_ms"), counts=counts)
        else:
            txn.abort(args.get("timeout_ms"))
        state = txn.state
        if state in FINAL:
            s.forget(args["txn"])
        out = {"state": state.value}
        if begin is not None:  # a spare (remote/spare.py)
            out["next"] = self._spare(s, args["txn"], begin)
        return out

    def _spare(self, s, ended: str, begin: dict) -> dict | None:
        """The spare begun with the end of `ended`, remembered by that end: a client that
        never had the answer names the end in a later call (`lost`) for it to be aborted."""
        try:
            self._room_for_one(s)
            out = self._begin(s, begin.get("timeout_ms"), begin.get("coordinator_id"))
        except (errors.PulsarTxnError, TypeError, ValueError):
            return None  # the client begins it with a call of its own
        s.spare_begun(ended, out["txn"])
        return out

    def _on_commit_all(self, args, payload):
        s = self.sessions.get(args)
        caps = args.get("capabilities") or [None] * len(args["txns"])
        handles = [self.sessions.txn(s, t, True, c) for t, c in zip(args["txns"], caps)]
        s.client.commit_all(handles)
        return {}

    def _on_commit_group(self, args, payload):
        s = self.sessions.get(args)
        self.sessions.group(s, args["group"], args.get("group_capability"), claim=False)
        key = args.get("idempotency_key")
        out = s.client.commit_group(
            args["group"], args["winners"], tuple(key) if key is not None else None
        )
        return jsonable(out)

    def _on_abort_group(self, args, payload):
        s = self.sessions.get(args)
        self.sessions.group(s, args["group"], args.get("group_capability"), claim=False)
        return jsonable(s.client.abort_group(args["group"]))
