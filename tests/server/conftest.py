from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest


class Server:
    """`pulsartxn serve` as a real process on 127.0.0.1 (a free port, kept across restarts)."""

    def __init__(self, data_dir, *extra) -> None:
        self.data_dir = str(data_dir)
        self.extra = list(extra)
        self.port = 0
        self.proc = None

    def start(self) -> str:
        cmd = [
            sys.executable,
            "-m",
            "pulsartxn",
            "serve",
            "--data-dir",
            self.data_dir,
            "--port",
            str(self.port),
            "--no-sync",
            *self.extra,
        ]
        # Its log goes to a file: a pipe nobody reads would block the server once full.
        log = open(self.data_dir + ".log", "a")  # noqa: SIM115 - the process holds it
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            found = re.search(r"pulsartxn(?:\+ssl)?://127\.0\.0\.1:(\d+)", line or "")
            if found:
                self.port = int(found.group(1))
                return self.url
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log()[-4000:]}")
        raise RuntimeError("server did not start")

    def log(self) -> str:
        """What the server has logged (stderr), over all its starts."""
        with open(self.data_dir + ".log") as f:
            return f.read()

    @property
    def url(self) -> str:
        return f"pulsartxn://127.0.0.1:{self.port}"

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode if self.proc else 0


@pytest.fixture
def server(tmp_path):
    servers = []

    def make(*extra):
        s = Server(tmp_path / "data", *extra)
        servers.append(s)
        s.start()
        return s

    yield make
    for s in servers:
        s.stop()
