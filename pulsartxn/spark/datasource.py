"""``spark.read.format("pulsartxn")`` and ``df.write.format("pulsartxn")`` (Spark 4's Python
data sources), batch and streaming; options and protocol in docs/spark.md.

Data source code runs in Python workers that Spark starts, not in the driver's process, so the
embedded default broker cannot be started there: ``register(spark)`` does it and makes its URL
the default ``service_url`` of the registered source.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)

from .._native.keywords import nearest
from ..errors import NotAuthorized, excerpt
from ..txn.coordinators import check_timeout_ms
from ._service import (
    driver_client,
    executor_client,
    job_coordinator,
    service_url_for,
)
from .read import DEFAULT_ROWS_PER_SPLIT, READ_DDL, plan_splits, scan_ahead
from .write import DEFAULT_TXN_TIMEOUT_MS, write_attempt


def _client(options):

    return driver_client(options["service_url"], options.get("token"), 10.0)


# The source's options (docs/spark.md), and those Spark itself may hand every source. Spark
# options are case-insensitive: they are compared in lower case.
OPTIONS = (
    "topic",
    "service_url",
    "token",
    "rows_per_split",
    "min_splits",
    "txn_timeout_ms",
    "query",
    "starting_position",
)
SPARK_OPTIONS = ("path", "checkpointlocation")


def check_options(options) -> None:
    """ValueError naming the nearest valid option for one the source does not know (a typo
    such as ``service.url`` must not fall back to the embedded default broker)."""
    for key in dict(options):
        name = str(key).lower()
        if name in OPTIONS or name in SPARK_OPTIONS:
            continue
        hint = nearest(name, OPTIONS)
        also = f"; did you mean {hint!r}?" if hint else f"; valid options: {', '.join(OPTIONS)}"
        raise ValueError(f"unknown option {key!r} of the pulsartxn data source{also}")
    given = {str(k).lower(): v for k, v in dict(options).items()}
    position = given.get("starting_position")
    if position is not None and str(position).lower() not in ("earliest", "latest"):
        raise ValueError(f"starting_position must be 'earliest' or 'latest', not {position!r}")
    # Numbers: checked here, on the driver (a bad txn_timeout_ms failed every task attempt).
    for name in ("rows_per_split", "min_splits", "txn_timeout_ms"):
        raw = given.get(name)
        if raw is None or raw == "":
            continue
        try:
            value = int(str(raw))
        except ValueError:
            raise ValueError(f"{name} must be an int, not {excerpt(raw)}") from None
        if name == "txn_timeout_ms":
            check_timeout_ms("txn_timeout_ms", value)
        elif value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")


class _Options(dict):
    """The source's options with the defaults applied and ``topic`` required."""

    def __init__(self, options, default_url):
        check_options(options)
        super().__init__({k.lower(): v for k, v in dict(options).items()})
        if not self.get("topic"):
            raise ValueError("the pulsartxn data source needs option 'topic'")
        if not self.get("service_url"):
            if not default_url:
                raise ValueError(
                    "the pulsartxn data source needs option 'service_url' "
                    "(or pulsartxn.spark.register(spark) for the embedded default)"
                )
            self["service_url"] = default_url


class PulsarTxnDataSource(DataSource):
    """The ``pulsartxn`` format."""

    default_service_url: str | None = None
    # Reads are cut into at least this many pieces unless the ``min_splits`` option says
    # otherwise; ``register`` sets it to the session's defaultParallelism (planning runs in a
    # Python worker, which cannot ask the SparkContext).
    default_min_splits: int = 1
    # Tests: called as inject(partition_id, attempt, batches_sent) after each batch a write
    # task attempt sends (as ``write_topic``'s ``_inject``).
    _inject = None

    @classmethod
    def name(cls) -> str:
        return "pulsartxn"

    def _opts(self) -> _Options:
        return _Options(self.options, self.default_service_url)

    def schema(self):
        return READ_DDL

    def reader(self, schema):
        opts = self._opts()
        opts.setdefault("min_splits", str(self.default_min_splits))
        return _Reader(opts)

    def writer(self, schema, overwrite: bool):
        return _Writer(self._opts(), schema, overwrite, type(self)._inject)

    def streamReader(self, schema):
        return _StreamReader(self._opts())

    def streamWriter(self, schema, overwrite: bool):
        return _StreamWriter(self._opts(), schema, overwrite)


# -- reads ---------------------------------------------------------------------------------


@dataclass
class _Split(InputPartition):
    partition: str
    start: int
    end: int


def _read_split(options, split):
    client = executor_client(options["service_url"], options.get("token"))
    yield from scan_ahead(client, split.partition, split.start, split.end)


class _Reader(DataSourceReader):
    def __init__(self, options) -> None:
        self.options = options

    def partitions(self):
        # Planned once per query: the positions of this moment (max read positions).
        client = _client(self.options)
        try:
            rows = int(self.options.get("rows_per_split", DEFAULT_ROWS_PER_SPLIT))
            min_splits = int(self.options.get("min_splits") or 1)
            splits = plan_splits(client, self.options["topic"], rows, min_splits)
        finally:
            client.close()
        return [_Split(p, lo, hi) for p, lo, hi in splits] or [_Split("", 0, 0)]

    def read(self, partition):
        if partition.partition:
            yield from _read_split(self.options, partition)


