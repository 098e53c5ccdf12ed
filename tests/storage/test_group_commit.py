"""Group commit on a real LMDB environment: grouping, isolation of a bad op, durability."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import lmdb
import pytest

import pulsartxn
from pulsartxn.storage import Storage, WriteOp
from pulsartxn.storage.group_commit import GroupCommit
from tests.helpers import frames


@pytest.fixture
def storage(tmp_path):
    s = Storage(str(tmp_path / "env"), sync=False)
    yield s
    s.close()


def test_concurrent_writes_share_groups(storage):
    db = storage.open_db(b"t")
    barrier = threading.Barrier(8)

    def writer(t):
        barrier.wait()
        futures = [
            storage.submit(WriteOp(lambda txn, k=b"%d-%d" % (t, i): txn.put(k, b"v", db=db)))
            for i in range(200)
        ]
        for f in futures:
            f.result()

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    with storage.read() as txn:
        assert txn.stat(db)["entries"] == 1600
    assert storage.commits.records == 1600
    assert storage.commits.groups < 1600


def test_a_synced_waiter_sleeps_on_its_answer_while_another_thread_commits(tmp_path):
    """With fsync, a caller whose op is queued while another thread holds the commit lock
    does not queue on that lock (it would learn that its op landed only once it held the
    lock, after the leader took it again): it wakes the writer thread and sleeps until the
    answer."""
    env = lmdb.open(str(tmp_path / "env"), max_dbs=2, sync=True)
    # The writer thread looks at the queue on its own only once a minute: here it is woken.
    commits = GroupCommit(env, sync=True, lazy_max_ms=60_000)
    try:
        applied = []
        answered = threading.Event()

        def caller():
            fut = commits.submit(
                WriteOp(lambda txn: applied.append(txn.put(b"k", b"v"))), quiet=True
            )
            commits.wait_for(fut)
            answered.set()

        commits.commit_lock.acquire()  # another thread's group is being committed
        try:
            t = threading.Thread(target=caller)
            t.start()
            writer = commits.writer_thread
            deadline = time.monotonic() + 10
            # The caller sleeps on its answer (not in the lock's acquire, where the frames
            # would end in wait_until), and the writer, woken, waits for the lock (in _run,
            # out of its queue's wait). Checked while the lock is held: nothing commits.
            while not ("block" in frames(t.ident) and frames(writer.ident)[:1] == ["_run"]):
                assert time.monotonic() < deadline, (frames(t.ident), frames(writer.ident))
                time.sleep(0.005)
            assert applied == [] and not answered.is_set()
        finally:
            commits.commit_lock.release()
        assert answered.wait(10)
        t.join(10)
        assert len(applied) == 1
        with env.begin() as txn:
            assert txn.get(b"k") == b"v"
    finally:
        commits.close()
        env.close()


def test_a_failing_op_fails_alone(storage):
    db = storage.open_db(b"t")
    gate = threading.Event()
    blocker = storage.submit(WriteOp(lambda txn: gate.wait()))
    good1 = storage.submit(WriteOp(lambda txn: txn.put(b"a", b"1", db=db)))

    def bad(txn):
        txn.put(b"half", b"written", db=db)
        raise ValueError("bad op")

    failing = storage.submit(WriteOp(bad))
    good2 = storage.submit(WriteOp(lambda txn: txn.put(b"b", b"2", db=db)))
    gate.set()
    blocker.result()
    good1.result()
    good2.result()
    with pytest.raises(ValueError, match="bad op"):
        failing.result()
    with storage.read() as txn:
        assert bytes(txn.get(b"a", db=db)) == b"1" and bytes(txn.get(b"b", db=db)) == b"2"
        assert txn.get(b"half", db=db) is None


def test_on_commit_runs_before_the_answer_and_on_abort_on_failure(storage):
    seen = []
    fut = storage.submit(WriteOp(lambda txn: 7, on_commit=lambda r: seen.append(("commit", r))))
    assert fut.result() == 7 and seen == [("commit", 7)]
    fut = storage.submit(WriteOp(lambda txn: 1 / 0, on_abort=lambda: seen.append("abort")))
    with pytest.raises(ZeroDivisionError):
        fut.result()
    assert seen[-1] == "abort"


def test_map_full_is_a_clear_error_and_writes_nothing(tmp_path):
    s = Storage(str(tmp_path / "small"), sync=False, map_size=1 << 20)
    try:
        db = s.open_db(b"t")
        with pytest.raises(pulsartxn.StorageFull):
            s.write(lambda txn: [txn.put(b"%08d" % i, b"x" * 1000, db=db) for i in range(5000)])
        with s.read() as txn:
            assert txn.stat(db)["entries"] == 0
        s.write(lambda txn: txn.put(b"small", b"ok", db=db))
    finally:
        s.close()


def test_close_commits_what_was_submitted(tmp_path):
    s = Storage(str(tmp_path / "env"), sync=False)
    db = s.open_db(b"t")
    futures = [
        s.submit(WriteOp(lambda txn, i=i: txn.put(b"%d" % i, b"v", db=db))) for i in range(500)
    ]
    s.close()
    assert all(f.result() is True for f in futures)  # what put returned
    with pytest.raises(pulsartxn.AlreadyClosed):
        s.submit(WriteOp(lambda txn: None))
    env = lmdb.open(str(tmp_path / "env"), max_dbs=4, readonly=True)
    with env.begin() as txn:
        assert txn.stat(env.open_db(b"t", txn=txn))["entries"] == 500
    env.close()


def test_acknowledged_sends_survive_kill_9(tmp_path):
    """Every send that returned (sync=True) is there after SIGKILL at a random moment."""
    data_dir = tmp_path / "crash"
    script = textwrap.dedent(
        f"""
        import os, sys, threading, pulsartxn
        broker = pulsartxn.Broker({str(data_dir)!r}, sync=True)
        client = broker.client()
        def run(t):
            producer = client.create_producer("crash", producer_name=f"p{{t}}")
            i = 0
            while True:
                producer.send(f"{{t}}-{{i}}".encode())
                os.write(1, f"{{t}}-{{i}}\\n".encode())  # one atomic write per line
                i += 1
        for t in range(3):
            threading.Thread(target=run, args=(t,), daemon=True).start()
        threading.Event().wait()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    acknowledged = []
    for line in proc.stdout:
        acknowledged.append(line.strip())
        if len(acknowledged) >= 300:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Lines printed before the kill (a line cut short by the kill was not fully acknowledged).
    acknowledged.extend(line.strip() for line in proc.stdout if line.endswith("\n"))
    with pulsartxn.Broker(data_dir, sync=True) as broker:
        stored = [
            v.decode() for b in broker.client().scan("crash") for v in b.column("value").to_pylist()
        ]
    assert set(acknowledged) <= set(stored)
    assert len(stored) == len(set(stored))
    for t in range(3):
        mine = [int(v.split("-")[1]) for v in stored if v.startswith(f"{t}-")]
        assert mine == list(range(len(mine)))  # per producer: in order, no holes


