"""The end of a transaction at its coordinator: the decision (seeds: TC deep dive, "end
transaction"). It is one write: the END record with what the participants that live in this
broker can write in the same LMDB transaction, or, when every participant lives here, the whole
end with no END record. Telling the participants follows in :mod:`pulsartxn.txn.finalize`;
what they answer is in :mod:`pulsartxn.txn.participant`."""

from __future__ import annotations

import heapq
import time
from typing import TYPE_CHECKING

from ..errors import (
    InvalidTxnStatus,
    StorageError,
    Timeout,
    TransactionConflict,
)
from ..storage import WriteOp, combine
from . import log
from .finalize import Finalize, retry_logged
from .meta import (
    ABORTING,
    COMMITTING,
    OPEN,
    TxnMeta,
    abort_only,
    status_error,
)
from .participant import PARTITION, SUBSCRIPTION

if TYPE_CHECKING:
    pass


class TransactionEnd(Finalize):
    """Decide the end of a transaction (a Coordinator is one: see Finalize for what it uses
    of the coordinator)."""

    def live(self, seq: int, op: str) -> TxnMeta:
        """The live transaction `seq` (else the error `op` on it raises)."""
        raise NotImplementedError

    def end(
        self,
        seq: int,
        commit: bool,
        reason: int,
        expected_acks=None,
        riding=(),
        expected_sends=None,
        deadline: float | None = None,
    ) -> TxnMeta:
        """Decide the end of one transaction (logged), then finalize its participants.

        The decision is one write: the END record, with what the participants that live in
        this broker can write in the same LMDB transaction (the pending acks a commit needs
        durable, and the partitions' markers), after the transaction's own data batches that
        were still waiting to ride with a group commit (`riding`: (op, carries a staged
        registration, partition)). Only the subscriptions' cursor updates follow, deferred:
        the END record stays until they have landed, so a crash before that finalizes them
        again. When that one write holds every participant's part (all of them live in this
        broker; subscriptions then write their cursors in it too), it is the whole end: no
        END record, and it deletes what the transaction had in the log.

        `expected_acks` ((partition, subscription) -> n) and `expected_sends` (partition -> n):
        what the committer made, None when it does not know (a handle on a transaction
        opened elsewhere). A commit that cannot happen for good (a failed op, lost acks or
        sends) raises an error marked ``abort_only``. `deadline` (time.monotonic()) bounds
        the wait for the transaction's writes in flight (Timeout; nothing is decided)."""
        taken = self.storage.commits.take_lazy([r[0] for r in riding]) if riding else []
        if taken and not commit:
            # An in-process transaction's batches (held) are written, aborted, as Pulsar has
            # them in the ledger: its sends answered with claimed entry ids, and the sequence
            # ids of all of them then do not count, after a restart too. Others are dropped.
            dropped = [o for o in taken if not o.held]
            _fail_ops(dropped, InvalidTxnStatus(f"transaction {self.id}:{seq} was aborted"))
            taken = [o for o in taken if o.held]
        try:
            per_partition, staged = self._riding(riding, taken, commit)
            meta, empty, index, lwm, first = self._start_end(
                seq, commit, reason, staged, bool(taken), deadline
            )
        except BaseException as exc:
            _fail_ops(taken, exc)
            raise
        done: set = set()
        try:
            if commit:
                self._committable(meta, expected_acks, expected_sends)
            if not empty:
                self._decide(meta, index, lwm, first, taken, per_partition, expected_acks, done)
            elif first is None:
                # Nothing to finalize: deleting the records is the whole end. (Had it never
                # written anything, there would be nothing to decide or undo.)
                self._write(self._delete_records(meta, index), 16 * index)
        except BaseException:
            self.reopen(meta)
            raise
        if empty:
            self._finished(meta)
        else:
            self.finalize(meta, done)
        return meta

    def _start_end(self, seq, commit, reason, staged, has_taken, deadline):
        """Mark the transaction COMMITTING or ABORTING once its writes in flight have landed
        (but the `staged` ones taken to land with the decision); return ``(meta, empty,
        index of the END record, low watermark, its staged NEW record or None)``."""
        op = "commit" if commit else "abort"
        with self.lock:
            meta = self.live(seq, op)
            if meta.state is not OPEN or not meta.durable:
                raise status_error(meta.txn_id, meta.state, meta.reason, meta.timeout_ms, op)
            meta.state = COMMITTING if commit else ABORTING
            meta.reason = reason
            while meta.inflight > staged:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    meta.state, meta.reason = OPEN, 0
                    raise Timeout(
                        f"cannot {op} transaction {meta.txn_id} in time: a write that "
                        "registers its participants has not landed; it is still OPEN"
                    )
                self.cond.wait(left)
            empty = not meta.partitions and not meta.subscriptions and not has_taken
            index = meta.records
            if not empty:
                meta.records += 1
                self.log_appends += 1
            return meta, empty, index, self._lwm(), meta.new_record

    def _decide(self, meta, index, lwm, first, taken, per_partition, expected_acks, done):
        """Write the decision with every local participant's part (and the `taken` data
        batches); a part that fails it makes the decision be written alone."""
        try:
            ops, end_at, atomic, told = self._decision_ops(
                meta, expected_acks, lwm, done, per_partition
            )
        except BaseException as exc:
            _fail_ops(taken, exc)
            raise
        # With every participant's part in it, the write is the whole end: its staged records
        # are not written, those in the log are deleted with it. A subscription's
        # registration may ride in a write nobody waits for: with subscriptions the records
        # are deleted even while the NEW record is staged (deleting nothing is harmless).
        # Either way the write keeps the transaction's outcome.
        if atomic:
            with self.lock:
                meta.atomic_end = True
            written = first is None or meta.subscriptions
            ops.append(self._delete_op(meta, meta.records if written else 0))
        else:
            ops.insert(end_at, self._end_op(meta, index))
        ops[:0] = [_answered_if_written(o) for o in taken]
        if first is not None and not atomic:
            ops.insert(0, self._put_op(first.key, first.value))
        try:
            decision = combine(ops)
        except BaseException as exc:
            _fail_ops(ops + taken, exc)
            raise
        try:
            self.storage.run(decision)
        except Exception:  # noqa: BLE001 - decided below without them
            # A participant's part failed with it (nothing was written): decide alone, then
            # finalize every participant the slow way, retried until each succeeds.
            done.clear()
            with self.lock:
                meta.atomic_end = False  # registrations riding with its data are written now
            if taken:
                # Its data, alone: if that fails too, the transaction cannot commit.
                try:
                    self.storage.run(combine(taken))
                except Exception as data_exc:  # noqa: BLE001
                    if meta.commit:
                        if isinstance(data_exc, StorageError):  # a full disk says so
                            raise abort_only(data_exc) from None
                        raise abort_only(
                            InvalidTxnStatus(
                                f"cannot commit transaction {meta.txn_id}: its sends could "
                                f"not be written: {data_exc}"
                            )
                        ) from data_exc
            self._decide_alone(meta, index, expected_acks, first)
            return
        # Landed; a stand-in whose publication raised left its op unanswered: answer it.
        _fail_ops(taken, InvalidTxnStatus(f"a send of transaction {meta.txn_id} was lost"))
        if atomic:
            self._landed_atomic(meta, told, done)

    def _landed_atomic(self, meta: TxnMeta, told, done: set) -> None:
        """A one-write end landed: no record is left. A subscription whose in-memory part
        failed after its write landed is told again by finalize, retried until it succeeds."""
        with self.lock:
            meta.records = 0
        for part, o in told:
            exc = o.future.exception()
            if exc is not None:
                done.discard(part)
                with self.lock:
                    meta.retries += 1
                    meta.last_error = f"{part[0]} {part[1]}: {exc!r}"
                    self.finalize_retries += 1
                retry_logged(meta, part, exc)

    def _committable(self, meta: TxnMeta, expected_acks, expected_sends) -> None:
        """Raise (abort_only) unless the transaction may commit: no op of it failed, and
        nothing its committer made was lost (checked by participant when it is unverified;
        the subscriptions check their acks with the decision either way)."""
        if meta.failed is not None:
            failed = meta.failed
            cls = (
                type(failed)
                if isinstance(failed, (TransactionConflict, InvalidTxnStatus))
                else None
            )
            raise abort_only(
                (cls or InvalidTxnStatus)(f"transaction {meta.txn_id} cannot commit: {failed}")
            ) from failed
        for name, n in (expected_acks or {}).items():
            if n and tuple(name) not in meta.subscriptions:
                # Its registration rode with acks that never reached the log.
                raise abort_only(
                    InvalidTxnStatus(
                        f"transaction {meta.txn_id}: its {n} acknowledgements on "
                        f"{name[0]} {name[1]} were lost when its broker stopped"
                    )
                )
        if not meta.unverified:
            return
        if expected_acks is None or expected_sends is None:
            raise abort_only(
                InvalidTxnStatus(
                    f"transaction {meta.txn_id} was open when its broker stopped without "
                    "closing, and only the handle that made its sends and acks can tell "
                    "whether all of them are still there: commit it with that handle"
                )
            )
        for name, n in expected_sends.items():
            have = 0
            if name in meta.partitions:
                participant = self.service.participants.local(PARTITION, name)
                # One in another broker checks its own messages at its end.
                have = n if participant is None else participant.messages_of(meta.txn_id)
            if have < n:
                raise abort_only(
                    InvalidTxnStatus(
                        f"transaction {meta.txn_id}: {n - have} of its {n} messages on {name} "
                        "were lost when its broker stopped"
                    )
                )

    def _riding(self, riding, taken, commit: bool) -> tuple[dict, int]:
        """Of the transaction's lazily submitted batches: wait for those not taken back (they
        are being committed); return the taken ones per partition and how many of those
        carry a staged registration (counted in the transaction's inflight writes)."""
        taken_ids = {id(o) for o in taken}
        for o, _, topic in riding:
            if id(o) in taken_ids:
                continue
            try:
                o.future.result()
            except Exception as exc:  # noqa: BLE001 - a failed send: abort only
                if commit:
                    raise abort_only(
                        InvalidTxnStatus(
                            f"cannot commit: a send of the transaction to {topic} failed: {exc}"
                        )
                    ) from exc
        per_partition: dict = {}
        staged = 0
        for o, carries, topic in riding:
            if id(o) in taken_ids:
                per_partition[topic] = per_partition.get(topic, 0) + 1
                staged += bool(carries)
        return per_partition, staged

    def _put_op(self, key: bytes, value: bytes) -> WriteOp:
        db = self.db
        return WriteOp(lambda t: t.put(key, value, db=db), nbytes=len(value))

    def _end_op(self, meta: TxnMeta, index: int) -> WriteOp:
        """The END record, at `index` of the transaction's records."""
        key = log.record_key(meta.seq, index)
        return self._put_op(key, log.encode_end(meta.commit, meta.reason))

    def _decide_alone(self, meta: TxnMeta, index: int, expected_acks, first) -> None:
        if meta.commit:
            self.prepare(meta, expected_acks)
        ops = [self._end_op(meta, index)]
        if first is not None:
            ops.insert(0, self._put_op(first.key, first.value))
        self.storage.run(combine(ops))

    def _decision_ops(self, meta: TxnMeta, expected_acks, lwm: int, done: set, riding=None):
        """What local participants write with the decision: ``(ops, end_at, atomic, told)``,
        with where in those ops the END record goes (after the pending acks, before the
        markers); `done` gets the participants whose part is in those ops. `atomic` when that
        is all of them (every one lives in this broker): the ops are then the whole end and no
        END record is needed; subscriptions write their cursors in them too (the record as it
        will be with the transaction's acks: the cursor in memory takes them once the write
        has landed), and `told` lists them with their ops."""
        ops: list[WriteOp] = []
        told: list = []  # (participant, its op) of the subscriptions in an atomic end
        commit = meta.commit
        expected_acks = expected_acks or {}
        partitions, subscriptions = _in_order(meta.partitions), _in_order(meta.subscriptions)
        find = self.service.participants.find
        local = {}
        for kind, names in ((PARTITION, partitions), (SUBSCRIPTION, subscriptions)):
            for name in names:
                try:
                    participant, here = find(kind, name)
                except Exception:  # noqa: BLE001 - finalize retries it
                    continue
                if here:
                    local[kind, name] = participant
        atomic = len(local) == len(partitions) + len(subscriptions)
        try:
            if atomic:
                for name in subscriptions:
                    expected = expected_acks.get(tuple(name)) if commit else None
                    o = local[SUBSCRIPTION, name].end_op(meta.txn_id, commit, lwm, expected)
                    if o is None:  # it cannot take part: the logged way for all
                        atomic = False
                        ops.clear()
                        told.clear()
                        done.clear()
                        break
                    ops.append(o)
                    told.append(((SUBSCRIPTION, name), o))
                    done.add((SUBSCRIPTION, name))
            if not atomic and commit:
                for name in subscriptions:
                    expected = expected_acks.get(tuple(name))
                    participant = local.get((SUBSCRIPTION, name))
                    if participant is not None:
                        o = participant.prepare_op(meta.txn_id, expected)
                        if o is not None:
                            ops.append(o)
            end_at = len(ops)
            riding = riding or {}
            for name in partitions:
                participant = local.get((PARTITION, name))
                if participant is None:
                    continue
                o = participant.end_op(meta.txn_id, commit, lwm, riding.get(name, 0))
                if o is not None:
                    ops.append(o)
                done.add((PARTITION, name))
        except BaseException as exc:
            _fail_ops(ops, exc)
            raise
        return ops, end_at, atomic, told

    def prepare(self, meta: TxnMeta, expected_acks: dict | None = None) -> None:
        """Before a commit is decided: participants that batch their own logs (pending acks)
        make this transaction's part durable, so the decision never outruns them, and check
        that they hold every ack the committer made (expected_acks: (partition, subscription)
        -> count)."""
        expected_acks = expected_acks or {}
        for name in sorted(meta.subscriptions):
            participant = self.service.participants.local(SUBSCRIPTION, name)
            if participant is not None:
                participant.prepare(meta.txn_id, expected_acks.get(tuple(name)))

    def reopen(self, meta: TxnMeta) -> None:
        """Undo a decision whose record could not be written (nothing was decided)."""
        with self.lock:
            meta.state = OPEN
            meta.reason = 0
            meta.decision = None
            meta.atomic_end = False
            meta.deleted = False
            heapq.heappush(self._deadlines, (meta.deadline, meta.seq))
            self.append_failures += 1

    def _write(self, apply, nbytes: int, durable: bool = True) -> None:
        self.storage.write(apply, nbytes=nbytes, durable=durable)


def _in_order(names) -> list:
    """A transaction's participants of one kind, sorted (the order its end writes them)."""
    return sorted(names) if len(names) > 1 else list(names)


def _answered_if_written(op: WriteOp) -> WriteOp:
    """`op` in a write that may fail as a whole: if it does, `op` stays unanswered (to be
    written again alone); if it lands, `op` is answered as if written itself."""
    stand_in = WriteOp(op.apply, op.nbytes, op.records, op.on_commit, durable=op.durable)

    def answer(fut) -> None:
        if fut.exception() is None:
            op.future.set_result(fut.result())

    stand_in.future.add_done_callback(answer)
    return stand_in


def _fail_ops(ops, exc) -> None:
    """Ops built but never submitted: answer them with `exc` (their callbacks undo)."""
    for op in ops:
        if not op.future.done():
            op.future.set_exception(exc)
