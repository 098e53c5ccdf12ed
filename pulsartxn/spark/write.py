"""Exactly-once writes from Spark: one transaction per task attempt, one decision per job.

Every task attempt writes in its own transaction under the job's label and reports its TxnID;
the driver's ``commit_group(label, winners)`` commits one attempt per Spark partition and
aborts every other attempt of the label, also those that never reported back, so no row is
written twice or lost. docs/spark.md has the rest.
"""

from __future__ import annotations

import uuid

import pyarrow as pa

from .._native import TxnID
from .._native.keywords import strict
from ..messaging.topic_name import TopicName
from ..remote.options import check_seconds
from ..txn.coordinators import check_timeout_ms
from ._service import (
    driver_client,
    executor_client,
    job_coordinator,
    service_url_for,
)

REPORT_SCHEMA = "partition_id int, attempt int, txn_msb long, txn_lsb long, rows long"
DEFAULT_TXN_TIMEOUT_MS = 600_000  # a task attempt must finish writing within this
_U64 = (1 << 64) - 1


def _signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def prepare(df, value_column: str = "value", key_column: str | None = None):
    """``df`` reduced to ``value`` (binary) and, if given, ``key`` (string); a bad column is a
    clear error here, in the driver, before anything is written."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in df.schema.fields}
    if value_column not in fields:
        raise ValueError(
            f"DataFrame has no value column {value_column!r} (columns: {sorted(fields)})"
        )
    vtype = fields[value_column]
    if not isinstance(vtype, (T.BinaryType, T.StringType)):
        raise TypeError(
            f"value column {value_column!r} has type {vtype.simpleString()}; it must be binary "
            f"or string (serialize it first, e.g. with to_json or to_avro)"
        )
    cols = [F.col(value_column).cast("binary").alias("value")]
    if key_column is not None:
        if key_column not in fields:
            raise ValueError(
                f"DataFrame has no key column {key_column!r} (columns: {sorted(fields)})"
            )
        ktype = fields[key_column]
        if isinstance(ktype, (T.ArrayType, T.MapType, T.StructType)):
            raise TypeError(f"key column {key_column!r} has type {ktype.simpleString()}")
        cols.append(F.col(key_column).cast("string").alias("key"))
    return df.select(*cols)


def write_attempt(
    client,
    topic,
    label,
    coordinator_id,
    timeout_ms,
    batches,
    value=0,
    key=None,
    inject=None,
    group_capability=None,
):
    """One task attempt's write: its own transaction in `label`, one ``send_batch`` per
    non-empty Arrow batch (columns `value` and `key`, by index or name); not committed.
    Returns (TxnID or None when there was nothing to write, rows written).

    With the network client the batches go out on one stream (``batch_stream``), so the
    broker stores one batch while this worker takes the next from Spark."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    txn = producer = stream = None
    rows = sent = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if txn is None:
                txn = client.new_transaction(
                    timeout_ms=timeout_ms,
                    coordinator_id=coordinator_id,
                    group=label,
                    group_capability=group_capability,
                )
                producer = client.create_producer(topic)
                if hasattr(producer, "batch_stream"):
                    stream = producer.batch_stream(txn)
            values = _as_binary(batch.column(value))
            keys = _as_string(batch.column(key)) if key is not None else None
            if stream is not None:
                stream.write(values, keys)
            else:
                rows += producer.send_batch(values, keys=keys, txn=txn)
            sent += 1
            if inject is not None:
                inject(ctx.partitionId(), ctx.attemptNumber(), sent)
        if stream is not None:
            rows = stream.close()  # every batch durable
    except BaseException:
        if stream is not None:
            stream.cancel()
        if txn is not None:
            try:
                txn.abort()  # early: the driver's decision would abort it anyway
            except Exception:  # noqa: BLE001 - best effort
                pass
        raise
    finally:
        if producer is not None:
            producer.close()
    return (txn.id if txn is not None else None), rows


def _as_binary(col):
    return col if col.type == pa.binary() else col.cast(pa.binary())


def _as_string(col):
    return col if col.type == pa.string() else col.cast(pa.string())


