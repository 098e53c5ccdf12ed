"""``pulsartxn serve``: a broker on a data directory, served until SIGINT/SIGTERM."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading

from .. import errors
from ..broker import Broker
from . import protocol
from .service import MAX_WAIT_MS, BrokerServer
from .sessions import MAX_SESSIONS, SessionLimits

log = logging.getLogger(__name__)


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
    **broker_options,
) -> None:
    """Run a broker and serve it until SIGINT/SIGTERM; then close it cleanly (in-flight
    groups committed, sessions closed, LMDB closed). Off loopback, a server without a token
    is refused unless `insecure` (anyone who reaches the port could do anything)."""
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
    if port:
        _check_free(host, port)  # one clear line, not gRPC's log and a traceback
    broker = Broker(data_dir, **broker_options)
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
        )
    except BaseException:
        broker.close()
        raise
    stop = threading.Event()

    def on_signal(signum, frame_):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    scheme = "pulsartxn+ssl" if tls else "pulsartxn"
    print(f"pulsartxn serving {broker.data_dir} on {scheme}://{host}:{server.port}", flush=True)
    if token is None and admin_token is None:
        log.warning("no token: every call is allowed to anyone who reaches %s:%s", host, port)
    try:
        stop.wait()
    finally:
        server.shutdown_sessions()
        server.shutdown()
        broker.close()
        print("pulsartxn server stopped", flush=True)


def _check_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
