"""Opening named databases while another thread group-commits never deadlocks (GIL vs LMDB's
writer lock: py-lmdb's open_db without a transaction held the GIL while waiting for the lock)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import faulthandler, sys, tempfile, threading
import pulsartxn
faulthandler.dump_traceback_later(40, exit=True)
broker = pulsartxn.Broker(tempfile.mkdtemp(), sync=False)
client = broker.client()
stop = False
def produce():
    p = client.create_producer("busy")
    while not stop:
        p.send(b"x")
t = threading.Thread(target=produce, daemon=True)
t.start()
for i in range(3000):
    broker.storage.open_db(b"db-%d" % i)        # what a partition's first use does
for i in range(200):
    client.create_producer("topic-%d" % i)       # ledgers, snapshots, ... opened on first use
stop = True
t.join()
broker.close()
print("no deadlock")
"""


def test_open_db_beside_group_commits():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "no deadlock"


def test_too_many_databases_is_a_clear_error(tmp_path):
    """The topic that would not fit in max_dbs is refused before it is created."""
    import pytest

    import pulsartxn

    with pulsartxn.Broker(tmp_path / "d", sync=False, max_dbs=40) as broker:
        producer_topics = []
        with pytest.raises(pulsartxn.QuotaExceeded, match="max_dbs"):
            for i in range(100):
                broker.client().create_producer(f"t{i}")
                producer_topics.append(i)
        assert 0 < len(producer_topics) < 40
        broker.client().create_producer("t0").send(b"still works")
