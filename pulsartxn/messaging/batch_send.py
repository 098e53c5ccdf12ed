"""A producer's bulk sends: send_batch's routing of rows over partitions and their writes."""

from __future__ import annotations

import time
import zlib
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from .._native import PartitionProducer, value_sizes
from .._native.types import MAX_SEQUENCE_ID, sequences_used_up
from ..errors import MessageTooBig, excerpt


def _route(key: str | bytes, n: int) -> int:
    """Stable partition of a key: the same on every process and run (not Python's hash)."""
    raw = key.encode() if isinstance(key, str) else bytes(key)
    return zlib.crc32(raw) % n


class BatchSends:
    """The write path of Producer.send_batch and of messages with metadata (a mixin of
    Producer; it uses the producer's partition producers, batching limits and client)."""

    def _submit_batch(
        self, values, keys, txn, quiet: bool, ride: bool = False, first_sequence=None
    ):
        """send_batch without the wait: (count, futures of its writes, the Transaction,
        messages per partition). Quiet writes are committed by whoever waits for them; the
        server's streamed send_batch submits them for the writer thread and waits at the end
        of the stream. `ride`: a transaction's writes wait for its commit to take them.
        `first_sequence`: the messages' sequence ids are first_sequence onwards (a remote
        producer's, reserved there), else they follow each partition's last."""
        self._check_open()
        n, sizes = _sizes(values)
        if first_sequence is not None and (
            type(first_sequence) is not int or not 0 <= first_sequence <= MAX_SEQUENCE_ID - n
        ):
            raise ValueError(f"first sequence id out of range: {excerpt(first_sequence)}")
        if keys is not None and len(keys) != n:
            raise ValueError(f"keys has {len(keys)} items for {n} values")
        if n and sizes.max() > self.max_message_size:
            i = int(sizes.argmax())
            raise MessageTooBig(
                f"message {i} of {int(sizes[i])} bytes exceeds max_message_size "
                f"{self.max_message_size}"
            )
        if n == 0:
            return 0, [], self.client._txn_for(txn), {}
        key_list = None
        if keys is not None:
            key_list = keys.to_pylist() if hasattr(keys, "to_pylist") else list(keys)
            for k in key_list:
                if k is not None and not isinstance(k, (str, bytes)):
                    raise TypeError(f"keys must be str, bytes or None, not {type(k).__name__}")
        txn = self.client._txn_for(txn)
        if txn is not None:
            self._txn_flush(txn)
        self.flush()  # keep order with messages already waiting in containers
        # Route: by key, or round robin over chunks of one batch each.
        if len(self._parts) == 1:
            plan = {0: np.arange(n)}
        elif key_list is not None:
            routes = np.fromiter(
                (
                    _route(k, len(self._parts))
                    if k is not None
                    else next(self._round_robin) % len(self._parts)
                    for k in key_list
                ),
                dtype=np.int64,
                count=n,
            )
            plan = {i: np.flatnonzero(routes == i) for i in range(len(self._parts))}
        else:
            chunk = self.batching_max_messages
            starts = np.arange(0, n, chunk)
            owner = (next(self._round_robin) + np.arange(len(starts))) % len(self._parts)
            plan = {}
            for i in range(len(self._parts)):
                picked = [np.arange(s, min(s + chunk, n)) for s, o in zip(starts, owner) if o == i]
                if picked:
                    plan[i] = np.concatenate(picked)
        plan = {i: rows for i, rows in plan.items() if len(rows)}
        for i, rows in plan.items():
            if self._parts[i].last_sequence + len(rows) > MAX_SEQUENCE_ID:
                raise sequences_used_up(self.name, self._parts[i].partition.topic)
        per_partition = {self._parts[i].partition.topic: len(rows) for i, rows in plan.items()}
        futures = []
        seq = {} if first_sequence is None else {"sequence_id": first_sequence}
        try:
            for i, rows in plan.items():
                futures.append(
                    self._send_rows(
                        self._parts[i], values, key_list, rows, n, sizes, txn, quiet, ride, **seq
                    )
                )
                if seq:  # each partition's rows take the next ids of the range
                    seq["sequence_id"] += len(rows)
        except BaseException:
            self._wait_batches(futures, txn)  # a write's error first, as it is the cause
            raise
        return n, futures, txn, per_partition

    def _wait_batches(self, futures, txn) -> None:
        """Until the writes are durable; raise the first failure (a transaction's send
        failure leaves it able only to abort)."""
        errors = []
        for fut in futures:
            try:
                self._parts[0].partition.storage.wait(fut)
            except Exception as exc:  # noqa: BLE001 - the first one is raised below
                errors.append(exc)
        if errors:
            if txn is not None:
                txn._failed(errors[0])
            raise errors[0]

    def _send_rows(
        self,
        part: PartitionProducer,
        values,
        key_list,
        rows: np.ndarray,
        n: int,
        sizes: np.ndarray,
        txn=None,
        quiet: bool = True,
        ride: bool = False,
        **one,
    ) -> Future:
        """`one`: properties, metadata and sequence_id of a single message (_send_meta)."""
        if len(rows) == n:
            sub_values = values
            sub_keys = key_list
        else:
            if hasattr(values, "take"):
                sub_values = values.take(rows)
            else:
                sub_values = [values[int(i)] for i in rows]
            sub_keys = [key_list[int(i)] for i in rows] if key_list is not None else None
        buffer = part.partition.buffer
        staged = None
        if txn is not None:
            # The partition's registration with the coordinator rides in this write.
            staged = txn._stage_partition(part.partition.topic)
            try:
                buffer.begin_append(txn.id)
            except BaseException:
                if staged is not None:
                    staged[1](False)
                raise
        try:
            fut = self._submit_rows(
                part, sub_values, sub_keys, rows, sizes, txn, staged, quiet, ride, **one
            )
        except BaseException:
            if txn is not None:
                buffer.append_failed(txn.id)
                if staged is not None:
                    staged[1](False)
            raise
        if txn is not None:
            topic = part.partition.topic
            txn._send_counts[topic] = txn._send_counts.get(topic, 0) + len(rows)
            fut.add_done_callback(lambda f: f.exception() and buffer.append_failed(txn.id))
            if ride:  # nobody waits for it: a failure leaves the transaction able only to abort
                fut.add_done_callback(lambda f: f.exception() and txn._failed(f.exception()))
            if staged is not None:
                landed = staged[1]
                fut.add_done_callback(lambda f: landed(f.exception() is None))
        return fut

    def _submit_rows(
        self,
        part,
        sub_values,
        sub_keys,
        rows,
        sizes,
        txn,
        staged,
        quiet,
        ride=False,
        properties=None,
        metadata=None,
        sequence_id=None,
    ) -> Future:
        with part.lock:
            part._flush_locked()
            first_seq = part.last_sequence + 1 if sequence_id is None else sequence_id
            if first_seq + len(rows) - 1 > MAX_SEQUENCE_ID:  # sent by another thread meanwhile
                raise sequences_used_up(self.name, part.partition.topic)
            part.last_sequence = max(part.last_sequence, first_seq + len(rows) - 1)
            nbytes = int(sizes[rows].sum())
            op = part.partition.append_messages_op(
                sub_values,
                sub_keys,
                nbytes,
                len(rows),
                batch_size=self.batching_max_messages,
                producer=self.name,
                producer_id=self.producer_id,
                first_sequence=first_seq,
                publish_time=int(time.time() * 1000),
                txn_id=txn.id if txn is not None else None,
                properties=properties,
                metadata=metadata,
            )
            if staged is not None:
                op.prepend(staged[0])
            if txn is not None:
                op.durable = False  # durable by the transaction's commit
            if ride:
                op.held = True  # an in-process transaction's: it dies with the process anyway
                fut = part.partition.storage.submit(op, lazy=True)
                txn._riding.append((op, staged is not None, part.partition.topic))
                return fut
            # Quiet: send_batch commits it itself when it waits (no writer wake-up).
            return part.partition.storage.submit(op, quiet=quiet)


def _sizes(values) -> tuple[int, np.ndarray]:
    """Count and per-message sizes of a list of bytes or a pyarrow binary/string array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array) and values.null_count:
        raise ValueError("values must not contain nulls")
    sizes = value_sizes(values)
    return len(sizes), sizes
