"""Brokers of a cluster, at the protocol's level: a real ZooKeeper, real broker processes on
127.0.0.1, and one plain remote client per broker (the cluster client is tested on its own).
A transaction opened at its coordinator's broker is used at each partition's owner with its
capability, and ended at the coordinator: the seeds' distributed end, with kills."""

from __future__ import annotations

import threading
import time

import pytest

import pulsartxn
from pulsartxn.errors import (
    CoordinatorNotFound,
    InvalidTxnStatus,
    NotOwner,
    PulsarTxnError,
    TopicAlreadyExists,
)
from pulsartxn.remote import RemoteClient
from pulsartxn.torture_cluster import PerBroker


class Brokers(PerBroker):
    """A plain remote client per broker of `cluster`, and what they look up."""

    def __init__(self, cluster, reconnect_timeout_s: float = 60.0) -> None:
        super().__init__(cluster.addresses, reconnect_timeout_s)
        self.cluster = cluster

    @property
    def any(self) -> RemoteClient:
        return self.at(self.cluster.addresses[0])

    def transaction(self, coordinator_id: int = 0, **kwargs):
        """A transaction at its coordinator's broker: (handle, that broker's address)."""
        address = self.owner("coordinator", coordinator_id)
        return self.at(address).new_transaction(coordinator_id=coordinator_id, **kwargs), address


@pytest.fixture
def three(local_cluster):
    cluster = local_cluster(3, num_coordinators=3)
    brokers = Brokers(cluster)
    yield cluster, brokers
    brokers.close()


def _spread(brokers: Brokers, topic: str, n: int) -> dict[str, str]:
    brokers.any.create_topic(topic, n)
    parts = brokers.any.topic_partitions(topic)
    return {p: brokers.owner("partition", p) for p in parts}


def _drain(consumer, wait_ms: int = 300) -> list[bytes]:
    out = []
    while True:
        try:
            msg = consumer.receive(wait_ms)
        except pulsartxn.Timeout:
            return out
        out.append(msg.value())
        consumer.acknowledge(msg)


def test_lookups_ownership_and_topics(three):
    cluster, brokers = three
    info = brokers.any._json("cluster_info", {})
    assert info["cluster"] is True and info["coordinators"] == 3
    assert sorted(info["brokers"].values()) == sorted(cluster.addresses)
    owners = _spread(brokers, "spread", 6)
    assert set(owners.values()) == set(cluster.addresses)  # least loaded: all three
    # Any broker answers the cluster's topics; an owner sticks.
    for address in cluster.addresses:
        assert brokers.at(address).topic_partitions("spread") == list(owners)
        with pytest.raises(TopicAlreadyExists):
            brokers.at(address).create_topic("spread", 2)
    assert {p: brokers.owner("partition", p) for p in owners} == owners
    # A broker that does not own a partition says so (the client looks it up again).
    part, owner = next(iter(owners.items()))
    other = next(a for a in cluster.addresses if a != owner)
    with pytest.raises(NotOwner):
        brokers.at(other).create_producer(part)
    with pytest.raises(NotOwner):
        brokers.at(other).subscribe(part, "s", initial_position=pulsartxn.InitialPosition.Earliest)
    with pytest.raises(NotOwner):  # a partition's figures are its owner's alone
        brokers.at(other).admin.topic_stats(part)
    assert brokers.at(owner).admin.topic_stats(part)["topic"] == part
    with pytest.raises(CoordinatorNotFound):
        brokers.owner("coordinator", 3)
    coordinator = brokers.owner("coordinator", 1)
    elsewhere = next(a for a in cluster.addresses if a != coordinator)
    with pytest.raises(NotOwner):
        brokers.at(elsewhere).new_transaction(coordinator_id=1)
    # Who owns what, from any broker.
    view = brokers.at(elsewhere).admin.cluster()
    assert sorted(b["address"] for b in view["brokers"].values()) == sorted(cluster.addresses)
    assert sum(len(ids) for ids in view["coordinators"].values()) >= 1


