"""asv: Spark bulk IO (``pulsartxn/spark/write.py``, ``read.py``) next to no-op ``mapInArrow``
passes over the same rows, on local[2] Spark with the embedded default broker (sync=True).

The ratios asked for (write_topic and read_topic at least 0.5x of their no-op pass) are
``time_noop_pass / time_write_topic`` and ``time_passthrough / time_read_topic``;
``python -m bench.ratios spark`` prints them from paired rounds.
"""

import atexit
import itertools
import os
import shutil
import sys
import tempfile

from ._passes import drain, passes

ROWS = 200_000  # x 100 B


_noop, _passthrough = passes()


class SparkIO:
    """One local Spark session per benchmark process (made in the first setup and reused by
    every later one there); the input DataFrame is cached, and a topic holding the same rows
    is written once per process for the reads."""

    timeout = 600
    number = 1
    repeat = (3, 7, 30.0)
    warmup_time = 0

    def setup(self):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        import pulsartxn

        root = os.path.dirname(os.path.dirname(os.path.abspath(pulsartxn.__file__)))
        python_path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        if not hasattr(SparkIO, "_state"):
            # In the working directory, which asv removes after the run (its benchmark
            # processes end with os._exit: no atexit there).
            tmp = tempfile.mkdtemp(prefix="pulsartxn-asv-spark-", dir=os.getcwd())
            spark = (
                SparkSession.builder.master("local[2]")
                .appName("pulsartxn-asv")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.executorEnv.PYTHONPATH", python_path)
                .config("spark.pulsartxn.dataDir", os.path.join(tmp, "broker"))
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            from pulsartxn import spark as ptx

            df = (
                spark.range(ROWS, numPartitions=2)
                .selectExpr("unhex(sha2(cast(id as string), 512)) as v")
                .selectExpr("concat(v, substr(v, 1, 36)) as value")  # 100 B
                .cache()
            )
            df.count()
            ptx.write_topic(df, "asv-read")
            df.mapInArrow(_noop, "n long").collect()  # Python workers up
            SparkIO._state = (tmp, spark, ptx, df)
        self.tmp, self.spark, self.ptx, self.df = SparkIO._state
        self.topics = itertools.count()

    def time_write_topic(self):
        self.ptx.write_topic(self.df, f"asv-write-{os.getpid()}-{next(self.topics)}")

    def time_noop_pass(self):
        self.df.mapInArrow(_noop, "n long").collect()

    def time_read_topic(self):
        drain(self.ptx.read_topic(self.spark, "asv-read"))

    def time_passthrough(self):
        drain(self.df.mapInArrow(_passthrough, "value binary"))

    def time_write_parquet(self):
        self.df.write.mode("overwrite").parquet(os.path.join(self.tmp, "parquet"))


def _stop():
    state = getattr(SparkIO, "_state", None)
    if state is not None:
        tmp, spark, ptx, _ = state
        ptx.stop_embedded()
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)


atexit.register(_stop)  # the session outlives each setup: it ends with the process
