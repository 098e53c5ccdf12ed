"""A real ZooKeeper server on 127.0.0.1, from the system package (Debian's `zookeeper`), for
`pulsartxn cluster` and the tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

from ..errors import InvalidConfiguration

JARS = "/usr/share/java"  # where Debian's zookeeper package puts zookeeper.jar and its deps
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


def _classpath() -> str:
    cp = os.environ.get("PULSARTXN_ZOOKEEPER_CLASSPATH")
    if cp:
        return cp
    if not os.path.exists(os.path.join(JARS, "zookeeper.jar")):
        raise InvalidConfiguration(
            "ZooKeeper is not installed: `apt-get install zookeeper` (or set "
            "PULSARTXN_ZOOKEEPER_CLASSPATH to its jars)"
        )
    return os.path.join(JARS, "zookeeper.jar")  # its manifest names its dependencies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalZooKeeper:
    """A standalone ZooKeeper process serving `data_dir` on 127.0.0.1:`port` (a free one by
    default). `tick_ms` sets the session timeouts it allows: 2 to 20 ticks."""

    def __init__(self, data_dir, port: int | None = None, tick_ms: int = 200) -> None:
        self.data_dir = str(data_dir)
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> LocalZooKeeper:
        java = shutil.which("java")
        if java is None:
            raise InvalidConfiguration("ZooKeeper needs a Java runtime: java is not on PATH")
        os.makedirs(self.data_dir, exist_ok=True)
        log = open(os.path.join(self.data_dir, "zookeeper.log"), "ab")
        cmd = [
            java,
            "-Xmx256m",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.4lw.commands.whitelist=srvr",
            "-Dzookeeper.clientPortAddress=127.0.0.1",
            "-cp",
            _classpath(),
            MAIN,
            str(self.port),
            self.data_dir,
            str(self.tick_ms),
        ]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self._serving():
            if self.proc.poll() is not None:
                raise InvalidConfiguration(
                    f"ZooKeeper exited with {self.proc.returncode}: see "
                    f"{os.path.join(self.data_dir, 'zookeeper.log')}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise InvalidConfiguration(f"ZooKeeper did not start within {timeout_s} s")
            time.sleep(0.05)
        return self

    def _serving(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"srvr")
                return b"Mode:" in s.recv(4096)
        except OSError:
            return False

    def stop(self, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)

    def __enter__(self) -> LocalZooKeeper:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
