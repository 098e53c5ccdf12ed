"""Crash torture of a broker cluster: kill -9 brokers under an exactly-once pipeline.

A real ZooKeeper and 3 broker processes (LocalCluster); the input and output topics' partitions
spread over them. A child process runs a consume-process-produce pipeline, one worker per
input partition: it takes a batch, and in one transaction (its coordinator on any broker)
sends one result per input to the output partition the input's key hashes to and acknowledges
the batch cumulatively, then commits. Each iteration kills, at a random moment, a random
broker or the child (kill -9), starts it again, and goes on. At the end, with no more kills,
the child finishes the inputs; then the output topic must hold every input exactly once (no
loss, no duplicate) and every result whose commit returned::

    python -m pulsartxn.torture_cluster --iterations 20 --seed 1

``tests/cluster/test_torture.py`` runs a short version.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib

from . import errors
from .cluster import LocalCluster
from .messaging.consumer import InitialPosition
from .remote import RemoteClient
from .remote.handles import RemoteTransaction

IN, OUT, SUB = "in", "out", "proc"
PARTITIONS = 3
COORDINATORS = 3
BATCH = 10
TXN_TIMEOUT_MS = 3000


class TortureFailure(AssertionError):
    """An invariant does not hold after the kills."""


class PerBroker:
    """A plain remote client per broker address of a cluster, the owners they look up, and a
    transaction's handle at any of them (what the cluster client does for its user, done by
    hand: the torture, bench.cluster and the protocol-level tests place every call)."""

    def __init__(self, addresses, reconnect_timeout_s: float = 30.0) -> None:
        self.addresses = list(addresses)
        self.reconnect_timeout_s = reconnect_timeout_s
        self.clients: dict[str, RemoteClient] = {}

    def at(self, address: str) -> RemoteClient:
        if address not in self.clients:
            self.clients[address] = RemoteClient(
                f"pulsartxn://{address}", reconnect_timeout_s=self.reconnect_timeout_s
            )
        return self.clients[address]

    def owner(self, kind: str, name) -> str:
        """The address of the broker owning a partition or coordinator (any broker answers;
        one that is down or unreachable is passed over, a definite answer is raised)."""
        for address in self.addresses:
            try:
                return self.at(address)._json("lookup", {"kind": kind, "name": name})["address"]
            except errors.BrokerUnavailable:
                continue
            except errors.PulsarTxnError as exc:
                if type(exc) is not errors.PulsarTxnError:  # not "unreachable"
                    raise
        raise errors.BrokerUnavailable(f"no broker answers a lookup of {kind} {name}")

    def handle(self, txn, address: str):
        """`txn` (opened at its coordinator's broker) as the broker at `address` uses it: its
        id and capability travel with each op."""
        if self.at(address) is txn._client:
            return txn
        return RemoteTransaction(self.at(address), txn.id, counted=False, capability=txn.capability)

    def close(self) -> None:
        for c in self.clients.values():
            try:
                c.close()
            except errors.PulsarTxnError:
                pass


# -- the child: the pipeline ---------------------------------------------------------------


def child(addresses: list[str], journal_path: str, seconds: float) -> None:
    """Run the pipeline for `seconds` (or until killed), journaling each commit that
    returned (its results), fsynced."""
    fd = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    brokers = PerBroker(addresses, reconnect_timeout_s=30.0)
    parts = brokers.at(addresses[0]).topic_partitions(IN)
    outs = brokers.at(addresses[0]).topic_partitions(OUT)
    deadline = time.monotonic() + seconds
    state = []
    for i, part in enumerate(parts):
        owner = brokers.owner("partition", part)
        state.append((i, part, owner, _subscribe(brokers.at(owner), part)))
    producers: dict = {}
    idle = 0
    while time.monotonic() < deadline and idle < len(state) * 3:
        for i, _part, owner, consumer in state:
            msgs = consumer.batch_receive(BATCH, 100)
            if not msgs:
                idle += 1
                continue
            idle = 0
            home = brokers.owner("coordinator", i % COORDINATORS)
            txn = brokers.at(home).new_transaction(
                coordinator_id=i % COORDINATORS, timeout_ms=TXN_TIMEOUT_MS
            )

            values = [m.value() for m in msgs]
            try:
                by_out: dict = {}
                for v in values:
                    by_out.setdefault(outs[zlib.crc32(v) % len(outs)], []).append(v)
                for out, vs in by_out.items():
                    address = brokers.owner("partition", out)
                    if out not in producers:
                        producers[out] = brokers.at(address).create_producer(out)
                    producers[out].send_batch(vs, txn=brokers.handle(txn, address))
                consumer.acknowledge_cumulative(msgs[-1], txn=brokers.handle(txn, owner))
                txn.commit()
            except errors.PulsarTxnError:
                # A broker was down too long (the transaction timed out, say): abort what is
                # left of it and take the batch again.
                try:
                    txn.abort()
                except errors.PulsarTxnError:
                    pass
                consumer.redeliver_unacknowledged_messages()
                continue
            os.write(fd, b"C " + b",".join(values) + b"\n")
            os.fsync(fd)
    brokers.close()


def _subscribe(client: RemoteClient, part: str, timeout_s: float = 60.0):
    """The pipeline's exclusive consumer, once a killed child's session has expired."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.subscribe(part, SUB, initial_position=InitialPosition.Earliest)
        except errors.ConsumerBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


# -- the parent: kills and checks ----------------------------------------------------------


def _inputs(brokers: PerBroker, n: int) -> list[bytes]:
    values = []
    for p, part in enumerate(brokers.at(brokers.addresses[0]).topic_partitions(IN)):
        producer = brokers.at(brokers.owner("partition", part)).create_producer(part)
        vs = [b"m%d-%06d" % (p, k) for k in range(n)]
        producer.send_batch(vs)
        values += vs
    return values


def _spawn(addresses, journal: str, seconds: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pulsartxn.torture_cluster", "--child", ",".join(addresses)]
    cmd += [journal, str(seconds)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _read_outputs(brokers: PerBroker, tag: str) -> list[bytes]:
    got = []
    for part in brokers.at(brokers.addresses[0]).topic_partitions(OUT):
        consumer = brokers.at(brokers.owner("partition", part)).subscribe(
            part, f"check-{tag}", initial_position=InitialPosition.Earliest
        )
        while True:
            msgs = consumer.batch_receive(1000, 500)
            if not msgs:
                break
            got += [m.value() for m in msgs]
        consumer.close()
    return got


def _lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _settled(brokers: PerBroker, timeout_s: float) -> None:
    """Until no broker holds an open transaction (those of killed children time out)."""
    deadline = time.monotonic() + timeout_s
    while brokers.at(brokers.addresses[0]).admin.cluster_transactions(0):
        if time.monotonic() > deadline:
            raise TortureFailure(f"transactions still open after {timeout_s} s")
        time.sleep(0.2)


def run(iterations: int, seed: int, data: str, inputs: int = 300, log=print) -> dict:
    """Kill and restart, `iterations` times; then finish and check. A summary."""
    rng = random.Random(seed)
    kills = {"broker": 0, "child": 0}
    with LocalCluster(
        os.path.join(data, "cluster"),
        PARTITIONS,
        num_coordinators=COORDINATORS,
        sync=False,
        extra_args=("--session-timeout-s", "2"),  # a killed child's consumers go soon
    ) as cluster:
        brokers = PerBroker(cluster.addresses, reconnect_timeout_s=30.0)
        try:
            admin = brokers.at(cluster.addresses[0])
            admin.create_topic(IN, PARTITIONS)
            admin.create_topic(OUT, PARTITIONS)
            sent = _inputs(brokers, inputs)
            journal = os.path.join(data, "journal")
            for it in range(iterations):
                proc = _spawn(cluster.addresses, journal, 60.0)
                time.sleep(rng.uniform(0.5, 2.0))
                if rng.random() < 0.7:
                    victim = rng.randrange(len(cluster))
                    cluster.kill(victim)
                    kills["broker"] += 1
                    time.sleep(rng.uniform(0.0, 1.0))
                    cluster.start(victim)
                    time.sleep(rng.uniform(0.0, 1.0))
                proc.send_signal(signal.SIGKILL)
                kills["child"] += 1
                proc.wait()
                log(f"iteration {it}: {_lines(journal)} commits journaled, kills {kills}")
            _settled(brokers, 60)
            proc = _spawn(cluster.addresses, journal, 120.0)
            if proc.wait(timeout=180) != 0:
                raise TortureFailure("the last child, with no kills, did not finish cleanly")
            _settled(brokers, 60)
            got = _read_outputs(brokers, "final")
            committed = set()
            with open(journal, "rb") as f:
                for line in f:
                    if line.startswith(b"C ") and line.endswith(b"\n"):
                        committed.update(line[2:-1].split(b","))
            check(sent, got, committed)
        finally:
            brokers.close()
    return {"inputs": len(sent), "outputs": len(got), "kills": kills, "committed": len(committed)}


def check(sent: list[bytes], got: list[bytes], committed: set) -> None:
    """TortureFailure unless `got` (the output topic, committed only) holds every input of
    `sent` exactly once, nothing else, and every result whose commit returned."""
    counts: dict = {}
    for v in got:
        counts[v] = counts.get(v, 0) + 1
    twice = sorted(v for v, n in counts.items() if n > 1)
    lost = sorted(set(sent) - set(counts))
    if twice:
        raise TortureFailure(f"{len(twice)} results twice, e.g. {twice[:3]}")
    if lost:
        raise TortureFailure(f"{len(lost)} inputs never produced, e.g. {lost[:3]}")
    if committed - set(counts):
        raise TortureFailure("a result whose commit returned is missing")
    stray = set(counts) - set(sent)
    if stray:
        raise TortureFailure(f"results of no input: {sorted(stray)[:3]}")


def main(argv=None) -> int:
    prog = "python -m pulsartxn.torture_cluster"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inputs", type=int, default=300, help="inputs per input partition")
    parser.add_argument("--data", default=None, help="directory to keep (default: temporary)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        addresses, journal, seconds = args.child
        child(addresses.split(","), journal, float(seconds))
        return 0
    if args.data:
        os.makedirs(args.data, exist_ok=True)
        print(run(args.iterations, args.seed, args.data, args.inputs))
        return 0
    with tempfile.TemporaryDirectory() as data:
        print(run(args.iterations, args.seed, data, args.inputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
