"""SIGKILL a process in the middle of begin/end, reopen: nothing stuck, nothing changes its mind,
no sequence reused. The participants write each outcome to a file (fsync) as they learn it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

import pulsartxn
from pulsartxn import TxnID, TxnState

CHILD = r"""
import os, random, sys
import pulsartxn

class FileParticipant:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    def end_txn(self, txn_id, commit, low_watermark):
        os.write(self.fd, f"{'C' if commit else 'A'} {txn_id}\n".encode())
        os.fsync(self.fd)

data, outcomes, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
participant = FileParticipant(outcomes)
broker = pulsartxn.Broker(data, num_coordinators=3, sync=True,
                          txn_participants=lambda kind, name: participant)
client = broker.client()
out = sys.stdout
i = 0
while True:
    i += 1
    if rng.random() < 0.15:
        group = f"g{i}"
        txns = [client.new_transaction(group=group) for _ in range(3)]
        for t in txns:
            out.write(f"N {t.id}\n"); out.flush()
            broker.txn.add_partitions(t.id, [f"p{rng.randrange(4)}"])
        client.commit_group(group, [txns[0]])
        out.write(f"C {txns[0].id}\nA {txns[1].id}\nA {txns[2].id}\n"); out.flush()
        continue
    t = client.new_transaction()
    out.write(f"N {t.id}\n"); out.flush()
    broker.txn.add_partitions(t.id, [f"p{k}" for k in range(rng.randrange(1, 4))])
    if rng.random() < 0.6:
        t.commit()
        out.write(f"C {t.id}\n")
    else:
        t.abort()
        out.write(f"A {t.id}\n")
    out.flush()
"""


class FileParticipant:
    def __init__(self, path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def end_txn(self, txn_id, commit, low_watermark) -> None:
        os.write(self.fd, f"{'C' if commit else 'A'} {txn_id}\n".encode())
        os.fsync(self.fd)


def read_pairs(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    return [tuple(line.split(" ")) for line in lines if line.count(" ") == 1]


@pytest.mark.parametrize("seed", range(3))
def test_sigkill_during_begin_and_end(tmp_path, seed):
    rng = random.Random(seed)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    data, outcomes = str(tmp_path / "data"), str(tmp_path / "outcomes")
    reported: list = []
    for round_ in range(2):
        out_path = tmp_path / f"stdout{round_}"
        with open(out_path, "w") as out:
            child = subprocess.Popen(
                [sys.executable, str(script), data, outcomes, str(seed * 10 + round_)],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
            )
        # Kill it at a random moment once it is at work (a loaded machine starts it slowly).
        started = time.monotonic() + 30
        while "\nC " not in "\n" + out_path.read_text() and time.monotonic() < started:
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.01)
        time.sleep(rng.random() * 0.8)
        child.kill()
        _, stderr = child.communicate()
        assert child.returncode == -9, stderr
        stdout = out_path.read_text()
        pairs = [tuple(line.split(" ")) for line in stdout.splitlines() if line.count(" ") == 1]
        assert any(k == "C" for k, _ in pairs), stderr  # it got some work done
        reported.extend(pairs)

        participant = FileParticipant(outcomes)
        with pulsartxn.Broker(
            data, num_coordinators=3, sync=True, txn_participants=lambda k, n, p=participant: p
        ) as broker:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                stats = [broker.admin.coordinator_stats(i) for i in range(3)]
                if all(s["committing"] == 0 and s["aborting"] == 0 for s in stats):
                    break
                time.sleep(0.01)
            assert all(s["committing"] == 0 and s["aborting"] == 0 for s in stats)
            began = [TxnID.parse(t) for k, t in reported if k == "N"]
            assert len(began) == len(set(began))  # never handed out twice
            client = broker.client()
            for kind, txn in reported:
                if kind in ("C", "A"):
                    # How it ended is kept after its records went: an end re-sent after the
                    # restart (its answer lost) is answered by that, not TransactionNotFound.
                    state = client.transaction(TxnID.parse(txn)).state
                    assert state == (TxnState.COMMITTED if kind == "C" else TxnState.ABORTED)
            for c in range(3):
                fresh = client.new_transaction(coordinator_id=c).id
                assert all(fresh.sequence > b.sequence for b in began if b.coordinator_id == c)
                client.transaction(fresh).abort()

    learned: dict = {}
    for kind, txn in read_pairs(outcomes):
        assert learned.setdefault(txn, kind) == kind, f"{txn} was told both commit and abort"
    for kind, txn in reported:
        if kind in ("C", "A"):
            # A commit or abort that returned is what every participant learned.
            assert learned.get(txn) == kind, (txn, kind, learned.get(txn))