def test_a_transaction_across_three_brokers_commits_and_aborts_atomically(three):
    cluster, brokers = three
    owners = _spread(brokers, "atomic", 6)
    consumers = {
        p: brokers.at(a).subscribe(p, "s", initial_position=pulsartxn.InitialPosition.Earliest)
        for p, a in owners.items()
    }
    producers = {p: brokers.at(a).create_producer(p) for p, a in owners.items()}

    def send_all(txn, tag: str) -> None:
        for p, a in owners.items():
            producers[p].send(f"{tag}:{p}".encode(), txn=brokers.handle(txn, a))

    txn, home = brokers.transaction(0)
    send_all(txn, "c")
    assert all(_drain(c, 100) == [] for c in consumers.values())  # nothing before the commit
    txn.commit()
    assert txn.state is pulsartxn.TxnState.COMMITTED
    for p, c in consumers.items():
        assert _drain(c) == [f"c:{p}".encode()]
    # A late send of the committed transaction is refused at every participant broker: its
    # coordinator is the authority, not the participant's memory.
    for p, a in owners.items():
        with pytest.raises(InvalidTxnStatus):
            producers[p].send(b"late", txn=brokers.handle(txn, a))
    aborted, _ = brokers.transaction(1)
    send_all(aborted, "a")
    aborted.abort()
    for p in owners:
        producers[p].send(b"plain")
    for c in consumers.values():
        assert _drain(c) == [b"plain"]  # the aborted ones are never delivered


def test_a_participant_killed_during_the_commit_gets_its_part_when_it_returns(three):
    """kill -9 a participant broker holding the transaction's messages, then commit: the
    decision is made (its messages were durable when answered), the others have their
    part, and the killed one gets its part once it is back (COMMITTING until then): nothing
    lost or twice, readers there held back only meanwhile."""
    cluster, brokers = three
    owners = _spread(brokers, "waited", 6)
    txn, home = brokers.transaction(2)
    victim = next(a for a in cluster.addresses if a != home)
    for p, a in owners.items():
        brokers.at(a).create_producer(p).send(p.encode(), txn=brokers.handle(txn, a))
    index = cluster.addresses.index(victim)
    cluster.kill(index)
    txn.commit()
    assert txn.state is pulsartxn.TxnState.COMMITTING  # the victim's part is retried
    for p, a in owners.items():
        if a != victim:
            assert _drain(
                brokers.at(a).subscribe(
                    p, "during", initial_position=pulsartxn.InitialPosition.Earliest
                )
            ) == [p.encode()]
    cluster.start(index)
    deadline = time.monotonic() + 30
    while txn.state is not pulsartxn.TxnState.COMMITTED:
        assert time.monotonic() < deadline, "the commit did not complete"
        time.sleep(0.1)
    for p, a in owners.items():
        assert _drain(
            brokers.at(a).subscribe(p, "after", initial_position=pulsartxn.InitialPosition.Earliest)
        ) == [p.encode()]


def test_the_coordinators_broker_killed_mid_commit_recovers_the_decision(three):
    """Rounds of a transaction over partitions on three brokers, committed one after another
    while the coordinator's broker is killed and restarted: every round is on all partitions
    or on none, and every round whose commit returned is there."""
    cluster, brokers = three
    owners = _spread(brokers, "rounds", 3)
    coordinator = brokers.owner("coordinator", 0)
    writer = Brokers(cluster, reconnect_timeout_s=1.0)
    producers = {p: writer.at(a).create_producer(p) for p, a in owners.items()}
    committed: list[int] = []
    stop = threading.Event()

    def rounds() -> None:
        i = 0
        while not stop.is_set():
            try:
                txn, _ = writer.transaction(0, timeout_ms=5000)
                for p, a in owners.items():
                    producers[p].send(str(i).encode(), txn=writer.handle(txn, a))
                txn.commit()
                committed.append(i)
            except PulsarTxnError:
                return
            i += 1

    t = threading.Thread(target=rounds)
    t.start()
    time.sleep(1.0)
    cluster.kill(cluster.addresses.index(coordinator))
    stop.set()
    t.join(30)
    cluster.start(cluster.addresses.index(coordinator))
    assert committed, "no round committed before the kill"
    # The writer is gone: what it left open ends by its timeout (5 s), then readers go on.
    seen = {}
    deadline = time.monotonic() + 40
    for p, a in owners.items():
        c = brokers.at(a).subscribe(p, "check", initial_position=pulsartxn.InitialPosition.Earliest)
        got: list[int] = []
        while time.monotonic() < deadline:
            got += [int(v) for v in _drain(c, 1000)]
            if got and got[-1] >= committed[-1] and not brokers.any.admin.cluster_transactions(0):
                got += [int(v) for v in _drain(c, 500)]
                break
        seen[p] = got
    first = next(iter(seen.values()))
    assert all(v == first for v in seen.values()), seen  # all partitions or none
    assert set(committed) <= set(first)
    assert len(first) == len(set(first))  # none twice
    writer.close()


