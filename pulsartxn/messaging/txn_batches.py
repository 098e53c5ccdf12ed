"""A producer's transactional batching: a batch per (partition, transaction) waits until it
fills or its transaction ends, which takes it into its end's write (an abort's too: aborted
there); a transaction that ended without it (a timeout) drops it unsent, and its sequence ids
are recorded as never written.

``TransactionBatches`` is the part of :class:`~pulsartxn.messaging.producer.Producer` that
does this; it uses the producer's partition producers, batching limits and client.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

from .._native import TxnBatch, encode_entry
from .._native.types import MAX_SEQUENCE_ID, sequences_used_up
from ..errors import InvalidTxnStatus
from ..txn.log import IN_PROCESS
from ..txn.state import FINAL

# Waiting transaction batches past which a producer drops those of transactions that ended
# without them (a transaction left to its timeout never flushes them), and twice what is left.
_SWEEP_TXN_BATCHES_AT = 64


class TransactionBatches:
    """A producer's batches of transactions (a mixin of Producer)."""

    def _init_txn_batches(self) -> None:
        self._txn_batches: dict = {}  # (partition producer, TxnID) -> TxnBatch
        self._sweep_at = _SWEEP_TXN_BATCHES_AT

    def _txn_add(self, txn, content, properties, partition_key, sequence_id) -> Future:
        """Queue one message of a transaction in its (partition, transaction) batch."""
        txn = self.client._txn_for(txn)
        if len(self._txn_batches) >= self._sweep_at:
            self._drop_ended()
        part = self._part_for(partition_key)
        resent = False
        with part.lock:
            if sequence_id is None:
                if part.last_sequence >= MAX_SEQUENCE_ID:
                    raise sequences_used_up(self.name, part.partition.topic)
                sequence_id = part.last_sequence + 1
            elif sequence_id <= part.last_sequence:
                fut = self._txn_duplicate(part, txn, sequence_id)
                if fut is not None:
                    return fut
                resent = True
            part.last_sequence = max(part.last_sequence, sequence_id)
            key = (id(part), txn.id)
            batch = self._txn_batches.get(key)
            if batch is not None and (
                len(batch.values) >= self.batching_max_messages
                or batch.nbytes + len(content) > self.batching_max_bytes
                or sequence_id != batch.first_sequence + len(batch.values)
            ):
                self._txn_send_locked(key)
                batch = None
            if batch is None:
                batch = self._txn_batches[key] = TxnBatch(part, txn, sequence_id)
                batch.outcome.on_wait = _SendNow(self, key, batch)
                part.txn_opened(txn, batch)
                txn._add_producer(self)
            fut = batch.add(content, properties, partition_key)
            if resent:
                batch.resent = True
            if (
                not self.batching_enabled
                or len(batch.values) >= self.batching_max_messages
                or txn._final is not None  # ended meanwhile, after its end's last flush
            ):
                self._txn_send_locked(key)
        return fut

    def _txn_duplicate(self, part, txn, sequence_id: int) -> Future | None:
        """A resend's answer (part lock held): the future of the message still waiting in
        this producer, the MessageId it is stored under, or None when its entry was aborted
        and it is to be stored anew."""
        for key, batch in list(self._txn_batches.items()):
            if batch.part is part:
                fut = batch.waiting(sequence_id)
                if fut is not None:
                    if batch.txn.id != txn.id:
                        # Sent now: a wait for it must not last until another transaction ends.
                        self._txn_send_locked(key)
                    return fut
        fut = part.waiting(sequence_id)
        if fut is not None:
            part._flush_locked()  # a plain batch still open is sent now, as above
            return fut
        mid = part.partition.duplicate_of(self.name, sequence_id)
        if mid is None or (mid.entry_id() < 0 and part.was_dropped(sequence_id)):
            return None
        done: Future = Future()
        done.set_result(mid)
        return done

    def _txn_send_locked(self, key) -> None:
        """Encode one transaction batch into an entry and append it (part lock held)."""
        batch = self._txn_batches.pop(key)
        part, txn = batch.part, batch.txn
        part.txn_sealed(batch)
        partition = part.partition
        staged = None
        try:
            # The partition's registration with the coordinator rides in this write.
            staged = txn._stage_partition(partition.topic)
            partition.buffer.begin_append(txn.id)
        except Exception as exc:  # noqa: BLE001 - every message of the batch gets it
            if staged is not None:
                staged[1](False)
            batch.inflight = _dropped(batch, exc)  # a flush waits until they have failed
            txn._failed(exc)
            return
        entry = encode_entry(
            batch.values,
            batch.keys,
            batch.props,
            txn_msb=txn.id.most_sig_bits,
            txn_lsb=txn.id.least_sig_bits,
            producer_id=self.producer_id,
            sequence_id=batch.first_sequence,
            publish_time=int(time.time() * 1000),
        )
        n = len(batch.values)
        # An in-process transaction's batch is written with its end (or the next group
        # commit): its entry id is claimed now, so the send has its MessageIds at once.
        held = self.client._owner == IN_PROCESS
        claim = None
        if held:
            with partition.lock:
                claim = partition.claim(1)
                partition.buffer.claimed(txn.id, claim)

        def before_publish(first: int) -> None:
            partition.buffer.appended(txn.id, first)

        op = partition.append_op(
            [entry],
            [n],
            batch.nbytes,
            self.name,
            batch.first_sequence,
            on_published=None if held else batch.landed,
            before_publish=before_publish,
            resend=batch.resent,
            at=claim,
        )
        if staged is not None:
            op.prepend(staged[0])
        # Lazy: it rides with the next group commit, or in the transaction's decision when
        # that comes first (then data, decision and markers are one LMDB transaction). Not
        # durable on its own: the commit's flush makes it so. An in-process transaction's is
        # held: it dies with the process anyway, so its record may wait for the next one.
        op.durable = False
        op.held = held
        if claim is None:
            batch.inflight = op.future
        else:
            # Answered now, durable by the commit (decision 2), as send_batch's; among the
            # container's batches in flight until written, for resends to find.
            part.inflight.append(batch)
            batch.landed(claim)

        def failed(f):
            batch.inflight = None  # no cycle batch -> future -> this callback -> batch
            if claim is not None:
                part._landed(batch)
            exc = f.exception()
            if staged is not None:
                staged[1](exc is None)
            if exc is not None:
                if claim is not None:
                    partition.buffer.claim_failed(claim)
                partition.buffer.append_failed(txn.id)
                _dropped(batch)
                batch.fail(exc)
                txn._failed(exc)

        # Added before the write is submitted: a group that another thread commits may
        # answer it at once, and a callback added to an answered future runs in the adding
        # thread, which holds part.lock (not reentrant) here.
        op.future.add_done_callback(failed)
        partition.storage.submit(op, lazy=True)
        txn._riding.append((op, staged is not None, partition.topic))
        txn._send_counts[partition.topic] = txn._send_counts.get(partition.topic, 0) + n

    def _txn_flush(self, txn, wait: bool = True) -> None:
        """Send this transaction's waiting batches; with `wait`, until they are durable.
        Without, they ride with the next group commit or in the transaction's decision."""
        sent = []
        for key, batch in list(self._txn_batches.items()):
            if batch.txn is not txn and batch.txn.id != txn.id:
                continue
            with batch.part.lock:
                if self._txn_batches.get(key) is batch:
                    self._txn_send_locked(key)
            sent.append(batch)
        if not wait:
            return
        inflight = [b.inflight for b in sent if b.inflight is not None]
        if inflight:
            storage = sent[0].part.partition.storage
            held = self.client._owner == IN_PROCESS
            storage.commits.flush_lazy(durable=False, lead=True, held=held)
            for fut in inflight:
                try:
                    storage.wait(fut)
                except Exception:  # noqa: BLE001 - recorded on the transaction
                    pass

    def _txn_drop(self, txn) -> None:
        """`txn` ended without them (timed out, or ended elsewhere): its waiting messages
        are never sent (their sequence ids are remembered here as dropped)."""
        for key, batch in list(self._txn_batches.items()):
            if batch.txn.id == txn.id:
                with batch.part.lock:
                    if self._txn_batches.pop(key, None) is batch:
                        batch.part.txn_sealed(batch)
                        _dropped(batch, InvalidTxnStatus(f"transaction {txn.id} was aborted"))

    def _refused(self, sends, exc: Exception) -> list[Future]:
        """Sends of a transaction that ended before they reached a batch here: a remote
        producer's, whose client took their sequence ids and queued them, as a batch here
        waits. Their ids are recorded as never written, as a dropped batch's are; then each
        send's future fails with `exc`. `sends`: (partition key, sequence id) pairs."""
        by_part: dict = {}  # partition producer -> the sequence ids sent there
        for key, seq in sends:
            if type(seq) is int and 0 <= seq <= MAX_SEQUENCE_ID:  # else refused all the same
                by_part.setdefault(self._part_for(key), []).append(seq)
        for part, seqs in by_part.items():
            runs: list[tuple[int, int]] = []  # the new ones, consecutive ids as (first, end)
            with part.lock:
                for seq in seqs:
                    if seq <= part.last_sequence:
                        continue  # stored, or recorded already: the refusal answers it
                    part.last_sequence = seq
                    if runs and runs[-1][1] == seq:
                        runs[-1] = (runs[-1][0], seq + 1)
                    else:
                        runs.append((seq, seq + 1))
                part.dropped.extend(runs)
            if runs:
                storage = part.partition.storage
                storage.wait(storage.submit(part.partition.never_written_op(self.name, runs)))
        futures = []
        for _ in sends:
            fut: Future = Future()
            fut.set_exception(exc)
            futures.append(fut)
        return futures

    def _drop_ended(self) -> None:
        """Drop the waiting batches of transactions that have ended (timed out or aborted
        elsewhere): their messages fail, as they would at the next flush, instead of being
        held until then."""
        for txn in {b.txn for b in list(self._txn_batches.values())}:
            if txn.state in FINAL:
                self._txn_drop(txn)
        self._sweep_at = max(_SWEEP_TXN_BATCHES_AT, 2 * len(self._txn_batches))


