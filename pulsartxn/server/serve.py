"""``pulsartxn serve``: a broker on a data directory, served until SIGINT/SIGTERM."""

from __future__ import annotations

import contextlib
import faulthandler
import ipaddress
import logging
import math
import os
import signal
import socket
import sys
import threading

from .. import errors
from ..broker import Broker
from . import protocol
from .service import MAX_WAIT_MS, BrokerServer
from .sessions import MAX_SESSIONS, SessionLimits

log = logging.getLogger(__name__)

STOP_DUMP_S = 10.0  # a stop taking longer dumps every thread's stack (--stop-dump-s)
# What calls under way get to finish once a stop begins (--shutdown-timeout-s); Pulsar's
# brokerShutdownTimeoutMs bounds its whole stop (60 s in broker.conf): a few seconds fit
# within what supervisors allow before they kill (Kubernetes: 30 s).
SHUTDOWN_TIMEOUT_S = 5.0


def serve(
    data_dir: str,
    host: str,
    port: int,
    token: str | None,
    max_request_bytes: int = protocol.DEFAULT_MAX_REQUEST_BYTES,
    session_timeout_s: float = 10.0,
    *,
    admin_token: str | None = None,
    tls: tuple[bytes, bytes] | None = None,
    insecure: bool = False,
    max_wait_ms: int = MAX_WAIT_MS,
    limits: SessionLimits | None = None,
    max_sessions: int = MAX_SESSIONS,
    cluster: str | None = None,
    advertised_address: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    stop_dump_s: float = STOP_DUMP_S,
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
    **broker_options,
) -> None:
    """Run a broker and serve it until SIGINT/SIGTERM; then close it cleanly (in-flight
    groups committed, sessions closed, LMDB closed). Off loopback, a server without a token
    is refused unless `insecure` (anyone who reaches the port could do anything).

    `cluster`: zk://HOST:PORT[,...]/ROOT, a broker of that cluster, registered as live at
    `advertised_address` (default: host:port) once it serves.

    `metrics_port`: serve Prometheus metrics at http://`metrics_host`:port/metrics (host
    default: `host`; 0 picks a free port; None: no metrics).

    `stop_dump_s`: a stop still under way after this many seconds writes every thread's
    stack to stderr, with a log line saying so (0: never).

    `shutdown_timeout_s`: once a stop begins no call is taken, and those under way get this
    long to finish; then every client connection is closed (clients see the broker
    unavailable and reconnect), whatever the calls still open (0: at once)."""
    loopback = host == "localhost"
    try:
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not loopback and token is None and admin_token is None and not insecure:
        raise errors.InvalidConfiguration(
            f"serving on {host} without a token lets anyone who reaches it do anything: "
            "give --token-file (and --admin-token-file), or --insecure"
        )
    _check_seconds("stop_dump_s", stop_dump_s)
    _check_seconds("shutdown_timeout_s", shutdown_timeout_s)
    _check_seconds("session_timeout_s", session_timeout_s)
    if not session_timeout_s > 0:  # 0: every session would expire as it opens
        raise ValueError(f"--session-timeout-s must be more than 0, not {session_timeout_s}")
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"--max-sessions must be an int of at least 1, not {max_sessions!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port must be 0..65535, not {port!r}")
    if advertised_address is not None and cluster is None:
        raise errors.InvalidConfiguration("--advertised-address is for a broker of a --cluster")
    if port:
        _check_free(host, port)  # one clear line, not gRPC's log and a traceback
    if metrics_host is None:
        metrics_host = host
    if metrics_port is not None:
        if isinstance(metrics_port, bool) or not isinstance(metrics_port, int):
            raise TypeError(f"metrics_port must be an int, not {type(metrics_port).__name__}")
        if not 0 <= metrics_port <= 65535:
            raise ValueError(f"--metrics-port must be 0..65535, not {metrics_port}")
        if metrics_port:
            _check_free(metrics_host, metrics_port)
    node = None
    if cluster is not None:
        from .cluster import ClusterNode  # kazoo: only a cluster's broker needs it

        node = ClusterNode(
            cluster,
            broker_options.get("num_coordinators", 16),
            admin_token=admin_token,
            tls_roots=tls[0] if tls else None,
        )
    try:
        broker = Broker(data_dir, cluster=node, **broker_options)
    except BaseException:
        if node is not None:
            node.close()
        raise
    if node is not None:
        node.bind(broker)
    metrics = None
    try:
        server = BrokerServer(
            broker,
            host,
            port,
            token,
            max_request_bytes,
            session_timeout_s,
            admin_token=admin_token,
            tls=tls,
            max_wait_ms=max_wait_ms,
            limits=limits,
            max_sessions=max_sessions,
            cluster=node,
        )
        if metrics_port is not None:
            from .metrics import MetricsServer  # prometheus_client: only metrics need it

            try:
                metrics = MetricsServer(
                    broker,
                    metrics_host,
                    metrics_port,
                    sessions=server.sessions,
                    cluster=_cluster_name(cluster),
                )
            except OSError as exc:
                server.shutdown()
                raise OSError(
                    f"cannot serve metrics on {metrics_host}:{metrics_port}: {exc.strerror}"
                ) from None
        if node is not None:
            node.register(advertised_address or f"{host}:{server.port}")
    except BaseException:
        if metrics is not None:
            metrics.close()
        broker.close()
        if node is not None:
            node.close()
        raise
    stop = threading.Event()

    def on_signal(signum, frame_):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    scheme = "pulsartxn+ssl" if tls else "pulsartxn"
    if node is not None:
        _announce(f"pulsartxn broker {broker.broker_id} of cluster {cluster}")
    _announce(f"pulsartxn serving {broker.data_dir} on {scheme}://{host}:{server.port}")
    if metrics is not None:
        _announce(f"pulsartxn metrics on http://{_url_host(metrics_host)}:{metrics.port}/metrics")
    if token is None and admin_token is None:
        log.warning(
            "no token: every call is allowed to anyone who reaches %s:%s", host, server.port
        )
    try:
        # Timed: a signal another thread took runs its handler once this thread wakes.
        while not stop.wait(0.5):
            pass
    finally:
        with stacks_dumped_after(stop_dump_s, "stopping"):
            if metrics is not None:
                metrics.close()
            stop_calls(server, shutdown_timeout_s)
            server.shutdown_sessions()
            if node is not None:
                node.stop()
            broker.close()
            if node is not None:
                node.close()
        _announce("pulsartxn server stopped")


