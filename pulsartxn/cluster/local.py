"""A cluster on this machine: a ZooKeeper and N `pulsartxn serve --cluster` processes on
127.0.0.1, for `pulsartxn cluster` and the tests. Each broker keeps its port for the cluster's
life (a restarted broker comes back at the same address) and its id in its data directory."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Collection

from ..errors import InvalidConfiguration
from .metadata import ClusterMetadata
from .zookeeper import LocalZooKeeper, free_port

HOST = "127.0.0.1"
_SERVING = re.compile(rb"^pulsartxn serving .* on pulsartxn(?:\+ssl)?://\S+$", re.M)
_BROKER_ID = re.compile(rb"^pulsartxn broker (\S+) of cluster ", re.M)
_STATE = "cluster.json"  # a data directory's ports (reused at restart) and broker ids
STALE_WAIT_S = 15.0  # the longest a start waits for a dead process's registration to expire


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        # As the servers bind (ZooKeeper, gRPC): a port in TIME_WAIT after a stop is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_ports(n: int, avoid: Collection[int] = ()) -> list[int]:
    """`n` free ports, below the kernel's ephemeral range when it leaves room: a port kept for
    a broker's restarts must not be handed meanwhile to some outgoing connection."""
    low, out = _ephemeral_low(), []
    tries = 0
    while len(out) < n:
        tries += 1
        if low > 12_000 and tries < 1000:
            port = random.randrange(10_000, low)
        else:
            port = free_port()
        if port not in out and port not in avoid and _bindable(port):
            out.append(port)
    return out


class _Broker:
    def __init__(self, index: int, port: int, data_dir: str, log_path: str) -> None:
        self.index = index
        self.port = port
        self.data_dir = data_dir
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0  # where this start's output begins in the log
        self.broker_id: str | None = None

    def output(self) -> bytes:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read()
        except OSError:
            return b""