class _SendNow:
    """A transaction batch's ``on_wait``: somebody waits on one of its futures, so it is
    written now (stored, durable by the commit) rather than when it fills or its transaction
    ends. Blocking, in the waiter's thread; else through the broker's flusher thread (the
    waiter holds the futures' locks: concurrent.futures.wait)."""

    __slots__ = ("producer", "key", "batch")

    def __init__(self, producer, key, batch) -> None:
        self.producer, self.key, self.batch = producer, key, batch

    def __call__(self, block: bool) -> None:
        if block:
            self.flush_if_older(0.0, wait=True)
        else:
            self.batch.part.partition.broker_flusher.watch(self)

    def flush_if_older(self, seconds: float, wait: bool = False) -> bool:
        producer, batch = self.producer, self.batch
        with batch.part.lock:
            if producer._txn_batches.get(self.key) is batch:
                producer._txn_send_locked(self.key)
        fut = batch.inflight
        if fut is not None and not fut.done():
            storage = batch.part.partition.storage
            if wait:
                try:
                    storage.wait(fut)
                except Exception:  # noqa: BLE001 - the batch's futures carry it
                    pass
            else:
                storage.commits.flush_lazy(durable=False)
        return True


def _dropped(batch, exc: Exception | None = None) -> Future | None:
    """`batch` is never written (its transaction can only abort): its sequence ids do not
    count, a resend of one is stored anew. With `exc`, that goes on record too (for a new
    producer, or after a restart, whose highest sequence may be past them), and the batch's
    messages fail with `exc` once it has; the future of that write. The record rides lazily
    with the next group, so it lands before anything this producer writes after it."""
    span = (batch.first_sequence, batch.first_sequence + len(batch.values))
    part = batch.part
    part.dropped.append(span)
    if exc is None:
        return None
    partition = part.partition
    op = partition.never_written_op(part.producer.name, [span])
    # Before the submit, as in _txn_send_locked: the caller may hold part.lock, and the
    # messages' own callbacks (the sender's) must not run under it.
    op.future.add_done_callback(lambda _: batch.fail(exc))
    return partition.storage.submit(op, lazy=True)