def _task(
    service_url, token, topic, label, coordinator_id, timeout_ms, inject=None, capability=None
):
    """The function each task attempt runs inside ``mapInArrow``. `inject(partition_id,
    attempt, batches_sent)` runs after each batch is sent (tests inject failures with it)."""

    def run(batches):
        from pyspark import TaskContext  # the optional extra: where a task runs, not at import

        ctx = TaskContext.get()
        client = executor_client(service_url, token)
        batches = iter(batches)
        first = next(batches, None)
        key = 1 if first is not None and first.num_columns > 1 else None
        chain = [first] if first is not None else []
        txn_id, rows = write_attempt(
            client,
            topic,
            label,
            coordinator_id,
            timeout_ms,
            _chained(chain, batches),
            0,
            key,
            inject,
            capability,
        )
        msb = lsb = 0
        if txn_id is not None:
            msb, lsb = _signed(txn_id.most_sig_bits), _signed(txn_id.least_sig_bits)
        yield pa.RecordBatch.from_pydict(
            {
                "partition_id": pa.array([ctx.partitionId()], pa.int32()),
                "attempt": pa.array([ctx.attemptNumber()], pa.int32()),
                "txn_msb": pa.array([msb], pa.int64()),
                "txn_lsb": pa.array([lsb], pa.int64()),
                "rows": pa.array([rows], pa.int64()),
            }
        )

    return run


def _chained(head, rest):
    yield from head
    yield from rest


class WriteJob:
    """One exactly-once write of a DataFrame to a topic: its label, its coordinator, the tasks'
    reports and the driver's decision."""

    def __init__(
        self,
        client,
        service_url: str,
        topic: str,
        token: str | None = None,
        txn_timeout_ms: int = DEFAULT_TXN_TIMEOUT_MS,
        label: str | None = None,
        inject=None,
    ) -> None:
        TopicName.parse(topic)  # InvalidTopicName now, not in every task
        self.client = client
        self.service_url = service_url
        self.token = token
        self.topic = topic
        self.txn_timeout_ms = txn_timeout_ms
        self.label = label or f"spark-write-{uuid.uuid4().hex}"
        self.inject = inject
        self.coordinator_id = job_coordinator(client, self.label)
        # The job's claim on its label: the tasks join with it, the decision needs it (a
        # network session of another job cannot decide or join this one).
        self.group_capability = client.group_capability(self.label)

    def tasks(self, prepared_df):
        """The DataFrame whose collection runs the write: one report row per task."""
        fn = _task(
            self.service_url,
            self.token,
            self.topic,
            self.label,
            self.coordinator_id,
            self.txn_timeout_ms,
            self.inject,
            self.group_capability,
        )
        return prepared_df.mapInArrow(fn, REPORT_SCHEMA)

    def run_tasks(self, prepared_df) -> list:
        return self.tasks(prepared_df).collect()

    @staticmethod
    def winners(reports) -> dict[int, tuple[TxnID | None, int]]:
        """One attempt per Spark partition (the first reported), as (TxnID or None, rows)."""
        out: dict[int, tuple[TxnID | None, int]] = {}
        for r in reports:
            if r.partition_id in out:
                continue
            txn = None
            if r.rows:
                txn = TxnID.from_halves(r.txn_msb & _U64, r.txn_lsb & _U64)
            out[r.partition_id] = (txn, r.rows)
        return out

    def commit(self, reports, extra=(), idempotency_key=None) -> dict:
        """The decision: commit one attempt per partition (plus `extra` transactions of the
        label) and abort every other transaction labelled with this job."""
        chosen = self.winners(reports)
        txns = [t for t, _ in chosen.values() if t is not None] + list(extra)
        out = self.client.commit_group(self.label, txns, idempotency_key=idempotency_key)
        return {
            "topic": self.topic,
            "label": self.label,
            "rows": sum(n for _, n in chosen.values()),
            "partitions": len(chosen),
            "committed": len(out["committed"]),
            "aborted": len(out["aborted"]),
            "duplicate": out.get("duplicate", False),
        }

    def abort(self) -> None:
        """Abort every attempt of the job (best effort: their timeouts do it otherwise)."""
        try:
            self.client.abort_group(self.label)
        except Exception:  # noqa: BLE001 - the original error matters more
            pass


@strict
def write_topic(
    df,
    topic: str,
    service_url: str | None = None,
    value_column: str = "value",
    key_column: str | None = None,
    *,
    token: str | None = None,
    txn_timeout_ms: int = DEFAULT_TXN_TIMEOUT_MS,
    connect_timeout_s: float = 10.0,
    _inject=None,
) -> dict:
    """Write every row of `df` to `topic` exactly once (API.md, "Spark"); returns counts:
    ``{"topic", "label", "rows", "partitions", "committed", "aborted", "duplicate"}``."""
    check_timeout_ms("txn_timeout_ms", txn_timeout_ms)
    check_seconds("connect_timeout_s", connect_timeout_s, zero=False)
    prepared = prepare(df, value_column, key_column)
    url = service_url_for(df.sparkSession, service_url)
    client = driver_client(url, token, connect_timeout_s)
    try:
        job = WriteJob(client, url, topic, token, txn_timeout_ms, inject=_inject)
        try:
            reports = job.run_tasks(prepared)
            return job.commit(reports)
        except BaseException:
            job.abort()
            raise
    finally:
        client.close()
