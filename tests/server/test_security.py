"""Who may do what over the network: client and admin tokens, TLS, a server off loopback
without a token, Flight calls the service does not offer, and the command line's errors.
Real `pulsartxn serve` processes on 127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pyarrow.flight as flight
import pytest

import pulsartxn
from pulsartxn.errors import NotAuthorized


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def tokens(tmp_path):
    return (
        _write(tmp_path / "client.token", "client-secret\n"),
        _write(tmp_path / "admin.token", "admin-secret\n"),
    )


def test_admin_calls_need_the_admin_token(server, tokens):
    client_file, admin_file = tokens
    s = server("--token-file", client_file, "--admin-token-file", admin_file)
    with pytest.raises(NotAuthorized):
        pulsartxn.Client(s.url)  # no token at all
    with pytest.raises(NotAuthorized):
        pulsartxn.Client(s.url, token="wrong")
    user = pulsartxn.Client(s.url, token="client-secret")
    user.create_producer("t").send(b"m")
    txn = user.new_transaction()
    for call in (
        lambda: user.admin.coordinators(),
        lambda: user.admin.slow_transactions(0),  # other sessions' transactions: admins only
        lambda: user.admin.scale_coordinators(40),
    ):
        with pytest.raises(NotAuthorized, match="admin token"):
            call()
    admin = pulsartxn.Client(s.url, token="admin-secret")
    assert len(admin.admin.coordinators()) == 16  # the refused scale saved nothing
    assert [t["txn_id"] for t in admin.admin.slow_transactions(0)] == [str(txn.id)]
    admin.create_producer("t").send(b"admin may produce too")
    txn.commit()
    user.close()
    admin.close()


def test_with_a_client_token_only_no_one_makes_admin_calls(server, tokens):
    s = server("--token-file", tokens[0])
    user = pulsartxn.Client(s.url, token="client-secret")
    with pytest.raises(NotAuthorized):
        user.admin.topic_stats("t")
    user.close()


def test_off_loopback_a_server_without_a_token_is_refused_in_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "pulsartxn", "serve", "--data-dir", str(tmp_path / "d")]
        + ["--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "--insecure" in lines[0] and "--token-file" in lines[0]
    assert not (tmp_path / "d").exists()  # refused before anything was made


def test_the_command_line_reports_errors_in_one_line(server, tmp_path):
    s = server()
    cases = [
        ["--port", "abc"],  # a bad option
        ["--nope"],
        ["--data-dir", str(tmp_path / "other"), "--port", str(s.port)],  # a busy port
        ["--data-dir", s.data_dir, "--port", "0"],  # a locked data directory
        ["--data-dir", str(tmp_path / "x"), "--tls-cert", "c.pem"],  # half of TLS
    ]
    for args in cases:
        run = subprocess.run(
            [sys.executable, "-m", "pulsartxn", "serve", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1, (args, run.stderr)
        assert "Traceback" not in run.stderr


def test_the_log_never_shows_a_session_id(server):
    """A session id is what a call presents to act as that client: the log must not leak it
    (it did, on every expiry)."""
    import time

    s = server("--session-timeout-s", "1")
    a, b = pulsartxn.Client(s.url), pulsartxn.Client(s.url)
    a.create_producer("t").send(b"m")
    sids = [a._session, b._session]
    a._stop.set()  # a goes silent: its session expires
    time.sleep(2.0)
    b.close()
    s.stop()
    log = s.log()
    assert "a session expired" in log
    # The open door is named by the port it is really on (it said :0 for --port 0).
    assert f"reaches 127.0.0.1:{s.port}\n" in log
    assert not [sid for sid in sids if sid in log]


def test_flight_calls_the_service_does_not_offer_answer_a_clean_error(server):
    s = server()
    raw = flight.FlightClient(f"grpc://127.0.0.1:{s.port}")
    descriptor = flight.FlightDescriptor.for_command(b"x")
    calls = (
        lambda: list(raw.list_flights()),
        lambda: raw.get_flight_info(descriptor),
        lambda: raw.do_exchange(descriptor)[1].read_chunk(),
        lambda: list(raw.do_action(flight.Action("no-such-call", b""))),
    )
    for call in calls:
        with pytest.raises(flight.FlightError) as caught:
            call()
        assert "Traceback" not in str(caught.value) and 'File "' not in str(caught.value)
    assert "value" in raw.get_schema(descriptor).schema.names  # a scan's: no error to raise
    raw.close()
    pulsartxn.Client(s.url).close()  # still serving


def _certificate(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def test_tls(server, tmp_path, tokens):
    cert, key = _certificate(tmp_path)
    s = server("--tls-cert", cert, "--tls-key", key, "--token-file", tokens[0])
    url = f"pulsartxn+ssl://127.0.0.1:{s.port}"
    client = pulsartxn.Client(url, token="client-secret", tls_trust_certs_file_path=cert)
    producer = client.create_producer("t")
    with client.new_transaction() as txn:
        producer.send_batch([b"a", b"b"], txn=txn)
    values = [v for b in client.scan("t") for v in b.column("value").to_pylist()]
    assert values == [b"a", b"b"]
    client.close()
    with pytest.raises(pulsartxn.PulsarTxnError):  # plain text to a TLS port
        pulsartxn.Client(s.url, token="client-secret", reconnect_timeout_s=1)
    with pytest.raises(ValueError, match="pulsartxn\\+ssl"):
        pulsartxn.Client(s.url, tls_trust_certs_file_path=cert)


def test_a_receive_for_ever_is_asked_again_past_the_servers_wait(server):
    """The server waits at most --max-wait-ms for a call (a receive for ever would hold one
    of its threads for ever); the client's receive(None) asks again until a message comes."""
    import threading
    import time

    s = server("--max-wait-ms", "100")
    client = pulsartxn.Client(s.url)
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    got = []
    waiter = threading.Thread(target=lambda: got.append(consumer.receive()), daemon=True)
    waiter.start()
    time.sleep(0.5)  # several of the server's waits have ended meanwhile
    assert waiter.is_alive() and not got
    client.create_producer("t").send(b"late")
    waiter.join(10)
    assert [m.data() for m in got] == [b"late"]
    with pytest.raises(pulsartxn.Timeout):
        consumer.receive(300)  # a wait of our own still ends when it says
    client.close()


