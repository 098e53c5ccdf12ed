"""Exactly-once consume-transform-produce on Spark.

The driver takes what a subscription has available (up to ``max_messages``), the user's
transform turns it into an output DataFrame, the executors write the output in labelled
transactions (as ``write_topic`` does), and the driver acknowledges the inputs in one more
transaction of the same label. One ``commit_group`` then commits the output and the
acknowledgements together: a rerun sees only new input, and a failure anywhere before the
decision leaves no output and the inputs available again.
"""

from __future__ import annotations

import time

import pyarrow as pa

from .._native.keywords import strict
from ..messaging.consumer import ConsumerType, InitialPosition, check_count
from ..remote.options import check_seconds
from ..txn.coordinators import check_timeout_ms
from ._service import (
    driver_client,
    service_url_for,
)
from .write import DEFAULT_TXN_TIMEOUT_MS, WriteJob, prepare

INPUT_DDL = (
    "topic string, message_id binary, key string, value binary, "
    "properties map<string,string>, publish_time timestamp"
)


# How long the broker may say a message is available without handing any out before the
# round goes on with what it has (it never should: this only bounds the wait).
STALL_S = 10.0


def _drain(consumer, max_messages: int | None, receive_timeout_ms: int):
    """What the subscription has available now: (messages, last MessageId per partition).

    An empty receive ends it only once the consumer also has nothing available: one just
    made (over a cluster, on a busy machine) can take longer than receive_timeout_ms to be
    handed its first messages, and a round then took none of a whole backlog. Empty
    receives while it says there is more end it after STALL_S."""
    msgs = []
    stalled_since = None
    while max_messages is None or len(msgs) < max_messages:
        want = 10_000 if max_messages is None else min(10_000, max_messages - len(msgs))
        got = consumer.batch_receive(want, receive_timeout_ms)
        if got:
            msgs.extend(got)
            stalled_since = None
            continue
        if not consumer.has_message_available():
            break
        now = time.monotonic()
        stalled_since = now if stalled_since is None else stalled_since
        if now - stalled_since >= STALL_S:
            break
    last: dict = {}
    for m in msgs:
        mid = m.message_id()
        key = (m.topic_name(), mid.partition())
        if key not in last or last[key] < mid:
            last[key] = mid
    return msgs, list(last.values())


def _input_table(msgs):
    return pa.table(
        {
            "topic": pa.array([m.topic_name() for m in msgs], pa.string()),
            "message_id": pa.array([m.message_id().serialize() for m in msgs], pa.binary()),
            "key": pa.array([m.partition_key() for m in msgs], pa.string()),
            "value": pa.array([m.data() for m in msgs], pa.binary()),
            "properties": pa.array(
                [list((m.properties() or {}).items()) for m in msgs],
                pa.map_(pa.string(), pa.string()),
            ),
            "publish_time": pa.array(
                [m.publish_timestamp() for m in msgs], pa.timestamp("ms")
            ).cast(pa.timestamp("us", tz="UTC")),
        }
    )


@strict
def process_exactly_once(
    spark,
    source_topic: str,
    subscription: str,
    sink_topic: str,
    transform,
    service_url: str | None = None,
    max_messages: int | None = None,
    *,
    token: str | None = None,
    txn_timeout_ms: int = DEFAULT_TXN_TIMEOUT_MS,
    connect_timeout_s: float = 10.0,
    receive_timeout_ms: int = 200,
    input_partitions: int | None = None,
) -> dict:
    """Process the subscription's available input once (API.md, "Spark"). `transform` takes a
    DataFrame of ``INPUT_DDL`` and returns one with a ``value`` column (binary or string) and
    optionally ``key``. Returns ``{"input", "output", "committed", "aborted", "label"}``."""
    # Each checked before anything is done: a bad one used to fail after the subscription
    # was made and its messages drained, or in Spark's own words.
    check_count("max_messages", max_messages, 1, optional=True)
    check_count("receive_timeout_ms", receive_timeout_ms, 0)
    check_count("input_partitions", input_partitions, 1, optional=True)
    check_timeout_ms("txn_timeout_ms", txn_timeout_ms)
    check_seconds("connect_timeout_s", connect_timeout_s, zero=False)
    url = service_url_for(spark, service_url)
    client = driver_client(url, token, connect_timeout_s)
    try:
        consumer = client.subscribe(
            source_topic,
            subscription,
            subscription_type=ConsumerType.Exclusive,
            initial_position=InitialPosition.Earliest,  # every message of the source
        )
        try:
            msgs, last_ids = _drain(consumer, max_messages, receive_timeout_ms)
            if not msgs:
                return {"input": 0, "output": 0, "committed": 0, "aborted": 0, "label": None}
            df_in = spark.createDataFrame(_input_table(msgs))
            if input_partitions:
                df_in = df_in.repartition(input_partitions)
            out = transform(df_in)
            prepared = prepare(out, "value", "key" if "key" in out.columns else None)
            job = WriteJob(client, url, sink_topic, token, txn_timeout_ms)
            try:
                acks = client.new_transaction(
                    timeout_ms=txn_timeout_ms, coordinator_id=job.coordinator_id, group=job.label
                )
                # Everything up to the last message of each partition was received in order
                # (Exclusive subscription): one cumulative ack per partition covers it.
                for mid in last_ids:
                    consumer.acknowledge_cumulative(mid, txn=acks)
                reports = job.run_tasks(prepared)
                result = job.commit(reports, extra=[acks.id])
            except BaseException:
                job.abort()
                raise
        except BaseException:
            consumer.redeliver_unacknowledged_messages()  # inputs available again
            raise
        finally:
            consumer.close()
    finally:
        client.close()
    return {
        "input": len(msgs),
        "output": result["rows"],
        "committed": result["committed"],
        "aborted": result["aborted"],
        "label": result["label"],
    }
