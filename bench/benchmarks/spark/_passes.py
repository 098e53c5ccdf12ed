"""The no-op Spark passes the Spark IO figures are measured against, shared by the asv suite
(io.py) and the ratio table (bench/ratios/spark.py)."""

from __future__ import annotations


def passes():
    """(noop, passthrough) mapInArrow functions, made inside a function so that they travel to
    the Python workers by value (asv imports its suites under names the workers cannot
    import): noop counts the rows and yields one row, passthrough yields its input."""

    def noop(batches):
        import pyarrow as pa

        n = 0
        for batch in batches:
            n += batch.num_rows
        yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})

    def passthrough(batches):
        yield from batches

    return noop, passthrough


def drain(frame) -> None:
    """Run a DataFrame to the end through Spark's no-op sink."""
    frame.write.format("noop").mode("overwrite").save()
