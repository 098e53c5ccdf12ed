"""The cluster's metadata on a real ZooKeeper (the system package) on 127.0.0.1: live brokers,
sticky ownership of bundles and coordinators, kills and a ZooKeeper restart."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from pulsartxn.cluster import ClusterMetadata, LocalZooKeeper, parse_cluster_url
from pulsartxn.errors import BrokerUnavailable, InvalidConfiguration, TopicAlreadyExists
from tests.helpers import LosingProxy, in_thread, racing, the_one_winner


@pytest.fixture
def url(zookeeper):
    """A cluster root of its own for each test."""
    return f"zk://{zookeeper.address}/t-{uuid.uuid4().hex[:8]}"


def _until(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)


def test_cluster_urls():
    assert parse_cluster_url("zk://127.0.0.1:2181/pulsartxn") == ("127.0.0.1:2181", "/pulsartxn")
    assert parse_cluster_url("zk://a:1,b:2/x/y") == ("a:1,b:2", "/x/y")
    for bad in ("127.0.0.1:2181/x", "zk://127.0.0.1:2181", "zk://h/x", "zk://h:1/", 7):
        with pytest.raises(InvalidConfiguration):
            parse_cluster_url(bad)
    with pytest.raises(InvalidConfiguration):
        parse_cluster_url("zk://h:1/a b")


def test_a_broker_is_live_while_its_session_lasts(url):
    with ClusterMetadata(url) as watcher:
        broker = ClusterMetadata(url).start()
        broker.register("b1", "127.0.0.1:7001")
        # Read through a watch: a change shows once its event has come.
        _until(lambda: watcher.live_brokers() == {"b1": "127.0.0.1:7001"}, 5, "b1 live")
        broker.close()
        _until(lambda: watcher.live_brokers() == {}, 5, "b1 gone")


REGISTER = r"""
import sys, time
from pulsartxn.cluster import ClusterMetadata
m = ClusterMetadata(sys.argv[1], session_timeout_s=1.0).start()
m.register(sys.argv[2], "127.0.0.1:7002")
print("up", flush=True)
time.sleep(600)
"""


def test_a_killed_broker_leaves_within_its_session_timeout(url):
    proc = subprocess.Popen(
        [sys.executable, "-c", REGISTER, url, "b2"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "up"
        # A short session: a registration waits out 3 of them for a killed holder's node.
        with ClusterMetadata(url, session_timeout_s=1.0) as watcher:
            _until(lambda: "b2" in watcher.live_brokers(), 5, "b2 live")
            # A second live process cannot take the same broker id.
            with pytest.raises(InvalidConfiguration, match="already registered"):
                watcher.register("b2", "127.0.0.1:7003")
            proc.kill()
            proc.wait(10)
            killed = time.monotonic()
            _until(lambda: "b2" not in watcher.live_brokers(), 10, "the killed broker gone")
            assert time.monotonic() - killed < 5.0
    finally:
        proc.kill()
        proc.wait(10)


def test_new_bundles_go_to_the_least_loaded_live_broker_and_stick(url):
    b1, b2 = ClusterMetadata(url).start(), ClusterMetadata(url).start()
    b1.register("b1", "127.0.0.1:7001")
    b2.register("b2", "127.0.0.1:7002")
    owners = [b1.claim("bundle", f"0x{i:08x}") for i in range(4)]
    assert sorted(owners) == ["b1", "b1", "b2", "b2"]
    mine = b2.owned("bundle")["b2"]
    b2.close()  # b2 is down: its bundles wait for it (their data lives there)
    with ClusterMetadata(url) as client:
        with pytest.raises(BrokerUnavailable, match="b2"):
            client.lookup("bundle", mine[0])
        assert client.owner("bundle", mine[0]) == "b2"
        assert client.lookup("bundle", "0xffffffff") == ("b1", "127.0.0.1:7001")  # new: b1
        back = ClusterMetadata(url).start()
        back.register("b2", "127.0.0.1:7012")  # b2 returns, at a new address
        assert client.lookup("bundle", mine[0]) == ("b2", "127.0.0.1:7012")
        back.close()
    b1.close()


def test_concurrent_claims_agree_on_one_owner(url):
    brokers = [ClusterMetadata(url).start() for _ in range(3)]
    for i, b in enumerate(brokers):
        b.register(f"b{i}", f"127.0.0.1:70{i:02d}")
    results: list[dict] = [{} for _ in brokers]

    def claim_all(i: int) -> None:
        for n in range(30):
            results[i][n] = brokers[i].claim("coordinator", str(n))

    threads = [threading.Thread(target=claim_all, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results[0] == results[1] == results[2]
    counts = sorted(len(v) for v in brokers[0].owned("coordinator").values())
    assert sum(counts) == 30 and counts[-1] - counts[0] <= 30  # every one owned exactly once
    for b in brokers:
        b.close()


def test_bad_names_are_refused_and_change_nothing(url):
    with ClusterMetadata(url) as m:
        m.register("b1", "127.0.0.1:7001")
        bad = (("bundle", "a/b"), ("bundle", ""), ("topic", "x"), ("bundle", "x" * 201))
        for kind, ident in bad:
            with pytest.raises(InvalidConfiguration):
                m.claim(kind, ident)
        with pytest.raises(InvalidConfiguration):
            m.register("../b", "127.0.0.1:1")
        assert m.owned("bundle") == {} and list(m.live_brokers()) == ["b1"]


def test_no_zookeeper_is_a_clear_error():
    m = ClusterMetadata("zk://127.0.0.1:9/x")
    with pytest.raises(BrokerUnavailable, match="ZooKeeper did not answer"):
        m.start(timeout_s=1.0)


def test_a_restarted_zookeeper_keeps_owners_and_brokers_register_again(tmp_path):
    zk = LocalZooKeeper(tmp_path / "zk").start()
    url = f"zk://{zk.address}/c"
    broker = ClusterMetadata(url, session_timeout_s=1.0).start()
    try:
        broker.register("b1", "127.0.0.1:7001")
        assert broker.claim("bundle", "0x00000000") == "b1"
        zk.stop(kill=True)
        time.sleep(2.0)  # longer than the session: the server expires it when it is back
        zk.start()
        with ClusterMetadata(url) as watcher:
            _until(lambda: "b1" in watcher.live_brokers(), 30, "b1 registered again")
            assert watcher.owner("bundle", "0x00000000") == "b1"
            assert watcher.lookup("bundle", "0x00000000") == ("b1", "127.0.0.1:7001")
    finally:
        broker.close()
        zk.stop()


def test_a_call_during_an_outage_waits_for_zookeeper_within_the_session_timeout(tmp_path):
    """A broker's metadata call while ZooKeeper is away (kazoo refuses it at once) waits for
    the connection to come back, up to the session timeout, instead of failing a request
    that arrived in the gap; past it, a clear BrokerUnavailable."""
    zk = LocalZooKeeper(tmp_path / "zk").start()
    url = f"zk://{zk.address}/c"
    broker = ClusterMetadata(url, session_timeout_s=10.0).start()
    try:
        broker.register("b1", "127.0.0.1:7001")
        zk.stop(kill=True)
        got: list = []
        call = threading.Thread(target=lambda: got.append(broker.claim("bundle", "0x00000001")))
        call.start()
        time.sleep(1.0)
        assert call.is_alive() and got == []  # waiting, not refused
        zk.start()
        call.join(30)
        assert got == ["b1"]
        assert broker.lookup("bundle", "0x00000001") == ("b1", "127.0.0.1:7001")
    finally:
        broker.close()
        zk.stop()
    short = ClusterMetadata(url, session_timeout_s=1.0)
    zk.start()
    short.start()
    try:
        zk.stop(kill=True)
        start = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="ZooKeeper.* within 1 s"):
            short.owner("bundle", "0x00000002")
        assert 1.0 <= time.monotonic() - start < 10
    finally:
        short.close()


def test_a_broker_whose_session_expired_registers_again(url):
    """A broker paused past its session (a long GC pause, a stopped VM) loses its ephemeral
    node; once it runs again it registers again under a new session."""
    proc = subprocess.Popen(
        [sys.executable, "-c", REGISTER, url, "b3"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "up"
        # A short session: a registration waits out 3 of them for a killed holder's node.
        with ClusterMetadata(url, session_timeout_s=1.0) as watcher:
            _, before = watcher._zk.get(f"{watcher.root}/brokers/b3")
            proc.send_signal(signal.SIGSTOP)
            _until(lambda: "b3" not in watcher.live_brokers(), 10, "the paused broker expired")
            proc.send_signal(signal.SIGCONT)
            _until(lambda: "b3" in watcher.live_brokers(), 20, "b3 registered again")
            _, after = watcher._zk.get(f"{watcher.root}/brokers/b3")
            assert after.ephemeralOwner != before.ephemeralOwner  # a new session
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)


def test_a_create_whose_answer_was_lost_is_not_refused_by_its_own_retry(zookeeper):
    """ZooKeeper records a topic and the answer is lost with the connection: the call made
    again after the reconnection finds the node its first attempt wrote and succeeds; a
    create of another caller is still TopicAlreadyExists."""
    host, port = zookeeper.address.split(":")
    proxy = LosingProxy((host, int(port)))
    root = f"t-{uuid.uuid4().hex[:8]}"
    topic = "persistent://public/default/lost-answer"
    with (
        ClusterMetadata(f"zk://127.0.0.1:{proxy.port}/{root}") as via_proxy,
        ClusterMetadata(f"zk://{zookeeper.address}/{root}") as direct,
    ):
        proxy.hold_answers()
        call, got = in_thread(lambda: via_proxy.create_topic(topic, 3))
        _until(lambda: direct.topic(topic) == 3, 10, "ZooKeeper recorded the topic")
        assert got == []  # its answer is held back
        proxy.cut()
        call.join(30)
        assert got == [None]  # created
        assert via_proxy.topic(topic) == 3
        with pytest.raises(TopicAlreadyExists):
            direct.create_topic(topic, 3)
        with pytest.raises(TopicAlreadyExists):
            via_proxy.create_topic(topic, 3)  # a new call of its own: the topic exists
    proxy.close()


def test_a_topic_recorded_before_create_ids_still_reads(url):
    """A cluster's topic nodes written before create ids hold a bare count: they read as
    that count, and a create of such a topic is TopicAlreadyExists (no id matches)."""
    topic = "persistent://public/default/old-style"
    with ClusterMetadata(url) as meta:
        meta._zk.create(meta._topic_path(topic), b"3", makepath=True)
        assert meta.topic(topic) == 3
        with pytest.raises(TopicAlreadyExists):
            meta.create_topic(topic, 3)
        meta.create_topic("persistent://public/default/new-style", 2, "call-1")
        data, _ = meta._zk.get(meta._topic_path("persistent://public/default/new-style"))
        assert json.loads(data) == {"partitions": 2, "create_id": "call-1"}
        meta.create_topic("persistent://public/default/new-style", 2, "call-1")  # its retry


def test_creates_racing_under_different_ids_make_one_topic(url):
    """Three brokers' metadata sessions create one topic at once, each under its own id:
    ZooKeeper keeps one node, exactly one create succeeds, and only that call made again
    finds the topic as its own."""
    metas = [ClusterMetadata(url).start() for _ in range(3)]
    try:
        for round_ in range(10):
            topic = f"persistent://public/default/race-{round_}"
            outcomes = racing(3, lambda i, t=topic: metas[i].create_topic(t, 2, f"call-{i}"))
            winner = the_one_winner(outcomes, TopicAlreadyExists)
            metas[(winner + 1) % 3].create_topic(topic, 2, f"call-{winner}")  # its id, anywhere
            for loser in set(range(3)) - {winner}:
                with pytest.raises(TopicAlreadyExists):
                    metas[loser].create_topic(topic, 2, f"call-{loser}")
            assert all(m.topic(topic) == 2 for m in metas)
    finally:
        for m in metas:
            m.close()