def test_op_future_answers_once_wakes_waiters_and_runs_callbacks(caplog):
    from concurrent.futures import InvalidStateError

    from pulsartxn.storage.ops import OpFuture

    fut = OpFuture()
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.01)
    seen = []
    fut.add_done_callback(lambda f: seen.append(("early", f.result())))
    fut.add_done_callback(lambda f: 1 / 0)  # logged, and the others still run
    fut.add_done_callback(lambda f: seen.append(("late", f.done())))
    got = []
    waiters = [
        threading.Thread(target=lambda: got.append(fut.result(timeout=10))) for _ in range(3)
    ]
    for t in waiters:
        t.start()
    fut.set_result(7)
    for t in waiters:
        t.join(10)
    assert got == [7, 7, 7]
    assert seen == [("early", 7), ("late", True)]
    assert "ZeroDivisionError" in caplog.text
    fut.add_done_callback(lambda f: seen.append(("after", f.exception())))
    assert seen[-1] == ("after", None)  # called at once once done
    with pytest.raises(InvalidStateError):
        fut.set_exception(ValueError("twice"))
    assert fut.result() == 7

    failed = OpFuture()
    failed.set_exception(ValueError("no room"))
    assert isinstance(failed.exception(), ValueError) and failed.done()
    with pytest.raises(ValueError, match="no room"):
        failed.result()


def test_lmdb_write_errors_become_api_errors(tmp_path, monkeypatch):
    from pulsartxn.errors import StorageError, StorageFull
    from pulsartxn.storage import ops

    eio = lmdb.Error("mdb_txn_commit: Input/output error")
    # A short write with room to spare is a failing disk; with almost none, a full one.
    assert type(ops.storage_error(eio, str(tmp_path))) is StorageError
    monkeypatch.setattr(ops, "NEARLY_FULL_BYTES", 1 << 62)
    full = ops.storage_error(eio, str(tmp_path))
    assert isinstance(full, StorageFull) and "bytes free" in str(full)
    assert isinstance(ops.storage_error(lmdb.MapFullError("map")), StorageFull)
    nospace = lmdb.Error("mdb_txn_commit: No space left on device")
    assert isinstance(ops.storage_error(nospace), StorageFull)
    other = ValueError("a caller's bug")
    assert ops.storage_error(other) is other


def test_the_writer_thread_takes_an_op_only_under_the_commit_lock(tmp_path):
    """Ops are committed in the order they were queued, whoever commits them. The writer
    thread used to take the next op off the queue before it waited for the commit lock; a
    caller that held the lock then committed the ops queued after it first (a producer's
    batches landed out of order: entry 10 before entries 8 and 9)."""
    env = lmdb.open(str(tmp_path / "env"), max_dbs=2, sync=False)
    commits = GroupCommit(env, sync=False)
    order = []
    try:
        with commits.commit_lock:
            first = commits.submit(WriteOp(lambda txn: order.append("first")))  # wakes it
            time.sleep(0.1)  # the writer thread is up, waiting for the lock
            second = commits.submit(WriteOp(lambda txn: order.append("second")), quiet=True)
            commits._local.committing = True
            try:
                commits._drain()  # what a caller that leads does with the lock held
            finally:
                commits._local.committing = False
        first.result(5)
        second.result(5)
        assert order == ["first", "second"]
    finally:
        commits.close()
        env.close()
