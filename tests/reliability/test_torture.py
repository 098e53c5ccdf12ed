"""A short crash torture (pulsartxn/torture.py), and proof that its checker catches violations.

The long version: ``python -m pulsartxn.torture --iterations 200 --seed 1``."""

from __future__ import annotations

import os
import re

import pytest

import pulsartxn
from pulsartxn import torture


@pytest.mark.parametrize("seed", [11, 12])
def test_sigkill_torture_short(tmp_path, seed):
    rounds = []
    summary = torture.run(5, seed, data=str(tmp_path), max_kill_s=2.0, log=rounds.append)
    assert len(rounds) == 5
    assert summary["outcomes"]["committed"] > 0  # the child got work done
    assert summary["began"] > 0


@pytest.fixture
def checked(tmp_path):
    """A data directory with inputs and a history as the checker sees it after a round."""
    data = str(tmp_path / "data")
    torture.setup(data)
    history = torture.History()
    with torture._open(data) as broker:
        torture.add_inputs(broker, history, 0)
    return data, history


def _one_txn(data, history, *, k=2, ack=1):
    """Commit a transaction as the child would (ack `ack` inputs, produce k), no journal."""
    with torture._open(data) as broker:
        client = broker.client()
        consumer = client.subscribe(
            torture.IN,
            torture.SUB,
            subscription_type=pulsartxn.ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        msgs = [consumer.receive(timeout_millis=2000) for _ in range(ack)]
        txn = client.new_transaction()
        producer = client.create_producer(torture.OUT)
        for i in range(k):
            producer.send(f"T|{txn.id}|{i}|{k}".encode(), partition_key=f"k{i}", txn=txn)
        for m in msgs:
            consumer.acknowledge(m, txn=txn)
        txn.commit()
        history.began.append(str(txn.id))
        return str(txn.id), k, [m.data().decode() for m in msgs]


def test_checker_accepts_a_consistent_history(checked):
    data, history = checked
    tid, k, acked = _one_txn(data, history)
    history.intents[tid] = (k, acked)
    history.committed.add(tid)
    summary = torture.check(data, history, 0)
    assert summary["visible_txns"] == 1
    assert summary["redelivered"] == torture.INPUTS_PER_ROUND - 1


def test_checker_catches_a_lost_commit(checked):
    data, history = checked
    history.intents["0:9999"] = (3, [])
    history.committed.add("0:9999")
    with pytest.raises(torture.TortureFailure, match="committed transaction 0:9999 is lost"):
        torture.check(data, history, 0)


def test_checker_catches_a_visible_abort(checked):
    data, history = checked
    tid, k, acked = _one_txn(data, history)
    history.intents[tid] = (k, acked)
    history.aborted.add(tid)  # as if abort() had returned for it
    with pytest.raises(torture.TortureFailure, match="visible but was aborted"):
        torture.check(data, history, 0)


def test_checker_catches_an_unattempted_commit_and_a_reused_txnid(checked):
    data, history = checked
    tid, _, _ = _one_txn(data, history)
    with pytest.raises(torture.TortureFailure, match="commit was never attempted"):
        torture.check(data, history, 0)
    history.began.append(tid)
    with pytest.raises(torture.TortureFailure, match="handed out twice"):
        torture.check(data, history, 1)


def test_checker_catches_lost_acks(checked):
    data, history = checked
    tid, k, acked = _one_txn(data, history)
    never = sorted(history.inputs - set(acked))[0]
    history.intents[tid] = (k, acked + [never])  # claims an ack that was never made
    history.committed.add(tid)
    with pytest.raises(torture.TortureFailure, match=re.escape(f"input {never} is acknowledged")):
        torture.check(data, history, 0)


def test_journal_ignores_a_torn_last_line(tmp_path):
    path = str(tmp_path / "journal")
    with open(path, "w") as f:
        f.write("B 0:1\nK 0:1 2 -\nC 0:1\nB 0:2\nC 0:")
    history = torture.History()
    torture.read_journal(path, history)
    assert history.began == ["0:1", "0:2"]
    assert history.committed == {"0:1"}
    assert history.intents == {"0:1": (2, [])}
    assert not os.path.exists(path)
