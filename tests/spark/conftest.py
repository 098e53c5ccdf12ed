"""One real local Spark session for the whole run (``local[2,4]``: tasks are retried up to 4
times, which the exactly-once tests rely on), UI off, 2 shuffle partitions, and the module's
embedded default broker on a temporary data directory."""

from __future__ import annotations

import itertools
import os

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pandas")

_names = itertools.count()


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession

    import pulsartxn

    package_root = os.path.dirname(os.path.dirname(pulsartxn.__file__))
    python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("pulsartxn-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYTHONPATH", python_path)
        .config("spark.pulsartxn.dataDir", str(tmp_path_factory.mktemp("pulsartxn-spark")))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("FATAL")
    # pulsartxn.spark points the executors at this interpreter when PYSPARK_PYTHON is unset.
    os.environ.pop("PYSPARK_PYTHON", None)
    yield session
    from pulsartxn import spark as ptx

    ptx.stop_embedded()
    session.stop()


@pytest.fixture(scope="session")
def service_url(spark):
    """The embedded default broker's URL (what ``service_url=None`` uses)."""
    from pulsartxn import spark as ptx

    return ptx.start_embedded(spark)


@pytest.fixture(scope="session")
def client(service_url):
    import pulsartxn

    c = pulsartxn.Client(service_url)
    yield c
    c.close()


@pytest.fixture
def topic(request):
    """A fresh topic name per test."""
    return f"{request.node.name.split('[')[0]}-{next(_names)}"


@pytest.fixture
def read_values(spark):
    """The committed values of a topic, read back through ``read_topic``."""
    from pulsartxn import spark as ptx

    def read(topic) -> list[bytes]:
        return [bytes(r.value) for r in ptx.read_topic(spark, topic).select("value").collect()]

    return read