def test_a_transaction_belongs_to_whoever_opened_it(server, tokens):
    """Another session (with the client token) may not commit, abort, send or ack in a
    transaction, or decide or join its group, without the transaction's (or the group's)
    capability, which its opener holds; with it, it may (the Spark path hands it on)."""
    s = server("--token-file", tokens[0], "--admin-token-file", tokens[1])
    a = pulsartxn.Client(s.url, token="client-secret")
    b = pulsartxn.Client(s.url, token="client-secret")
    a.create_producer("in").send(b"input")
    txn = a.new_transaction()
    grouped = a.new_transaction(group="a-job")
    a.create_producer("t").send(b"mine", txn=txn)
    stranger = b.transaction(txn.id)  # its state can be read: nothing more
    assert stranger.state is pulsartxn.TxnState.OPEN
    consumer = b.subscribe("in", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    msg = consumer.receive(5000)
    for call in (
        lambda: stranger.commit(),
        lambda: stranger.abort(),
        lambda: b.create_producer("t").send(b"theirs", txn=stranger),
        lambda: consumer.acknowledge(msg, txn=stranger),
        lambda: b.commit_all([txn.id]),
        lambda: b.abort_group("a-job"),
        lambda: b.commit_group("a-job", [grouped.id]),
        lambda: b.new_transaction(group="a-job"),  # joining it
        lambda: b.group_capability("a-job"),
    ):
        with pytest.raises(NotAuthorized, match="another session"):
            call()
    assert txn.state is pulsartxn.TxnState.OPEN and grouped.state is pulsartxn.TxnState.OPEN
    # Handed on with its capability (as a Spark task hands its TxnID to the driver):
    handed = b.transaction(txn.id, capability=txn.capability)
    b.create_producer("t").send(b"theirs", txn=handed)
    handed.commit()
    cap = a.group_capability("a-job")
    joined = b.new_transaction(group="a-job", group_capability=cap)
    assert b.commit_group("a-job", [joined.id])["aborted"] == [grouped.id]
    values = sorted(v for batch in a.scan("t") for v in batch.column("value").to_pylist())
    assert values == [b"mine", b"theirs"]
    with pytest.raises(NotAuthorized):  # a made-up capability is refused
        b.transaction(a.new_transaction().id, capability="0" * 32).abort()
    a.close()
    b.close()


def test_a_capability_outlives_a_server_restart(server, tokens):
    """The server's key for capabilities is kept in its data directory: a capability given
    before a kill -9 still lets another session end the transaction after the restart."""
    s = server("--token-file", tokens[0])
    a = pulsartxn.Client(s.url, token="client-secret")
    txn = a.new_transaction(timeout_ms=600_000)
    a.create_producer("t").send(b"kept", txn=txn)
    capability = txn.capability
    a._stop.set()  # gone without a word
    s.kill9()
    s.start()
    b = pulsartxn.Client(s.url, token="client-secret")
    with pytest.raises(NotAuthorized):
        b.transaction(txn.id).commit()
    b.transaction(txn.id, capability=capability).commit()
    assert [v for x in b.scan("t") for v in x.column("value").to_pylist()] == [b"kept"]
    b.close()


def test_a_session_holds_at_most_its_limits(server):
    """Past its limits a session gets QuotaExceeded (nothing taken from the others): its
    consumers, producers, open transactions and receives waiting on the server."""
    import threading
    import time

    s = server(
        "--session-max-consumers",
        "3",
        "--session-max-producers",
        "2",
        "--session-max-transactions",
        "3",
        "--session-max-waiting-receives",
        "2",
    )
    a = pulsartxn.Client(s.url)
    c0, c1, c2 = (
        a.subscribe("t", f"s{i}", initial_position=pulsartxn.InitialPosition.Earliest)
        for i in range(3)
    )
    with pytest.raises(pulsartxn.QuotaExceeded, match="3 consumers"):
        a.subscribe("t", "s3", initial_position=pulsartxn.InitialPosition.Earliest)
    producer = a.create_producer("t")
    a.create_producer("t")
    with pytest.raises(pulsartxn.QuotaExceeded, match="2 producers"):
        a.create_producer("t")
    txns = [a.new_transaction() for _ in range(3)]
    with pytest.raises(pulsartxn.QuotaExceeded, match="3 open transactions"):
        a.new_transaction()
    txns[0].abort()
    a.new_transaction().abort()  # room again once one has ended
    got = []
    parked = [
        threading.Thread(target=lambda c=c: got.append(c.receive()), daemon=True) for c in (c0, c1)
    ]
    for t in parked:
        t.start()
    time.sleep(0.5)  # both parked on the server
    with pytest.raises(pulsartxn.QuotaExceeded, match="receives waiting"):
        c2.receive(100)
    producer.send(b"wake")  # each subscription has it: the parked receives end
    for t in parked:
        t.join(10)
    assert [m.data() for m in got] == [b"wake", b"wake"]
    assert c2.receive(2000).data() == b"wake"
    b = pulsartxn.Client(s.url)  # another session is not charged for a's
    b.subscribe("t", "other", initial_position=pulsartxn.InitialPosition.Earliest)
    b.create_producer("t")
    b.new_transaction().abort()
    a.close()
    b.close()


def test_a_session_holds_at_most_its_streams_open(server):
    """Each bulk stream (a batch_stream or send_batch's DoPut, a scan's DoGet) holds a server
    thread for as long as its client keeps it open: past the session's limit, QuotaExceeded,
    and nothing of the refused stream is stored."""
    import time

    import pyarrow as pa

    s = server("--session-max-streams", "2")
    a = pulsartxn.Client(s.url)
    producer = a.create_producer("t")
    held = [producer.batch_stream() for _ in range(2)]
    for stream in held:
        stream.write(pa.array([b"held"], pa.binary()))
    # Both are open on the server once it has stored their batches (a unary call sees it;
    # a scan as the probe could take a slot before a stream's call arrived, and refuse it).
    deadline = time.monotonic() + 10
    while a.admin.topic_stats("t")["messages"] < 2:
        assert time.monotonic() < deadline, "the server never stored the streams' batches"
        time.sleep(0.05)
    with pytest.raises(pulsartxn.QuotaExceeded, match="2 streams open at once"):
        list(a.scan("t"))
    with pytest.raises(pulsartxn.QuotaExceeded, match="streams open at once"):
        with producer.batch_stream() as third:
            third.write(pa.array([b"refused"], pa.binary()))
    with pytest.raises(pulsartxn.QuotaExceeded, match="streams open at once"):
        producer.send_batch([b"refused"])
    b = pulsartxn.Client(s.url)  # another session is not charged for a's
    b.create_producer("t").send_batch([b"other"])

    def values() -> list:
        return sorted(v for x in a.scan("t") for v in x.column("value").to_pylist())

    assert held[0].close() == 1  # a stream closed gives its slot back: a scan goes through
    assert values() == [b"held", b"held", b"other"]  # stored as they came; none refused
    assert held[1].close() == 1
    producer.send_batch([b"again"])
    assert values() == [b"again", b"held", b"held", b"other"]
    a.close()
    b.close()


def test_a_scan_gives_its_stream_slot_back_however_it_ends():
    """The server's scan stream releases its slot once: read to the end, failed, or dropped
    unread (a client that cancels before reading)."""
    from pulsartxn.server.streams import _Releasing

    def failing():
        yield 1
        raise OSError("disk")

    for batches, reads in (([1, 2], 3), (failing(), 2), ([1, 2], 0)):
        released = []
        stream = _Releasing(batches, lambda released=released: released.append(1))
        for _ in range(reads):
            try:
                next(stream)
            except (StopIteration, OSError):
                pass
        if reads == 0:
            assert released == []
            del stream
        assert released == [1], (batches, reads)


def test_claimed_group_labels_take_bounded_memory(tmp_path, monkeypatch):
    """A client claiming label after label: the server keeps the newest RESERVED_LABELS
    claims (the oldest one can then be claimed again while it has no live member, and its
    first holder keeps its capability), and each session the labels it used last."""
    from pulsartxn.server import sessions
    from pulsartxn.server.service import BrokerServer

    monkeypatch.setattr(sessions, "RESERVED_LABELS", 3)
    monkeypatch.setattr(sessions, "SESSION_LABELS", 2)
    broker = pulsartxn.Broker(tmp_path / "data", sync=False)
    server = BrokerServer(broker, "127.0.0.1", 0, token="secret")
    url = f"pulsartxn://127.0.0.1:{server.port}"
    a, b = pulsartxn.Client(url, token="secret"), pulsartxn.Client(url, token="secret")
    try:
        caps = {label: a.group_capability(label) for label in ("j0", "j1", "j2", "j3")}
        assert list(server.sessions._reserved) == ["j1", "j2", "j3"]
        session = server.sessions._sessions[a._session]
        assert list(session.groups) == ["j2", "j3"]
        with pytest.raises(NotAuthorized):
            b.group_capability("j1")  # still claimed by a
        # j0's claim is forgotten: another session takes it, as it has no live member ...
        assert b.group_capability("j0") == caps["j0"]
        # ... and a, which the server no longer lists for it, presents its capability.
        t = a.new_transaction(group="j0")
        assert "j0" in session.groups
        assert a.commit_group("j0", [t.id])["committed"] == [t.id]
        # A label with a live member is never claimed, forgotten or not.
        live = a.new_transaction(group="j1")
        for label in ("j4", "j5", "j6"):
            a.group_capability(label)
        assert "j1" not in server.sessions._reserved
        with pytest.raises(NotAuthorized):
            b.group_capability("j1")
        live.abort()
    finally:
        a.close()
        b.close()
        server.shutdown_sessions()
        server.shutdown()
        broker.close()


def test_a_remote_subscribe_past_the_subscription_quota_is_refused(tmp_path):
    """max_subscriptions_per_topic over the network: QuotaExceeded, typed, nothing made."""
    from pulsartxn.server.service import BrokerServer

    broker = pulsartxn.Broker(tmp_path / "data", sync=False, max_subscriptions_per_topic=2)
    server = BrokerServer(broker, "127.0.0.1", 0)
    client = pulsartxn.Client(f"pulsartxn://127.0.0.1:{server.port}")
    try:
        for name in ("s1", "s2"):
            client.subscribe("t", name).close()
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_subscriptions_per_topic=2"):
            client.subscribe("t", "s3")
        client.subscribe("t", "s1").close()  # one that exists is taken
        assert client.admin.list_subscriptions("t") == ["s1", "s2"]
    finally:
        client.close()
        server.shutdown_sessions()
        server.shutdown()
        broker.close()


def test_a_server_holds_at_most_max_sessions(server):
    s = server("--max-sessions", "2")
    a, b = pulsartxn.Client(s.url), pulsartxn.Client(s.url)
    with pytest.raises(pulsartxn.QuotaExceeded, match="2 sessions"):
        pulsartxn.Client(s.url)
    b.close()
    c = pulsartxn.Client(s.url)  # room again once one has left
    c.create_producer("t").send(b"m")
    a.close()
    c.close()


def test_a_batch_receive_streams_in_batches_of_bounded_size(server):
    """Dispatch over the network is a stream of record batches of about 4 MiB of payload
    each, not one of everything the call returns."""
    s = server()
    client = pulsartxn.Client(s.url)
    big = [bytes([i]) * (1 << 20) for i in range(12)]
    client.create_producer("t").send_batch(big)
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    raw = flight.FlightClient(f"grpc://127.0.0.1:{s.port}")
    from pulsartxn.server.protocol import frame

    ticket = frame(
        {
            "op": "receive",
            "handle": consumer._ensure(),
            "max_num_messages": 100,
            "timeout_millis": 2000,
            "session": client._session,
        }
    )
    batches = [chunk.data for chunk in raw.do_get(flight.Ticket(ticket))]
    assert sum(b.num_rows for b in batches) == 12 and len(batches) >= 3
    assert all(sum(len(v) for v in b.column("value").to_pylist()) <= 5 << 20 for b in batches)
    raw.close()
    client.close()
