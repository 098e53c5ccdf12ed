"""Helpers shared by the test modules: opening brokers that are closed at the end, a
`pulsartxn serve` process (Server), reading back what a topic or subscription holds, the
fault the Spark write tests inject, and a small filesystem to fill. Import them as
``from tests.helpers import drain``."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

import pulsartxn
from pulsartxn.cluster.local import wait_stopped
from pulsartxn.errors import Timeout


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_in_use() -> int:
    """Bytes the C heap (glibc malloc) has handed out and not taken back: its arenas' blocks
    in use and its mmapped blocks, in every thread. Python's objects over 512 bytes (payloads,
    arrays) live there; its small ones are in pymalloc's own arenas, not counted. Unlike
    tracemalloc, it hooks nothing: tracemalloc's stop() races with threads that are not
    Python's (gRPC's, in a served test) and crashed a CI run in Python 3.11."""
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def python_child(tmp_path, script: str, *args: str) -> subprocess.Popen:
    """`script` run by a Python child (written to tmp_path/child.py) that imports this
    checkout, with `args`; its stdin and stdout are text pipes, for the test to pace it and
    kill it (SIGKILL) where it says."""
    path = tmp_path / "child.py"
    path.write_text(script)
    return subprocess.Popen(
        [sys.executable, str(path), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
        text=True,
    )


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


@contextmanager
def brokers_at(path, wrap=None, **defaults):
    """Yields open_(**options): a Broker on `path` (options over `defaults`; passed through
    `wrap` if given), reopenable after a close; every one opened is closed at the end."""
    brokers = []

    def open_(**options):
        b = pulsartxn.Broker(path, **{**defaults, **options})
        if wrap is not None:
            b = wrap(b)
        brokers.append(b)
        return b

    try:
        yield open_
    finally:
        for b in brokers:
            b.close()


class Served:
    """A broker whose client() is a remote client through a server on 127.0.0.1 (the rest of
    the broker, admin included, as it is): the same tests then run over the network."""

    def __init__(self, broker) -> None:
        from pulsartxn.server.service import BrokerServer

        self._broker = broker
        self._server = BrokerServer(broker, "127.0.0.1", 0)
        self._clients = []

    def client(self):
        c = pulsartxn.Client(f"pulsartxn://127.0.0.1:{self._server.port}")
        self._clients.append(c)
        return c

    def close(self) -> None:
        """Stop the server as a restart does: its clients' sessions, and their transactions,
        outlive it (a client that closed would end its session's). The clients are dropped
        once what their producers hold is sent."""
        from pulsartxn.remote import RemoteProducer

        for c in self._clients:
            for obj in list(c._objects):
                if isinstance(obj, RemoteProducer) and not obj._closed:
                    obj.flush()
            c._stop.set()
            c._closed = True
        self._server.shutdown_sessions()
        self._server.shutdown()
        self._broker.close()
        for c in self._clients:
            c._flight.close()
        self._clients = []

    def __getattr__(self, name):
        return getattr(self._broker, name)


@contextmanager
def paused(proc):
    """`proc` (a Popen) stopped with SIGSTOP for the block, once every thread of it is: the
    signal reaches each thread in its own time, and one running on another core may serve a
    call first (a send made right after SIGSTOP was answered, once, under load)."""
    proc.send_signal(signal.SIGSTOP)
    try:
        assert wait_stopped(proc.pid), f"process {proc.pid} still runs after SIGSTOP"
        yield
    finally:
        proc.send_signal(signal.SIGCONT)


def frames(thread_id: int | None) -> list[str]:
    """The names of the Python functions the thread of that ident is in, innermost first
    (none once it ended)."""
    frame, names = sys._current_frames().get(thread_id), []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


def drain(consumer, timeout_ms: int = 200, acknowledge: bool = False) -> list:
    """Every message `consumer` receives until none comes for `timeout_ms` (in order); with
    `acknowledge`, each acknowledged as it comes (so none is redelivered meanwhile)."""
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_ms))
        except Timeout:
            return out
        if acknowledge:
            consumer.acknowledge(out[-1])


def scanned(client, topic: str, *, sort: bool = False) -> list[bytes]:
    """The values stored in `topic` (every partition), read by a scan: in scan order, or
    sorted."""
    values = [v for b in client.scan(topic) for v in b.column("value").to_pylist()]
    return sorted(values) if sort else values


def failing_once(mode: str):
    """A Spark write's ``_inject`` hook that fails partition 1's first attempt after it has
    sent two of its batches (mode "raise": an exception; "crash": the Python worker dies, so
    the attempt never reports back and never aborts its own transaction)."""

    def inject(partition_id, attempt, sent):
        import os

        if partition_id == 1 and attempt == 0 and sent == 2:
            if mode == "crash":
                os._exit(1)
            raise RuntimeError("injected failure in the middle of partition 1")

    return inject


@contextmanager
def small_tmpfs(mnt, size: str):
    """A tmpfs of `size` mounted at `mnt` for the block (root only; skips the test where
    mounting is refused): real ENOSPC from the kernel."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    os.makedirs(mnt, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def free_ports(n: int) -> int:
    """A port from which `n` ports in a row are free to bind on 127.0.0.1 (checked now: good
    enough for a test)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65536 and all(_bindable(base + i) for i in range(n)):
            return base


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition"):
    """predicate()'s first true value, looked at every 5 ms; AssertionError past timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class LosingProxy:
    """A TCP relay on 127.0.0.1 to `target` (host, port) that can lose answers: after
    ``hold_answers()`` what the server sends is dropped, so a request reaches the server and
    its answer never comes back; ``cut()`` then closes every connection (the client sees it
    lost, reconnects, and answers flow again); while ``refusing`` is set, connections are
    closed as they come; ``close()`` refuses new connections for good."""

    def __init__(self, target: tuple[str, int]) -> None:
        import threading

        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._holding = False
        self._closed = False
        self.dropped = 0  # bytes of answers lost while holding
        self.refusing = False  # connections closed as they come: the broker out of reach
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def hold_answers(self) -> None:
        self._holding = True

    def cut(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        # Only now: cleared before the shutdown, a pump could pass on the tail of an answer
        # whose head it dropped (a gRPC status with no result), which no network does.
        self._holding = False

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close would not)
        except OSError:
            pass
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._closed:
                client.close()
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if not (answers and self._holding):
                    dst.sendall(data)
                else:
                    self.dropped += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def in_thread(fn):
    """Run fn() in a started thread: (the thread, a list that gets fn's result or the
    exception it raised)."""
    import threading

    got: list = []

    def run() -> None:
        try:
            got.append(fn())
        except Exception as exc:  # noqa: BLE001 - what the caller looks at
            got.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def racing(n: int, fn) -> list:
    """fn(i) for i in range(n), each in a thread of its own, let go together: what each
    returned or raised, in the order of i."""
    import threading

    start = threading.Barrier(n)

    def run(i):
        start.wait()
        return fn(i)

    calls = [in_thread(lambda i=i: run(i)) for i in range(n)]
    for thread, _ in calls:
        thread.join(60)
    return [got[0] for _, got in calls]


def the_one_winner(outcomes: list, loses: type) -> int:
    """Of racing()'s outcomes, the index of the one call that returned; every other raised
    `loses`."""
    winners = [i for i, o in enumerate(outcomes) if not isinstance(o, BaseException)]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, loses) for i, o in enumerate(outcomes) if i != winners[0]), outcomes
    return winners[0]


