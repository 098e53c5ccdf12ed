"""Where Spark jobs find the broker: a ``service_url``, or the embedded default.

``service_url=None`` means one broker per driver process, served over the network service on
loopback (executors are separate processes and reach it like any remote client), on a data
directory that is kept for the next session and for ``pulsartxn serve``. Its configuration is
in docs/spark.md.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import zlib

from ..broker import Broker
from ..errors import PulsarTxnError
from ..remote import connect
from ..server.service import BrokerServer

DEFAULT_DATA_DIR = "pulsartxn-data"
DATA_DIR_CONF = "spark.pulsartxn.dataDir"
SYNC_CONF = "spark.pulsartxn.sync"

_lock = threading.Lock()
_embedded: dict[str, _Embedded] = {}  # realpath of the data directory -> its server
_executor_clients: dict[tuple, object] = {}  # (url, token) -> its client, per worker process


class _Embedded:
    """A broker and its network service, started in the driver, closed at exit."""

    def __init__(self, data_dir: str, sync: bool = True) -> None:
        self.data_dir = data_dir
        self.broker = Broker(data_dir, sync=sync)
        try:
            self.server = BrokerServer(self.broker, "127.0.0.1", 0)
        except BaseException:
            self.broker.close()
            raise
        self.url = f"pulsartxn://127.0.0.1:{self.server.port}"

    def close(self) -> None:
        self.server.shutdown_sessions()
        self.server.shutdown()
        self.broker.close()


def embedded_data_dir(spark=None) -> str:
    """The embedded default's data directory (see the module docstring)."""
    configured = None
    if spark is not None:
        configured = spark.conf.get(DATA_DIR_CONF, None)
    return os.path.abspath(configured or os.environ.get("PULSARTXN_DATA_DIR") or DEFAULT_DATA_DIR)


def start_embedded(spark=None, data_dir: str | None = None, sync: bool | None = None) -> str:
    """Start (once per driver process and data directory) the embedded broker and its server
    on 127.0.0.1; return its ``pulsartxn://`` URL. `sync` (default: ``spark.pulsartxn.sync``,
    else True) applies when this call starts it."""
    path = os.path.realpath(data_dir or embedded_data_dir(spark))
    if sync is None:
        conf = spark.conf.get(SYNC_CONF, None) if spark is not None else None
        sync = str(conf).strip().lower() not in ("false", "0", "no") if conf else True
    with _lock:
        found = _embedded.get(path)
        if found is None:
            found = _embedded[path] = _Embedded(path, sync)
            if len(_embedded) == 1:
                atexit.register(stop_embedded)
        return found.url


def stop_embedded() -> None:
    """Close every embedded broker this process started (also run at exit)."""
    with _lock:
        servers = list(_embedded.values())
        _embedded.clear()
    for s in servers:
        s.close()


def ensure_python(spark=None) -> None:
    """Executors start their Python workers with ``PYSPARK_PYTHON`` (read when a SparkContext
    is made, and kept by every Python function created on it); without it they run whatever
    ``python3`` is on the PATH, which may not have pulsartxn. When it is missing, use the
    interpreter running the driver (done on import of ``pulsartxn.spark`` and by each call)."""
    if os.environ.get("PYSPARK_PYTHON"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark import SparkContext

    sc = spark.sparkContext if spark is not None else SparkContext._active_spark_context
    if sc is not None and getattr(sc, "pythonExec", None) != sys.executable:
        sc.pythonExec = sys.executable


def service_url_for(spark, service_url: str | None) -> str:
    ensure_python(spark)
    if service_url is None:
        return start_embedded(spark)
    return service_url


def driver_client(service_url: str, token: str | None, connect_timeout_s: float):
    """A client for the driver's side of a job; an unreachable broker fails within
    ``connect_timeout_s`` with an error that names the URL."""
    try:
        return connect(service_url, token, reconnect_timeout_s=connect_timeout_s)
    except PulsarTxnError as exc:
        raise ConnectionError(f"pulsartxn broker at {service_url} is unreachable: {exc}") from None


def executor_client(service_url: str, token: str | None):
    """One client per Python worker process and broker (workers are reused across tasks)."""
    key = (service_url, token)
    with _lock:
        client = _executor_clients.get(key)
        if client is None or client._closed:
            client = _executor_clients[key] = connect(service_url, token)
        return client


def job_coordinator(client, key: str) -> int | None:
    """The coordinator a Spark job's transactions (one group) use, stable across processes:
    on a cluster none is named (the cluster client puts a group's transactions on the
    coordinator its label hashes to, where the group's decision goes too); else one of the
    broker's ready coordinators, by `key`."""
    from ..remote.cluster import ClusterClient

    if isinstance(client, ClusterClient):
        return None
    ready = [c["coordinator_id"] for c in client.admin.coordinators() if c["state"] == "READY"]
    if not ready:
        raise RuntimeError("no transaction coordinator is ready")
    return ready[zlib.crc32(key.encode()) % len(ready)]