class _StreamReader(DataSourceStreamReader):
    """Offsets: ``{partition topic: entry id}``; a micro-batch reads each partition from the
    previous offset to its max read position."""

    def __init__(self, options) -> None:
        self.options = options

    def _positions(self, field: str) -> dict:
        client = _client(self.options)
        try:
            out = {}
            for part in client.topic_partitions(self.options["topic"]):
                stats = client.admin.transaction_buffer_stats(part)
                if field == "start":
                    entries = client.admin.topic_stats(part)["entries"]
                    out[part] = max(0, int(stats["last_entry_id"]) + 1 - int(entries))
                else:
                    out[part] = int(stats["max_read_position"])
            return out
        finally:
            client.close()

    def initialOffset(self) -> dict:
        if self.options.get("starting_position", "earliest").lower() == "latest":
            return self._positions("end")
        return self._positions("start")

    def latestOffset(self) -> dict:
        return self._positions("end")

    def partitions(self, start: dict, end: dict):
        return [_Split(p, int(start.get(p, 0)), int(hi)) for p, hi in end.items()]

    def read(self, partition):
        if partition.end > partition.start:
            yield from _read_split(self.options, partition)

    def commit(self, end: dict) -> None:
        pass  # the offsets live in Spark's checkpoint; the broker keeps every message


# -- writes --------------------------------------------------------------------------------


@dataclass
class _Attempt(WriterCommitMessage):
    partition_id: int
    txn: str | None
    rows: int


def _check_schema(schema) -> tuple[str, str | None]:
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise ValueError(f"DataFrame has no value column 'value' (columns: {sorted(fields)})")
    if not isinstance(fields["value"], (T.BinaryType, T.StringType)):
        raise TypeError(
            f"value column 'value' has type {fields['value'].simpleString()}; it must be "
            f"binary or string"
        )
    return "value", "key" if "key" in fields else None


class _Writer(DataSourceArrowWriter):
    def __init__(self, options, schema, overwrite: bool, inject=None) -> None:
        if overwrite:
            raise ValueError("a pulsartxn topic is append-only: use mode('append')")
        self.options = options
        self.inject = inject
        self.value, self.key = _check_schema(schema)
        self.label = f"spark-write-{uuid.uuid4().hex}"
        self.timeout_ms = int(options.get("txn_timeout_ms", DEFAULT_TXN_TIMEOUT_MS))
        client = _client(options)
        try:
            # Stable across processes: Spark may make the writer again where it commits.
            self.coordinator_id = job_coordinator(client, self.options["topic"])
            self.group_capability = _claim(client, self.label)
        finally:
            client.close()

    def write(self, iterator):
        from pyspark import TaskContext

        client = executor_client(self.options["service_url"], self.options.get("token"))
        txn, rows = write_attempt(
            client,
            self.options["topic"],
            self.label,
            self.coordinator_id,
            self.timeout_ms,
            iterator,
            self.value,
            self.key,
            self.inject,
            self.group_capability,
        )
        return _Attempt(TaskContext.get().partitionId(), str(txn) if txn else None, rows)

    def _decide(self, messages, idempotency_key=None) -> dict:
        winners: dict[int, str | None] = {}
        for m in messages:
            if m is not None:
                winners.setdefault(m.partition_id, m.txn)
        client = _client(self.options)
        try:
            return client.commit_group(
                self.label,
                [t for t in winners.values() if t],
                idempotency_key=idempotency_key,
                group_capability=self.group_capability,
            )
        finally:
            client.close()

    def commit(self, messages) -> None:
        self._decide(messages)

    def abort(self, messages) -> None:
        client = _client(self.options)
        try:
            client.abort_group(self.label, group_capability=self.group_capability)
        finally:
            client.close()


class _StreamWriter(_Writer, DataSourceStreamWriter):
    """One label per query, the same in every process that makes this writer (Spark makes it
    once for the executors and again where it commits). Micro-batches run one after another,
    so when batch b is decided the label holds only b's attempts (and stragglers of earlier
    ones, aborted with the losers); the decision is made once per (query, batch_id)."""

    def __init__(self, options, schema, overwrite: bool) -> None:
        super().__init__(options, schema, False)
        self.query = options.get("query") or f"spark-stream:{options['topic']}"
        self.label = f"spark-stream-{self.query}"
        client = _client(options)
        try:
            self.group_capability = _claim(client, self.label)
        finally:
            client.close()

    def commit(self, messages, batchId) -> None:
        if self._decide(messages, idempotency_key=(self.query, int(batchId)))["duplicate"]:
            # A replay of a micro-batch already decided: its new attempts go.
            _Writer.abort(self, messages)

    def abort(self, messages, batchId) -> None:
        _Writer.abort(self, messages)


def _claim(client, label: str):
    """The writer's claim on its label (None when another session holds it: then a server
    with tokens refuses its decision, and says so)."""
    try:
        return client.group_capability(label)
    except NotAuthorized:
        return None


def register(spark, service_url: str | None = None) -> None:
    """Register the ``pulsartxn`` format on `spark`; without `service_url`, the embedded default
    broker (started now) is the URL used when a read or write gives none."""
    url = service_url_for(spark, service_url)
    # A class made here (not importable by name) travels by value to the Python workers,
    # defaults included.
    defaults = {
        "default_service_url": url,
        "default_min_splits": spark.sparkContext.defaultParallelism,
    }
    source = type("PulsarTxnSessionSource", (PulsarTxnDataSource,), defaults)
    spark.dataSource.register(source)