def answer_lost(proxies, fn, landed=None) -> list:
    """fn() run in a thread while every one of `proxies` (LosingProxy) drops the server's
    answers; once it has landed (`landed()` returns, by default half a second later) the
    connections are cut, and fn() goes on after reconnecting: what it returned or raised
    (a list of one)."""
    import time

    for proxy in proxies:
        proxy.hold_answers()
    call, got = in_thread(fn)
    if landed is None:
        time.sleep(0.5)
    else:
        landed()
    for proxy in proxies:
        proxy.cut()
    call.join(60)
    return got


@contextmanager
def losing_answers(proxies, seed: int, cuts: int):
    """While the block runs, one of `proxies` (LosingProxy) at a time drops the server's
    answers for up to 30 ms and then cuts, every 20-120 ms, `cuts` times at most; yields a
    list whose one item counts the cuts made."""
    import random
    import threading

    rng = random.Random(seed)
    made = [0]
    stop = threading.Event()

    def run() -> None:
        while made[0] < cuts and not stop.wait(rng.uniform(0.02, 0.12)):
            proxy = rng.choice(proxies)
            proxy.hold_answers()
            stop.wait(rng.uniform(0.0, 0.03))
            proxy.cut()
            made[0] += 1

    chaos = threading.Thread(target=run)
    chaos.start()
    try:
        yield made
    finally:
        stop.set()
        chaos.join()


def exactly_once_loop(client, n: int, subscription_type, batch: bool = False) -> int:
    """Consume `n` messages of topic "in" (subscription "loop", from the earliest), each batch
    of them (one by receive, or up to 5 by batch_receive) in a transaction: topic "out" gets
    b"out-" + each, keyed as the input, and the input is acked (cumulatively, for a batch).
    A transaction that fails is aborted and what it acked is redelivered. Returns how many
    transactions failed."""
    consumer = client.subscribe(
        "in",
        "loop",
        subscription_type=subscription_type,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    out = client.create_producer("out", batching_enabled=False)
    done = failed = 0
    while done < n:
        if batch:
            msgs = consumer.batch_receive(5, 1000)
            if not msgs:
                continue
        else:
            msgs = [consumer.receive(30_000)]
        txn = client.new_transaction()
        try:
            for msg in msgs:
                out.send(b"out-" + msg.data(), partition_key=msg.partition_key(), txn=txn)
            if batch:
                consumer.acknowledge_cumulative(msgs[-1], txn=txn)
            else:
                consumer.acknowledge(msgs[0], txn=txn)
            txn.commit()
        except pulsartxn.PulsarTxnError:
            # Aborted (or never begun): its acks are void; the messages come again.
            failed += 1
            if txn.state is not pulsartxn.TxnState.ABORTED:
                txn.abort()
            consumer.redeliver_unacknowledged_messages()
            continue
        done += len(msgs)
    return failed
