"""A local cluster of real processes: `pulsartxn cluster`, and LocalCluster's brokers killed,
stopped and restarted, and its ZooKeeper killed and restarted."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import pulsartxn
from pulsartxn.cluster import ClusterMetadata, LocalCluster
from pulsartxn.errors import InvalidConfiguration, PulsarTxnError, TopicAlreadyExists
from tests.helpers import free_ports


def _until(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)


def _live(zk_url: str) -> dict[str, str]:
    with ClusterMetadata(zk_url) as m:
        return m.live_brokers(fresh=True)


def _processes_of(path: str) -> list[int]:
    """Pids of the processes whose command line names `path` (brokers, ZooKeeper)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if path.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue  # gone meanwhile
    return found


def _partitions(address: str, topic: str) -> list[str]:
    """What the broker at `address` knows of `topic` (topics are cluster-wide)."""
    client = pulsartxn.Client(f"pulsartxn://{address}")
    try:
        return client.topic_partitions(topic)
    finally:
        client.close()


def _create(address: str, topic: str, partitions: int) -> None:
    client = pulsartxn.Client(f"pulsartxn://{address}")
    try:
        client.create_topic(topic, partitions=partitions)
    finally:
        client.close()


def _accepts(address: str) -> bool:
    host, port = address.split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