class LocalCluster:
    """A ZooKeeper (its own, in `data_dir`/zookeeper, unless `zookeeper` names a running one
    as HOST:PORT) and `brokers` broker processes, broker i serving `data_dir`/broker-i on
    127.0.0.1 and logging to `data_dir`/broker-i.log. Ports: `base_port` + i (0: free ones,
    those of the directory's previous run when still free); ZooKeeper's: `zk_port`; broker
    i's Prometheus metrics: `metrics_base_port` + i (None: none)."""

    def __init__(
        self,
        data_dir,
        brokers: int = 3,
        *,
        zookeeper: str | None = None,
        root: str = "pulsartxn",
        zk_port: int = 0,
        base_port: int = 0,
        num_coordinators: int = 16,
        sync: bool = True,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        metrics_base_port: int | None = None,
    ) -> None:
        if brokers < 1:
            raise InvalidConfiguration(f"a cluster needs at least one broker, not {brokers}")
        if metrics_base_port is not None and not 0 < metrics_base_port <= 65536 - brokers:
            raise ValueError(
                f"metrics_base_port must leave room for {brokers} ports in 1..65535, "
                f"not {metrics_base_port}"
            )
        self.metrics_base_port = metrics_base_port
        self.data_dir = os.path.abspath(str(data_dir))
        os.makedirs(self.data_dir, exist_ok=True)
        self.root = root.strip("/")
        self.num_coordinators = num_coordinators
        self.sync = sync
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.extra_args = tuple(extra_args)
        # faulthandler: a crash, or the SIGABRT of a broker that does not stop, writes every
        # thread's stack to its log.
        self.env = {"PYTHONFAULTHANDLER": "1", **os.environ, **(env or {})}
        saved = self._load_state()
        self._zk_address = zookeeper
        self.zookeeper: LocalZooKeeper | None = None
        if zookeeper is None:
            port = zk_port or saved.get("zk_port")
            if not zk_port and (not port or not _bindable(port)):
                port = pick_ports(1)[0]
            self.zookeeper = LocalZooKeeper(os.path.join(self.data_dir, "zookeeper"), port)
            self._zk_address = self.zookeeper.address
        ports = self._ports(brokers, base_port, saved.get("ports", []))
        self._brokers = [
            _Broker(
                i,
                port,
                os.path.join(self.data_dir, f"broker-{i}"),
                os.path.join(self.data_dir, f"broker-{i}.log"),
            )
            for i, port in enumerate(ports)
        ]
        saved_ids = saved.get("broker_ids", [])
        for b, broker_id in zip(self._brokers, saved_ids):
            b.broker_id = broker_id
        # Brokers of an earlier run beyond this one's count: kept for a run that has them.
        self._beyond = (saved.get("ports", [])[brokers:], saved_ids[brokers:])
        self._save_state()

    def _ports(self, n: int, base_port: int, saved: list[int]) -> list[int]:
        if base_port:
            return [base_port + i for i in range(n)]
        zk = {self.zookeeper.port} if self.zookeeper else set()
        kept = [p for p in saved[:n] if p not in zk and _bindable(p)]
        if len(kept) < min(n, len(saved)):
            kept = []  # one of them is taken: a fresh set rather than a mix
        return kept + pick_ports(n - len(kept), avoid=set(kept) | zk)

    def _load_state(self) -> dict:
        try:
            with open(os.path.join(self.data_dir, _STATE)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        state = {
            "zk_port": self.zookeeper.port if self.zookeeper else None,
            "ports": [b.port for b in self._brokers] + self._beyond[0],
            "broker_ids": [b.broker_id for b in self._brokers] + self._beyond[1],
        }
        path = os.path.join(self.data_dir, _STATE)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)

    # -- what it serves ---------------------------------------------------------------------

    @property
    def zk_url(self) -> str:
        return f"zk://{self._zk_address}/{self.root}"

    @property
    def addresses(self) -> list[str]:
        return [f"{HOST}:{b.port}" for b in self._brokers]

    @property
    def service_url(self) -> str:
        """pulsartxn://h1:p1,h2:p2,... of every broker, running or not."""
        return "pulsartxn://" + ",".join(self.addresses)

    def metrics_url(self, i: int) -> str | None:
        """Broker i's Prometheus endpoint (None without `metrics_base_port`)."""
        if self.metrics_base_port is None:
            return None
        return f"http://{HOST}:{self.metrics_base_port + i}/metrics"

    def __len__(self) -> int:
        return len(self._brokers)

    def broker_id(self, i: int) -> str | None:
        """Broker i's cluster id, as it printed at its last start (in this data directory:
        None until its first)."""
        return self._brokers[i].broker_id

    def data_dir_of(self, i: int) -> str:
        return self._brokers[i].data_dir

    def log_path(self, i: int) -> str:
        return self._brokers[i].log_path

    def process(self, i: int) -> subprocess.Popen | None:
        return self._brokers[i].proc

    def is_running(self, i: int) -> bool:
        proc = self._brokers[i].proc
        return proc is not None and proc.poll() is None

    # -- starting and stopping -------------------------------------------------------------

    def start(self, i: int | None = None) -> LocalCluster:
        """Broker i, or (None) ZooKeeper if it is not running and every broker that is not;
        returns once each serves and is registered, or raises with its log's tail (and
        stops what this call started when it starts the whole cluster)."""
        if i is not None:
            b = self._brokers[i]
            self._wait_unregistered([b])
            self._spawn(b)
            self._wait_up(b)
            return self
        try:
            if self.zookeeper is not None and self.zookeeper.proc is None:
                self.start_zookeeper()
            todo = [b for b in self._brokers if not self.is_running(b.index)]
            self._wait_unregistered(todo)
            for b in todo:  # all at once: they start in parallel
                self._spawn(b)
            for b in todo:
                self._wait_up(b)
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, b: _Broker) -> None:
        if self.is_running(b.index):
            raise InvalidConfiguration(f"broker {b.index} is running (pid {b.proc.pid})")
        cmd = [
            sys.executable,
            "-m",
            "pulsartxn",
            "serve",
            "--data-dir",
            b.data_dir,
            "--host",
            HOST,
            "--port",
            str(b.port),
            "--cluster",
            self.zk_url,
            "--advertised-address",
            f"{HOST}:{b.port}",
            "--num-coordinators",
            str(self.num_coordinators),
            *(() if self.sync else ("--no-sync",)),
            *(
                ()
                if self.metrics_base_port is None
                else ("--metrics-port", str(self.metrics_base_port + b.index))
            ),
            *self.extra_args,
        ]
        with open(b.log_path, "ab") as log:
            b.log_offset = log.tell()
            # A session of its own: a terminal's Ctrl-C reaches only the process that runs
            # the cluster, which stops the brokers before ZooKeeper.
            b.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def _wait_unregistered(self, brokers: list[_Broker]) -> None:
        """A broker refuses to start while its id is registered by a live ZooKeeper session:
        after a kill or a crash, the dead process's, until it times out (4 s; ZooKeeper keeps
        sessions across its own restarts). Past STALE_WAIT_S the broker says what holds it."""
        ids = {b.broker_id for b in brokers if b.broker_id and not self.is_running(b.index)}
        if not ids:
            return
        deadline = time.monotonic() + min(self.start_timeout_s, STALE_WAIT_S)
        with ClusterMetadata(self.zk_url) as meta:
            while ids & set(meta.live_brokers(fresh=True)) and time.monotonic() < deadline:
                time.sleep(0.1)

    def _wait_up(self, b: _Broker) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            out = b.output()
            if _SERVING.search(out):
                found = _BROKER_ID.search(out)
                b.broker_id = found.group(1).decode() if found else None
                self._save_state()
                return
            code = b.proc.poll()
            if code is not None:
                raise InvalidConfiguration(
                    f"broker {b.index} exited with {code} before serving; "
                    f"the end of {b.log_path}:\n{self._tail(b)}"
                )
            if time.monotonic() > deadline:
                b.proc.kill()
                b.proc.wait()
                raise InvalidConfiguration(
                    f"broker {b.index} did not serve within {self.start_timeout_s} s "
                    f"(killed); the end of {b.log_path}:\n{self._tail(b)}"
                )
            time.sleep(0.05)

    @staticmethod
    def _tail(b: _Broker, lines: int = 20) -> str:
        text = b.output().decode(errors="replace").rstrip("\n")
        return "\n".join(text.splitlines()[-lines:]) or "(nothing)"

    def kill(self, i: int) -> None:
        """SIGKILL broker i (its ZooKeeper session lasts until it times out)."""
        proc = self._brokers[i].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def pause(self, i: int) -> None:
        """SIGSTOP broker i: a process that is alive but silent (a long GC pause, a stopped
        VM); its ZooKeeper session expires past its timeout. Returns once every thread of it
        is stopped (where /proc tells): one on another core may still answer a call first."""
        proc = self._brokers[i].proc
        proc.send_signal(signal.SIGSTOP)
        wait_stopped(proc.pid)

    def resume(self, i: int) -> None:
        """SIGCONT broker i."""
        self._brokers[i].proc.send_signal(signal.SIGCONT)

    def stop(self, i: int) -> int | None:
        """SIGTERM broker i and wait for it (past stop_timeout_s: SIGABRT, its stacks to its
        log, then SIGKILL); its exit code, None if it was not started."""
        return self._stop([self._brokers[i]])[0]

    def _stop(self, brokers: list[_Broker]) -> list[int | None]:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.terminate()
                b.proc.send_signal(signal.SIGCONT)  # a paused one too
        deadline = time.monotonic() + self.stop_timeout_s
        codes = []
        for b in brokers:
            if b.proc is None:
                codes.append(None)
                continue
            try:
                codes.append(b.proc.wait(max(0.0, deadline - time.monotonic())))
                continue
            except subprocess.TimeoutExpired:
                b.proc.send_signal(signal.SIGABRT)
            try:
                codes.append(b.proc.wait(5))
            except subprocess.TimeoutExpired:
                b.proc.kill()
                codes.append(b.proc.wait())
        return codes

    def restart(self, i: int) -> LocalCluster:
        """Stop broker i cleanly (if it runs) and start it again, on the same port."""
        self.stop(i)
        return self.start(i)

    def kill_zookeeper(self) -> None:
        """SIGKILL this cluster's ZooKeeper (its data directory stays)."""
        self._own_zookeeper().stop(kill=True)

    def start_zookeeper(self) -> None:
        """Start this cluster's ZooKeeper, on its port and data directory."""
        zk = self._own_zookeeper()
        if threading.current_thread() is threading.main_thread():
            # An ignored signal stays ignored across exec (and the JVM leaves it so): a
            # terminal's Ctrl-C must not stop ZooKeeper before the brokers.
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                zk.start()
            finally:
                signal.signal(signal.SIGINT, old)
        else:
            zk.start()

    def _own_zookeeper(self) -> LocalZooKeeper:
        if self.zookeeper is None:
            raise InvalidConfiguration(f"this cluster uses the ZooKeeper at {self._zk_address}")
        return self.zookeeper

    def close(self) -> dict[int, int]:
        """SIGTERM every broker and wait for them, then stop ZooKeeper; the exit code of each
        broker that was running (0: a clean stop)."""
        running = [b for b in self._brokers if self.is_running(b.index)]
        codes = self._stop(running)
        if self.zookeeper is not None:
            self.zookeeper.stop()
        return {b.index: code for b, code in zip(running, codes)}

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def wait_stopped(pid: int, timeout_s: float = 10.0) -> bool:
    """Until every thread of process `pid` shows stopped (T) in /proc; False if one still
    ran at the timeout (True at once where there is no /proc to tell)."""
    tasks = f"/proc/{pid}/task"
    if not os.path.isdir(tasks):
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(tasks):
            try:
                with open(f"{tasks}/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue  # a thread that ended meanwhile
        if all(state in "Tt" for state in states):
            return True
        time.sleep(0.001)
    return False