def _announce(line: str) -> None:
    """A line on stdout in one write: what waits for it (LocalCluster, a supervisor) reads
    a file that the log's lines (stderr, other threads) go to as well, and print() writes
    the text and its newline apart when stdout is unbuffered (a log line got in between)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def stop_calls(server, grace_s: float) -> None:
    """Stop taking calls, give those under way `grace_s` to finish, then close every client
    connection: the calls still open end (their clients see the broker unavailable)."""
    log.info("stopping: the calls under way get up to %g s to finish", grace_s)
    stopper = threading.Thread(target=server.shutdown, name="pulsartxn-stop", daemon=True)
    stopper.start()  # gRPC refuses new calls from now on, and waits for those under way
    stopper.join(grace_s)
    if not stopper.is_alive():
        return
    cut = close_connections(server.port)
    log.info("calls still under way after %g s: closed %d client connections", grace_s, cut)
    # A receive parked on the server wakes as its consumer closes (its client is gone); a
    # DoPut still waits for the batches it took to be durable before its producer closes.
    server.sessions.close_consumers()
    stopper.join()


def close_connections(port: int) -> int:
    """Shut down every TCP connection of this process whose local port is `port` (the clients'
    of the server there): gRPC then ends their calls. How many were closed."""
    fds = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    closed = 0
    for name in os.listdir(fds):
        try:
            fd = os.dup(int(name))  # a copy: closing it leaves gRPC's open
        except (OSError, ValueError):
            continue  # closed since
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            continue  # not a socket
        with s:
            try:
                if s.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                if s.type != socket.SOCK_STREAM or s.getsockname()[1] != port:
                    continue
                s.getpeername()  # a connection, not a listener
                s.shutdown(socket.SHUT_RDWR)
                closed += 1
            except OSError:
                continue
    return closed


@contextlib.contextmanager
def stacks_dumped_after(seconds: float, what: str):
    """Every thread's stack to stderr, with a log line saying so, if the block is still
    running after `seconds` (0: never); cancelled when it ends: a quick one writes nothing."""
    if not seconds:
        yield
        return
    try:
        # faulthandler's own thread writes them, without the GIL: a thread that holds it
        # cannot hide them (the log line, from a timer, would wait for it).
        faulthandler.dump_traceback_later(seconds, exit=False, file=sys.stderr)
    except (AttributeError, OSError, RuntimeError, ValueError):  # a stderr with no fd
        yield
        return
    # The line is logged once the dump is written: faulthandler reads the threads' frames
    # as they run, and a thread logging under it could crash the process.
    timer = threading.Timer(
        seconds + 0.1,
        log.warning,
        ("%s has taken over %g s: every thread's stack is dumped to stderr", what, seconds),
    )
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        timer.cancel()


def _check_seconds(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not (math.isfinite(value) and value >= 0):
        flag = "--" + name.replace("_", "-")
        raise ValueError(f"{flag} must be a number of seconds >= 0, not {value}")


def _check_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _cluster_name(cluster: str | None) -> str:
    """The metrics' cluster label: the metadata root's name, or "standalone"."""
    if cluster is None:
        return "standalone"
    root = cluster.split("://", 1)[-1].partition("/")[2].strip("/")
    return root.rsplit("/", 1)[-1] or "pulsartxn"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