class _Command:
    """`python -m pulsartxn cluster ...` with its output read line by line, with timeouts."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pulsartxn", "cluster", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a process group of its own, as a terminal's job
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, pattern: str, timeout: float = 60) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            assert line is not None, f"no line {pattern!r} in {self.seen}"
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def terminate(self, ctrl_c: bool = False) -> int:
        """SIGTERM; `ctrl_c`: SIGINT to its whole process group, as a terminal sends it."""
        if ctrl_c:
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


SERVING = r"^pulsartxn cluster serving (pulsartxn://\S+) \(metadata (zk://\S+), logs in "


def test_the_cluster_command_serves_until_stopped_and_comes_back_the_same(tmp_path):
    data = str(tmp_path / "c")
    runs = []
    for run in range(2):  # the second run on the same data directory: the same brokers
        cmd = _Command("--brokers", "2", "--data-dir", data, "--no-sync")
        try:
            found = cmd.line(SERVING)
            url, zk_url = found.group(1), found.group(2)
            addresses = url[len("pulsartxn://") :].split(",")
            assert len(addresses) == 2 and all(_accepts(a) for a in addresses)
            live = _live(zk_url)
            assert sorted(live.values()) == sorted(addresses)
            if run == 0:
                _create(addresses[0], "orders", 2)
            assert len(_partitions(addresses[1], "orders")) == 2  # and still in the second
            assert cmd.terminate(ctrl_c=run == 1) == 0, cmd.seen
        finally:
            cmd.kill()
        assert cmd.seen[-1] == "pulsartxn cluster stopped"
        for i in range(2):  # ZooKeeper outlived its brokers, even when Ctrl-C reached it too
            with open(os.path.join(data, f"broker-{i}.log")) as f:
                last = f.read().rpartition("pulsartxn serving ")[2]
            assert "pulsartxn server stopped" in last and "Connection dropped" not in last
        assert _processes_of(data) == []  # no broker, no ZooKeeper left
        assert not any(_accepts(a) for a in addresses)
        runs.append((url, zk_url, live))
    assert runs[0] == runs[1]  # the same broker ids, the same ports


def test_the_cluster_command_reports_a_broker_that_cannot_start(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = _Command("--brokers", "1", "--data-dir", str(tmp_path), "--base-port", str(port))
        try:
            assert cmd.proc.wait(60) == 1
        finally:
            cmd.kill()
    cmd.line(r"^pulsartxn cluster: broker 0 exited with 2 before serving; the end of ")
    cmd.line(f"cannot listen on 127.0.0.1:{port}")
    assert _processes_of(str(tmp_path)) == []  # its ZooKeeper stopped too


def test_a_broker_killed_and_restarted_registers_again_with_its_id(local_cluster):
    cluster = local_cluster(2)
    assert cluster.service_url == "pulsartxn://" + ",".join(cluster.addresses)
    ids = [cluster.broker_id(i) for i in range(2)]
    assert all(ids) and ids[0] != ids[1]
    assert _live(cluster.zk_url) == dict(zip(ids, cluster.addresses))

    cluster.kill(0)
    assert not cluster.is_running(0) and cluster.process(0).returncode == -signal.SIGKILL
    assert not _accepts(cluster.addresses[0])
    _create(cluster.addresses[1], "made-meanwhile", 3)
    cluster.start(0)  # at once: its old session may not have expired yet
    assert cluster.broker_id(0) == ids[0]
    assert _live(cluster.zk_url) == dict(zip(ids, cluster.addresses))
    assert len(_partitions(cluster.addresses[0], "made-meanwhile")) == 3  # it serves
    assert cluster.is_running(1)  # the other broker never noticed


def test_a_stopped_broker_leaves_at_once_and_restarts_with_its_id(local_cluster):
    cluster = local_cluster(2)
    ids = [cluster.broker_id(i) for i in range(2)]
    with ClusterMetadata(cluster.zk_url) as watcher:
        assert cluster.stop(1) == 0
        # Deregistered on its way out: well within the 4 s session timeout.
        _until(lambda: ids[1] not in watcher.live_brokers(fresh=True), 2, "gone")
        cluster.restart(1)  # restart of a stopped broker: starts it
        cluster.restart(0)
        assert [cluster.broker_id(i) for i in range(2)] == ids
        assert watcher.live_brokers(fresh=True) == dict(zip(ids, cluster.addresses))
    with pytest.raises(InvalidConfiguration, match="broker 0 is running"):
        cluster.start(0)


def test_brokers_carry_on_after_zookeeper_is_killed_and_restarted(tmp_path):
    with LocalCluster(tmp_path, 2, sync=False) as cluster:
        ids = [cluster.broker_id(i) for i in range(2)]
        expected = dict(zip(ids, cluster.addresses))
        assert _live(cluster.zk_url) == expected

        def serving(n: int) -> bool:  # each broker's metadata works (a topic, cluster-wide)
            try:
                for i, address in enumerate(cluster.addresses):
                    try:
                        _create(address, f"t{n}-{i}", 2)
                    except TopicAlreadyExists:
                        pass  # made by an earlier try
                return True
            except PulsarTxnError:
                return False

        # A short outage: the sessions outlive it, the brokers carry on.
        cluster.kill_zookeeper()
        cluster.start_zookeeper()
        _until(lambda: serving(1), 20, "both brokers serve metadata again")
        assert _live(cluster.zk_url) == expected

        # Sessions that expire: ZooKeeper restored them at its restart, and expires them
        # when their brokers stay silent for the 4 s timeout (paused here).
        cluster.kill_zookeeper()
        cluster.pause(0)
        cluster.pause(1)
        cluster.start_zookeeper()
        time.sleep(5.0)
        assert _live(cluster.zk_url) == {}
        cluster.resume(0)
        cluster.resume(1)
        _until(lambda: _live(cluster.zk_url) == expected, 20, "both registered again")
        _until(lambda: serving(2), 20, "both brokers serve metadata again")
        assert len(_partitions(cluster.addresses[1], "t2-0")) == 2
        assert len(_partitions(cluster.addresses[0], "t1-1")) == 2
        assert cluster.close() == {0: 0, 1: 0}


def test_a_broker_that_does_not_come_up_in_time_is_killed(zookeeper, tmp_path):
    cluster = LocalCluster(
        tmp_path, 1, zookeeper=zookeeper.address, root="late", start_timeout_s=0.05
    )
    with pytest.raises(InvalidConfiguration, match="broker 0 did not serve within 0.05 s"):
        cluster.start()
    assert not cluster.is_running(0)
    assert _processes_of(str(tmp_path)) == []


def test_a_cluster_comes_back_on_its_data_directory_after_a_broker_was_killed(tmp_path):
    with LocalCluster(tmp_path, 2, sync=False) as cluster:
        before = (cluster.service_url, cluster.zk_url, [cluster.broker_id(i) for i in (0, 1)])
        cluster.kill(1)
        codes = cluster.close()
    assert codes == {0: 0}
    # ZooKeeper kept the killed broker's session across its restart: the new one waits it out.
    with LocalCluster(tmp_path, 2, sync=False) as cluster:
        after = (cluster.service_url, cluster.zk_url, [cluster.broker_id(i) for i in (0, 1)])
        assert _live(cluster.zk_url) == dict(zip(after[2], cluster.addresses))
    assert after == before


def test_each_broker_serves_its_own_metrics(local_cluster):
    """metrics_base_port + i: broker i's /metrics, labelled with the cluster's root and
    reporting only the coordinators that broker serves."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    base = free_ports(2)
    cluster = local_cluster(2, metrics_base_port=base, num_coordinators=4)
    root = cluster.zk_url.rsplit("/", 1)[1]
    client = pulsartxn.Client(cluster.service_url)
    try:
        for _ in range(3):
            client.new_transaction().commit()
    finally:
        client.close()
    served = []
    for i in range(2):
        assert cluster.metrics_url(i) == f"http://127.0.0.1:{base + i}/metrics"
        with urllib.request.urlopen(cluster.metrics_url(i), timeout=10) as response:
            text = response.read().decode()
        served.append(
            {
                s.labels["coordinator_id"]: (s.labels["cluster"], s.value)
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "pulsar_txn_committed_count"
            }
        )
    assert not set(served[0]) & set(served[1])  # a coordinator is reported by its owner only
    both = {**served[0], **served[1]}
    assert sum(v for _, v in both.values()) == 3
    assert {c for c, _ in both.values()} == {root}
    with pytest.raises(ValueError, match="metrics_base_port"):
        LocalCluster("unused", 2, metrics_base_port=65535)
