"""`pulsartxn produce` and `pulsartxn consume` (as pulsar-client's CLI) on the embedded default
and against a real `serve` process; `pulsartxn --version`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pulsartxn
from pulsartxn.cli import main
from tests.helpers import Server, wait_for

ROOT = Path(__file__).resolve().parents[1]
TOKEN, ADMIN = "t0ken-for-clients", "t0ken-for-admin"


def run(capsys, *argv) -> tuple[int, list[str], list[str]]:
    """(exit code, stdout lines, stderr lines) of ``pulsartxn *argv`` run in this process."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse: --help, --version, a bad flag
        code = exc.code
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def consume_all(capsys, *argv) -> list[str]:
    code, out, err = run(capsys, "consume", *argv, "-n", "0", "--timeout", "0.3")
    assert code == 0 and len(err) == 1 and "none more within 0.3 s" in err[0], err
    return out


def interruptible(argv: list[str]) -> subprocess.Popen:
    """`argv` started as a command in a terminal is: SIGINT (Ctrl-C) at its default. A process
    that ignores SIGINT (a background job of a shell without job control, as a CI runner may
    start the tests) passes SIG_IGN on to its children, and Ctrl-C would do nothing there."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # reset to SIG_DFL by exec
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, old)


def wait_connected(proc: subprocess.Popen, port: int, timeout: float = 60.0) -> None:
    """Until `proc` has a TCP connection to 127.0.0.1:`port` (Linux /proc): it has started
    up and is connecting, so a SIGINT now reaches its handler, not its start-up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        inodes = set()
        for fd in Path(f"/proc/{proc.pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == port:
                    return
        time.sleep(0.05)
    raise AssertionError(f"no connection to port {port} within {timeout} s")


def serve(tmp: Path, *options: str) -> Server:
    """A started `pulsartxn serve` on tmp/data with the token in tmp/token."""
    server = Server(tmp / "data", "--token-file", str(tmp / "token"), *options)
    server.start()
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One `pulsartxn serve` with a client token and an admin token, for the whole module."""
    tmp = tmp_path_factory.mktemp("served")
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "admin").write_text(ADMIN)
    (tmp / "wrong").write_text("not-the-token")
    server = serve(tmp, "--admin-token-file", str(tmp / "admin"))
    try:
        yield server.url, tmp
    finally:
        server.stop()


def test_produce_then_consume_on_the_embedded_default(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PULSARTXN_DATA_DIR", str(tmp_path / "env-dir"))
    code, out, err = run(
        capsys,
        "produce",
        "orders",
        "-m",
        "a,b",
        "-k",
        "cust-1",
        "-p",
        "x=1",
        "-p",
        "y=a=b",
        "-n",
        "2",
    )
    assert (code, err) == (0, []) and out == ["4 messages produced to orders"]
    assert (tmp_path / "env-dir").is_dir()  # env PULSARTXN_DATA_DIR, as demo
    lines = consume_all(capsys, "orders", "-s", "sub", "-p", "Earliest")
    assert [line.split(" content:")[1] for line in lines] == ["a", "b", "a", "b"]
    assert all(" key:[cust-1] properties:[x=1, y=a=b] " in line for line in lines)
    assert re.match(r"id:\(\d+,\d+,-1,\d+\) key:", lines[0])
    # What was printed was acknowledged: the subscription has nothing left.
    assert consume_all(capsys, "orders", "-s", "sub") == []
    # -n stops at NUM and acknowledges only those; a new subscription is Latest by default.
    run(capsys, "produce", "orders", "-m", "c", "-m", "d", "-s", "")
    code, out, _ = run(capsys, "consume", "orders", "-s", "sub", "-n", "1")
    assert code == 0 and out[0].endswith("content:c")
    assert [x.split("content:")[1] for x in consume_all(capsys, "orders", "-s", "sub")] == ["d"]
    assert consume_all(capsys, "orders", "-s", "late", "-t", "Shared") == []


def test_payloads_print_on_one_line_or_as_hex(tmp_path, capsys):
    data = ["--data-dir", str(tmp_path / "d")]
    raw = b"line1\nline2\t\\ \xff\x00 \xc3\xa9"
    (tmp_path / "payload").write_bytes(raw)
    code, out, _ = run(capsys, "produce", "t", "-f", str(tmp_path / "payload"), "-m", "x", *data)
    assert code == 0 and out == ["2 messages produced to t"]
    args = ["t", "-s", "s", "-p", "Earliest", "-t", "Key_Shared", *data]
    code, out, _ = run(capsys, "consume", *args, "-n", "2", "--hex")
    assert code == 0 and [x.split("content:")[1] for x in out] == ["78", raw.hex()]
    run(capsys, "produce", "t", "-f", str(tmp_path / "payload"), *data)
    (line,) = consume_all(capsys, *args)
    assert line.endswith(r"content:line1\nline2\t\\ \xff\x00 é")
    assert "key:[null] properties:[]" in line


def test_txn_produce_is_all_or_nothing(tmp_path, capsys):
    data = ["--data-dir", str(tmp_path / "d")]
    big = tmp_path / "big"
    big.write_bytes(b"x" * (5 * 1024 * 1024 + 1))  # over Pulsar's default maxMessageSize
    code, out, err = run(capsys, "produce", "t", "-m", "first", "-f", str(big), "--txn", *data)
    assert code == 2 and out == [] and len(err) == 1
    assert "exceeds max_message_size" in err[0] and "aborted: nothing produced" in err[0]
    assert consume_all(capsys, "t", "-s", "s", "-p", "Earliest", *data) == []
    # Without --txn what was sent before the failure stays (as pulsar-client's).
    code, _, err = run(capsys, "produce", "t", "-m", "first", "-f", str(big), *data)
    assert code == 2 and len(err) == 1 and "aborted" not in err[0]
    assert [x.split("content:")[1] for x in consume_all(capsys, "t", "-s", "s", *data)] == ["first"]
    code, out, _ = run(capsys, "produce", "t", "-m", "p,q", "-n", "3", "--txn", *data)
    assert code == 0 and re.fullmatch(r"6 messages produced to \S+ in transaction \d+:\d+", out[0])
    assert len(consume_all(capsys, "t", "-s", "s", *data)) == 6


@pytest.mark.parametrize(
    "argv, says",
    [
        (["consume", "t"], "required: -s/--subscription-name"),
        (["consume", "t", "-s", "s", "-t", "KeyShared"], "invalid choice: 'KeyShared'"),
        (["consume", "t", "-s", "s", "-p", "earliest"], "invalid choice: 'earliest'"),
        (["consume", "t", "-s", "s", "-n", "-1"], "-n/--num-messages must not be negative"),
        (["consume", "t", "-s", "s", "--timeout", "0"], "--timeout must be a positive"),
        (["consume", "t", "-s", "s", "--bogus"], "unrecognized arguments: --bogus"),
        (["produce", "t"], "give the messages to send"),
        (["produce", "t", "-m", "x", "-n", "0"], "-n/--num-produce must be at least 1"),
        (["produce", "t", "-m", "x", "-n", "two"], "invalid int value: 'two'"),
        (["produce", "t", "-m", "x", "-p", "novalue"], "takes KEY=VALUE, not 'novalue'"),
        (["produce", "t", "-m", "x", "-p", "=v"], "takes KEY=VALUE, not '=v'"),
        (["produce", "t", "-m", "x", "-r", "-1"], "-r/--rate must not be negative"),
        (["produce", "t", "-m", "x", "-r", "nan"], "-r/--rate must not be negative"),
        (["consume", "t", "-s", "s", "--timeout", "nan"], "--timeout must be a positive"),
        (["produce", "t", "-f", "/nonexistent/file"], "No such file or directory"),
        (["produce", "t", "-m", "x", "--token-file", "tf"], "go with --url"),
        (["produce", "t", "-m", "x", "--url", "pulsartxn://h:1", "--data-dir", "d"], "not with"),
        (["produce", "t", "-m", "x", "--url", "http://127.0.0.1:1"], "pulsartxn://"),
        (["produce", "bad//name", "-m", "x"], "bad//name"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.setenv("PULSARTXN_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == [] and len(err) == 1 and says in err[0], err
    assert "Traceback" not in err[0]
    if argv[1] == "t":  # checked before the broker is opened
        assert not (tmp_path / "d").exists()


def test_consume_of_a_missing_or_empty_topic_times_out_cleanly(tmp_path, capsys):
    data = ["--data-dir", str(tmp_path / "d")]
    start = time.monotonic()
    code, out, err = run(capsys, "consume", "nothing-here", "-s", "s", "--timeout", "0.2", *data)
    assert (code, out) == (0, []) and err == [
        "pulsartxn consume: 0 messages; none more within 0.2 s"
    ]
    assert time.monotonic() - start < 5
    code, out, err = run(capsys, "consume", "nothing-here", "-s", "s", "--timeout", "0.2", *data)
    assert (code, out) == (0, []) and len(err) == 1


def test_against_a_served_broker_with_a_token(server, capsys):
    url, tmp = server
    remote = ["--url", url, "--token-file", str(tmp / "token")]
    code, out, err = run(capsys, "produce", "rt", "-m", "r1,r2", "-k", "k", "--txn", *remote)
    assert code == 0 and out[0].startswith("2 messages produced to rt")
    lines = consume_all(capsys, "rt", "-s", "s", "-p", "Earliest", *remote)
    assert [x.split("content:")[1] for x in lines] == ["r1", "r2"] and "key:[k]" in lines[0]
    code, out, err = run(capsys, "produce", "rt", "-m", "x", "--url", url)
    assert code == 2 and len(err) == 1 and out == []
    wrong = ["--url", url, "--token-file", str(tmp / "wrong")]
    code, out, err = run(capsys, "consume", "rt", "-s", "s", "--timeout", "0.2", *wrong)
    assert code == 2 and len(err) == 1 and out == []
    # The data directory is the server's: the embedded default finds it locked.
    code, out, err = run(capsys, "produce", "rt", "-m", "x", "--data-dir", str(tmp / "data"))
    assert code == 2 and len(err) == 1 and "lock" in err[0].lower()
    assert consume_all(capsys, "rt", "-s", "s", *remote) == []


def test_processes_consume_until_ctrl_c(server, capsys):
    """`python -m pulsartxn consume -n 0` prints what `python -m pulsartxn produce` sends,
    holds its Exclusive subscription against another consume, and ends with exit 0 on SIGINT
    (Ctrl-C)."""
    url, tmp = server
    remote = ["--url", url, "--token-file", str(tmp / "token")]
    cmd = [sys.executable, "-m", "pulsartxn"]
    consumer = interruptible(
        [*cmd, "consume", "pt", "-s", "s", "-n", "0", "-p", "Earliest", *remote]
    )
    try:
        produced = subprocess.run(
            [*cmd, "produce", "pt", "-m", "one,two", "-p", "k=v", *remote],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert produced.returncode == 0, produced.stderr
        lines = [consumer.stdout.readline().rstrip("\n") for _ in range(2)]
        assert [x.split("content:")[1] for x in lines] == ["one", "two"]
        assert all("properties:[k=v]" in x for x in lines)
        # The subscription is Exclusive and held: a second consumer is refused, in one line.
        code, out, err = run(capsys, "consume", "pt", "-s", "s", "--timeout", "0.2", *remote)
        assert code == 2 and out == [] and len(err) == 1 and "already has a consumer" in err[0], err
    finally:
        consumer.send_signal(signal.SIGINT)
        _, err = consumer.communicate(timeout=30)
    assert (
        consumer.returncode == 0
        and err.strip() == "pulsartxn consume: interrupted after 2 messages"
    )


def test_ctrl_c_ends_consume_on_the_embedded_default(tmp_path, capsys):
    """`consume` on the embedded broker (a data directory, no server) ends with exit 0 on
    SIGINT, its broker closed: the directory is free for the next command at once."""
    data = ["--data-dir", str(tmp_path / "data")]
    code, _, err = run(capsys, "produce", "et", "-m", "one,two", *data)
    assert code == 0, err
    cmd = [sys.executable, "-m", "pulsartxn"]
    consumer = interruptible([*cmd, "consume", "et", "-s", "s", "-n", "0", "-p", "Earliest", *data])
    try:
        lines = [consumer.stdout.readline().rstrip("\n") for _ in range(2)]
        assert [x.split("content:")[1] for x in lines] == ["one", "two"]
    finally:
        consumer.send_signal(signal.SIGINT)
        _, err = consumer.communicate(timeout=30)
    assert consumer.returncode == 0
    assert err.strip() == "pulsartxn consume: interrupted after 2 messages"
    code, _, err = run(capsys, "produce", "et", "-m", "three", *data)
    assert code == 0, err


@contextlib.contextmanager
def pausable_serve(tmp: Path):
    """(the `serve` process, its --url and --token-file flags, a list for the test's children)
    of a broker the test may pause (SIGSTOP). At the end it is resumed and stopped, and the
    children still running are killed."""
    (tmp / "token").write_text(TOKEN + "\n")
    server = serve(tmp)
    children: list[subprocess.Popen] = []
    try:
        yield server.proc, ["--url", server.url, "--token-file", str(tmp / "token")], children
    finally:
        server.proc.send_signal(signal.SIGCONT)
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
        server.stop()


def interrupted(proc: subprocess.Popen) -> tuple[str, str, float]:
    """SIGINT (Ctrl-C) to `proc`: its (stdout, stderr, seconds it took to end)."""
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    out, err = proc.communicate(timeout=25)
    return out, err, time.monotonic() - started


def test_ctrl_c_ends_consume_at_once_while_the_broker_does_not_answer(tmp_path):
    """A consume waiting on a broker that stopped answering (paused here) ends on SIGINT
    within the client's close bound, not after its call's operation timeout (30 s)."""
    cmd = [sys.executable, "-m", "pulsartxn"]
    with pausable_serve(tmp_path) as (broker, remote, children):
        consumer = interruptible(
            [*cmd, "consume", "t", "-s", "s", "-n", "0", "-p", "Earliest", *remote]
        )
        children.append(consumer)
        produced = subprocess.run(
            [*cmd, "produce", "t", "-m", "one", *remote], capture_output=True, timeout=60
        )
        assert produced.returncode == 0, produced.stderr
        assert consumer.stdout.readline().rstrip("\n").endswith("content:one")
        broker.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # the consumer's next receive is on the wire, unanswered
        _, err, took = interrupted(consumer)
    assert consumer.returncode == 0
    assert err.strip() == "pulsartxn consume: interrupted after 1 messages"
    assert took < 15, f"took {took:.1f} s"


@pytest.mark.parametrize("when", ["connecting", "sending"])
def test_ctrl_c_ends_produce_at_once_while_the_broker_does_not_answer(tmp_path, capsys, when):
    """A transactional produce whose broker stopped answering (paused here), while it
    connects or while it sends, ends on SIGINT within the client's close bound; nothing it
    sent is ever read."""
    cmd = [sys.executable, "-m", "pulsartxn"]
    with pausable_serve(tmp_path) as (broker, remote, children):
        if when == "connecting":
            broker.send_signal(signal.SIGSTOP)
        producer = interruptible(
            [*cmd, "produce", "t", "-m", "x", "-n", "50", "-r", "5", "--txn", *remote]
        )
        children.append(producer)
        wait_connected(producer, int(remote[1].rsplit(":", 1)[1]))
        if when == "sending":
            time.sleep(1.0)  # sending, at 5 a second
            broker.send_signal(signal.SIGSTOP)
            time.sleep(0.5)  # a send is on the wire, unanswered
        out, err, took = interrupted(producer)
        broker.send_signal(signal.SIGCONT)
        assert producer.returncode == 130 and out == ""
        assert err.strip() == "pulsartxn produce: interrupted"
        assert took < 15, f"took {took:.1f} s"
        assert consume_all(capsys, "t", "-s", "s", "-p", "Earliest", *remote) == []


@pytest.mark.parametrize("txn", [True, False], ids=["txn", "plain"])
def test_ctrl_c_ends_produce_on_the_embedded_default(tmp_path, capsys, txn):
    """`produce` on the embedded broker ends on SIGINT with exit 130, its broker closed: the
    directory is free for the next command at once. A transactional produce's open
    transaction is aborted by that close: nothing it sent is ever read. A plain one's sends
    made before the interrupt are stored: the close flushes them."""
    data = ["--data-dir", str(tmp_path / "data")]
    cmd = [sys.executable, "-m", "pulsartxn"]
    flags = ["--txn"] if txn else []
    producer = interruptible(
        [*cmd, "produce", "et", "-m", "x", "-n", "200", "-r", "20", *flags, *data]
    )
    try:
        wait_for(
            lambda: (tmp_path / "data" / "data.mdb").exists() and producer.poll() is None,
            timeout_s=60,
            what="the embedded broker",
        )
        time.sleep(1.5)  # sending, at 20 a second
    finally:
        out, err, took = interrupted(producer)
    assert producer.returncode == 130 and out == ""
    assert err.strip() == "pulsartxn produce: interrupted"
    assert took < 15, f"took {took:.1f} s"
    read = consume_all(capsys, "et", "-s", "s", "-p", "Earliest", *data)
    if txn:
        assert read == []
    else:
        assert 0 < len(read) < 200 and all(x.endswith("content:x") for x in read)


def test_version_agrees_with_pyproject(capsys):
    declared = re.search(r'(?m)^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text())
    assert pulsartxn.__version__ == declared.group(1)
    code, out, _ = run(capsys, "--version")
    assert (code, out) == (0, [f"pulsartxn {pulsartxn.__version__}"])
