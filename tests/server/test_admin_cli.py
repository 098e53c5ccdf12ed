"""``pulsartxn admin`` against one real ``pulsartxn serve`` process with tokens: JSON on
stdout, aligned tables, and one line on stderr with a non-zero exit for each way it fails."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

import pulsartxn
from pulsartxn import InitialPosition
from pulsartxn.cli import main
from tests.helpers import Server

FULL = "persistent://public/default/"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admin-cli")
    (tmp / "client.token").write_text("client-secret\n")
    (tmp / "admin.token").write_text("admin-secret\n")
    server = Server(
        tmp / "data",
        "--token-file",
        str(tmp / "client.token"),
        "--admin-token-file",
        str(tmp / "admin.token"),
    )
    server.start()
    server.tmp = tmp
    yield server
    server.stop()


@pytest.fixture
def run(srv, capsys):
    """`pulsartxn admin --url ... --token-file <admin token> ARGS`, in this process."""

    def run_(*argv, token="admin.token"):
        head = ["admin", "--url", srv.url, "--timeout", "2"]
        if token is not None:
            head += ["--token-file", str(srv.tmp / token)]
        try:
            rc = main([*head, *argv])
        except SystemExit as exc:  # argparse's refusals
            rc = exc.code
        out, err = capsys.readouterr()
        return rc, out, err

    return run_


@pytest.fixture
def client(srv):
    c = pulsartxn.Client(srv.url, token="admin-secret")
    yield c
    c.close()


def _json(result):
    rc, out, err = result
    assert (rc, err) == (0, "")
    return json.loads(out)


def test_topics_group(run):
    assert run("topics", "create", "cli-t", "--partitions", "2") == (0, "", "")
    assert run("topics", "create", "cli-plain") == (0, "", "")
    rows = _json(run("topics", "list"))
    assert {"topic": FULL + "cli-t", "partitions": 2} in rows
    assert {"topic": FULL + "cli-plain", "partitions": 0} in rows
    assert _json(run("topics", "list", "other/ns")) == []
    stats = _json(run("topics", "stats", "cli-t"))
    assert (stats["topic"], stats["partitions"], stats["messages"]) == (FULL + "cli-t", 2, 0)
    per = _json(run("topics", "partitioned-stats", "cli-t", "--per-partition"))
    assert sorted(per["per_partition"]) == [FULL + f"cli-t-partition-{i}" for i in range(2)]
    assert run("topics", "delete", "cli-plain") == (0, "", "")
    assert FULL + "cli-plain" not in [r["topic"] for r in _json(run("topics", "list"))]


def test_table_format(run):
    run("topics", "create", "cli-table-a")
    run("topics", "create", "cli-table-bb", "-p", "3")
    rc, out, err = run("--format", "table", "topics", "list")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITIONS"]
    column = lines[0].index("PARTITIONS")
    row = next(line for line in lines if "cli-table-bb" in line)
    assert row[column:].strip() == "3" and row[column - 2 : column] == "  "
    rc, out, _ = run("--format", "table", "topics", "stats", "cli-table-a")
    assert out.splitlines()[0].split() == ["KEY", "VALUE"]
    assert any(line.split()[:2] == ["partitions", "0"] for line in out.splitlines())


def test_subscriptions_group(run, client):
    producer = client.create_producer("cli-subs")
    for v in (b"a", b"b", b"c"):
        producer.send(v)
    producer.close()
    assert run("subscriptions", "create", "cli-subs", "-s", "s", "-m", "earliest")[0] == 0
    assert _json(run("subscriptions", "list", "cli-subs")) == ["s"]
    rows = _json(run("subscriptions", "peek", "cli-subs", "-s", "s", "-n", "2"))
    assert [base64.b64decode(r["payload"]) for r in rows] == [b"a", b"b"]
    assert _json(run("subscriptions", "skip", "cli-subs", "-s", "s", "-n", "2")) == {"skipped": 2}
    assert [r["payload"] for r in _json(run("subscriptions", "peek", "cli-subs", "-s", "s"))] == [
        base64.b64encode(b"c").decode()
    ]
    assert run("subscriptions", "reset-cursor", "cli-subs", "-s", "s", "-t", "1h")[0] == 0
    assert len(_json(run("subscriptions", "peek", "cli-subs", "-s", "s", "-n", "9"))) == 3
    mid = rows[1]["message_id"]
    assert run("subscriptions", "reset-cursor", "cli-subs", "-s", "s", "--messageId", mid)[0] == 0
    assert len(_json(run("subscriptions", "peek", "cli-subs", "-s", "s", "-n", "9"))) == 2
    assert run("subscriptions", "clear-backlog", "cli-subs", "-s", "s")[0] == 0
    assert _json(run("subscriptions", "peek", "cli-subs", "-s", "s", "-n", "9")) == []
    consumer = client.subscribe("cli-subs", "s", initial_position=InitialPosition.Earliest)
    rc, out, err = run("subscriptions", "delete", "cli-subs", "-s", "s")
    assert rc != 0 and out == "" and "consumers connected" in err and len(err.splitlines()) == 1
    assert run("subscriptions", "delete", "cli-subs", "-s", "s", "--force")[0] == 0
    assert _json(run("subscriptions", "list", "cli-subs")) == []
    with pytest.raises(pulsartxn.AlreadyClosed):
        consumer.receive(200)


def test_transactions_group(run, client):
    producer = client.create_producer("cli-txn")
    producer.send(b"plain")
    consumer = client.subscribe("cli-txn", "s", initial_position=InitialPosition.Earliest)
    txn = client.new_transaction()
    producer.send(b"in-txn", txn=txn)
    consumer.acknowledge(consumer.receive(5000), txn=txn)
    cid, seq = str(txn.id).split(":")
    ids = ["-m", cid, "-l", seq]
    meta = _json(run("transactions", "transaction-metadata", *ids))
    assert meta["state"] == "OPEN" and meta["txn_id"] == str(txn.id)
    again = _json(run("transactions", "transaction-metadata", "--txn-id", str(txn.id)))
    assert again["txn_id"] == str(txn.id)
    inbuf = _json(run("transactions", "transaction-in-buffer-stats", "-t", "cli-txn", *ids))
    assert (inbuf["state"], inbuf["start_position"]) == ("ongoing", 1)
    inack = _json(
        run("transactions", "transaction-in-pending-ack-stats", "-t", "cli-txn", "-s", "s", *ids)
    )
    assert inack["held_entries"] == 1
    slow = _json(run("transactions", "slow-transactions", "-t", "0s", "-c", cid))
    assert str(txn.id) in [r["txn_id"] for r in slow]
    assert (
        _json(run("transactions", "transaction-buffer-stats", "-t", "cli-txn"))["ongoing_txn_size"]
        == 1
    )
    assert (
        _json(run("transactions", "pending-ack-stats", "-t", "cli-txn", "-s", "s"))[
            "ongoing_txn_size"
        ]
        == 1
    )
    one = _json(run("transactions", "coordinator-stats", "-c", cid))
    assert one["active"] >= 1
    txn.abort()
    consumer.close()
    producer.close()
    assert run("transactions", "scale-coordinators", "-r", "17")[0] == 0
    assert len(_json(run("transactions", "coordinator-stats"))) == 17


@pytest.mark.parametrize(
    "argv, token, words",
    [
        (("topics", "stats", "no-such-topic"), "admin.token", "does not exist"),
        (("topics", "list"), "client.token", "admin token"),
        (("topics", "delete", "no-such-topic"), "admin.token", "does not exist"),
        (("subscriptions", "peek", "cli-none", "-s", "x", "-n", "0"), "admin.token", "count"),
        (("subscriptions", "reset-cursor", "t", "-s", "x"), "admin.token", "--time"),
        (("transactions", "transaction-metadata", "-m", "0"), "admin.token", "--least-sig-bits"),
        (("transactions", "slow-transactions", "-t", "soon"), "admin.token", "a time is"),
        (("topics", "list"), "missing.token", "No such file"),
        (("topics", "lst"), "admin.token", "invalid choice"),
        (("topics", "list", "--bogus"), "admin.token", "unrecognized arguments"),
    ],
)
def test_errors_are_one_line(run, argv, token, words):
    if argv[0] == "subscriptions" and argv[1] == "peek":
        run("topics", "create", "cli-none")
        run("subscriptions", "create", "cli-none", "-s", "x")
    rc, out, err = run(*argv, token=token)
    assert rc != 0 and out == ""
    assert len(err.splitlines()) == 1 and words in err, err
    assert err.startswith("pulsartxn")


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "2e9"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_one_line(srv, capsys, timeout):
    """It named operation_timeout_seconds, a keyword of Client(), not the flag given."""
    assert main(["admin", "--url", srv.url, "--timeout", timeout, "topics", "list"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "pulsartxn admin: --timeout must be a positive finite number of seconds, "
        f"not {float(timeout)}"
    ]


def test_the_command_itself(srv):
    """The installed entry point, end to end: a server that is down, and JSON that parses."""
    base = [sys.executable, "-m", "pulsartxn", "admin", "--timeout", "0.5"]
    down = subprocess.run(
        [*base, "--url", "pulsartxn://127.0.0.1:1", "topics", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode != 0 and down.stdout == ""
    assert "unreachable" in down.stderr and "Traceback" not in down.stderr
    assert len(down.stderr.splitlines()) == 1
    token = ["--token-file", str(srv.tmp / "admin.token")]
    ok = subprocess.run(
        [*base, "--url", srv.url, *token, "topics", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and isinstance(json.loads(ok.stdout), list)


def test_a_reader_that_goes_away_ends_it_quietly(srv, client):
    """`pulsartxn admin ... | head`: the rest of the output has nowhere to go; the command
    stops without a word on stderr (it said "[Errno 32] Broken pipe")."""
    client.create_producer("cli-pipe").send_batch([b"x" * 200] * 600)  # ~170 KB of JSON
    client.admin.create_subscription("cli-pipe", "pipe-sub", "earliest")
    cmd = [sys.executable, "-m", "pulsartxn", "admin", "--url", srv.url]
    cmd += ["--token-file", str(srv.tmp / "admin.token"), "subscriptions", "peek", "cli-pipe"]
    proc = subprocess.Popen(
        [*cmd, "-s", "pipe-sub", "-n", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(60) == 1
    assert err == ""
