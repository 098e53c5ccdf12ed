"""Spark IO for pulsartxn (API.md, "Spark"; needs the ``spark`` extra; docs/spark.md).

``write_topic`` writes a DataFrame exactly once, ``read_topic`` reads the committed messages of
a topic, ``process_exactly_once`` runs one consume-transform-produce round atomically. Executors
work on whole Arrow record batches (``mapInArrow``) and reach the broker through the network
service; ``service_url=None`` is the embedded default broker (see ``start_embedded``).
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("pulsartxn.spark needs PySpark: pip install 'pulsartxn[spark]'") from exc

from ._service import (
    DATA_DIR_CONF,
    DEFAULT_DATA_DIR,
    SYNC_CONF,
    embedded_data_dir,
    ensure_python,
    start_embedded,
    stop_embedded,
)
from .datasource import PulsarTxnDataSource, register
from .process import process_exactly_once
from .read import READ_DDL, read_topic
from .write import write_topic

ensure_python()

__all__ = [
    "DATA_DIR_CONF",
    "DEFAULT_DATA_DIR",
    "PulsarTxnDataSource",
    "READ_DDL",
    "SYNC_CONF",
    "embedded_data_dir",
    "ensure_python",
    "process_exactly_once",
    "read_topic",
    "register",
    "start_embedded",
    "stop_embedded",
    "write_topic",
]