def _try(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return exc
    return None


def test_a_group_decides_transactions_with_participants_on_other_brokers(three):
    cluster, brokers = three
    owners = _spread(brokers, "grouped", 3)
    home = brokers.owner("coordinator", 0)
    c = brokers.at(home)
    winner = c.new_transaction(coordinator_id=0, group="g")
    loser = c.new_transaction(coordinator_id=0, group="g")
    producers = {p: brokers.at(a).create_producer(p) for p, a in owners.items()}
    for p, a in owners.items():
        producers[p].send(b"win", txn=brokers.handle(winner, a))
        producers[p].send(b"lose", txn=brokers.handle(loser, a))
    out = c.commit_group("g", [winner])
    assert out["committed"] == [winner.id] and out["aborted"] == [loser.id]
    for p, a in owners.items():
        assert _drain(
            brokers.at(a).subscribe(p, "s", initial_position=pulsartxn.InitialPosition.Earliest)
        ) == [b"win"]


def test_a_participant_down_while_its_transaction_times_out_is_released_after(three):
    """kill -9 a participant broker holding an open transaction's messages; the transaction
    times out at its coordinator meanwhile; once the participant is back, its readers go
    past the aborted messages (the end reaches it, retried until it does)."""
    cluster, brokers = three
    owners = _spread(brokers, "released", 6)
    txn, home = brokers.transaction(1, timeout_ms=1500)
    part, victim = next((p, a) for p, a in owners.items() if a != home)
    producer = brokers.at(victim).create_producer(part)
    producer.send(b"held", txn=brokers.handle(txn, victim))
    index = cluster.addresses.index(victim)
    cluster.kill(index)
    deadline = time.monotonic() + 20
    while txn.state is pulsartxn.TxnState.OPEN:
        assert time.monotonic() < deadline, "the transaction did not time out"
        time.sleep(0.1)
    cluster.start(index)
    producer.send(b"after")  # the client reconnects and makes its producer again
    consumer = brokers.at(victim).subscribe(
        part, "s", initial_position=pulsartxn.InitialPosition.Earliest
    )
    assert consumer.receive(15_000).value() == b"after"
    assert _drain(consumer, 300) == []
    assert txn.state is pulsartxn.TxnState.TIMEOUT


def test_zookeeper_restarted_brokers_register_again_and_carry_on(tmp_path):
    from pulsartxn.cluster import ClusterMetadata, LocalCluster

    with LocalCluster(tmp_path / "c", 2, num_coordinators=2, sync=False) as cluster:
        cluster.start()
        brokers = Brokers(cluster)
        try:
            owners = _spread(brokers, "zk", 4)
            cluster.kill_zookeeper()
            time.sleep(1.0)
            cluster.start_zookeeper()
            with ClusterMetadata(cluster.zk_url) as m:
                deadline = time.monotonic() + 30
                while len(m.live_brokers(fresh=True)) < 2:
                    assert time.monotonic() < deadline, "brokers did not register again"
                    time.sleep(0.2)
            txn, home = brokers.transaction(1)
            for p, a in owners.items():
                brokers.at(a).create_producer(p).send(b"x", txn=brokers.handle(txn, a))
            txn.commit()
            for p, a in owners.items():
                assert _drain(
                    brokers.at(a).subscribe(
                        p, "s", initial_position=pulsartxn.InitialPosition.Earliest
                    )
                ) == [b"x"]
        finally:
            brokers.close()


def test_calls_that_reach_a_broker_renewing_its_session_are_served(local_cluster):
    """A broker paused past its ZooKeeper session (4 s here) finds it expired when it runs
    again: calls already waiting for it (a producer on a new topic, a lookup) wait for its
    new session and are answered, not refused with the expired one."""
    cluster = local_cluster(1, num_coordinators=1)
    brokers = Brokers(cluster)
    try:
        brokers.any.create_producer("warm").send(b"w")  # connected, topic metadata read
        for i in range(2):
            got = _answered_after_a_pause(
                cluster,
                send=lambda i=i: brokers.any.create_producer(f"new-{i}").send(b"x"),
                lookup=lambda i=i: brokers.owner("partition", f"persistent://public/d/o-{i}"),
            )
            assert set(got) == {"send", "lookup"} and got["lookup"] == cluster.addresses[0]
            assert isinstance(got["send"], pulsartxn.MessageId), got
            assert _drain(
                brokers.any.subscribe(
                    f"new-{i}", "s", initial_position=pulsartxn.InitialPosition.Earliest
                )
            ) == [b"x"]
    finally:
        brokers.close()


def _answered_after_a_pause(cluster, **calls) -> dict:
    """Pause broker 0 past its session, make `calls` (name: fn) meanwhile, resume it: what
    each returned or raised."""
    got: dict = {}

    def make(name, fn):
        try:
            got[name] = fn()
        except PulsarTxnError as exc:
            got[name] = exc

    threads = [threading.Thread(target=make, args=item) for item in calls.items()]
    cluster.pause(0)
    try:
        time.sleep(5.0)
        for t in threads:
            t.start()
        time.sleep(0.3)
    finally:
        cluster.resume(0)
    for t in threads:
        t.join(60)
    return got


def test_with_tokens_a_transaction_is_its_openers_at_every_broker(local_cluster, tmp_path):
    """Brokers with a client token and an admin token: the brokers reach each other with the
    admin token; a transaction is used at another broker only with its capability, which
    every broker of the cluster honours."""
    (tmp_path / "token").write_text("client-secret")
    (tmp_path / "admin").write_text("admin-secret")
    cluster = local_cluster(
        2,
        num_coordinators=2,
        extra_args=(
            "--token-file",
            str(tmp_path / "token"),
            "--admin-token-file",
            str(tmp_path / "admin"),
        ),
    )

    def client(address):
        return RemoteClient(f"pulsartxn://{address}", token="client-secret")

    a, b = (client(x) for x in cluster.addresses)
    other_b = client(cluster.addresses[1])
    try:
        with pytest.raises(pulsartxn.NotAuthorized):  # peer calls need the admin token
            b._json("peer_state", {"txn": "0:1"})
        a.create_topic("tok", 4)
        parts = a.topic_partitions("tok")
        owner = {p: a._json("lookup", {"kind": "partition", "name": p})["address"] for p in parts}
        part = next(p for p, x in owner.items() if x == cluster.addresses[1])
        home = a._json("lookup", {"kind": "coordinator", "name": 0})["address"]
        opener = a if home == cluster.addresses[0] else b
        txn = opener.new_transaction(coordinator_id=0)
        producer = other_b.create_producer(part)  # another session than the opener's
        with pytest.raises(pulsartxn.NotAuthorized):  # the id alone is not enough
            other_b._json(
                "send_many",
                {"handle": producer._ensure(), "txn": str(txn.id), "messages": [{"n": 1}]},
                b"x",
            )
        handle = other_b.transaction(txn.id, txn.capability)  # good at this broker too
        producer.send(b"with-capability", txn=handle)
        txn.commit()
        consumer = other_b.subscribe(part, "s", initial_position=pulsartxn.InitialPosition.Earliest)
        assert consumer.receive(5000).value() == b"with-capability"
    finally:
        for c in (a, b, other_b):
            c.close()
