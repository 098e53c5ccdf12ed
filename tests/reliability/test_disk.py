"""Disk trouble: a full LMDB map or a full disk is a clear StorageFull that leaves nothing
half-written, and a data directory that is not ours (a file, someone else's files or LMDB
environment, no write permission) is refused at open with InvalidConfiguration, before anything
is written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import lmdb
import pytest

import pulsartxn
from pulsartxn import TxnState
from pulsartxn.errors import (
    InvalidConfiguration,
    InvalidTxnStatus,
    StorageFull,
    TransactionNotFound,
)
from tests.helpers import scanned, small_tmpfs

SMALL_MAP = 2 << 20
BIG_MAP = 256 << 20


def per_partition(client, topic):
    out = {}
    for b in client.scan(topic):
        for part, v in zip(b.column("partition").to_pylist(), b.column("value").to_pylist()):
            out.setdefault(part, []).append(v)
    return out


def _fill(client, producer, size, make_txn):
    """Write batches of 5 values (in a transaction when make_txn) until StorageFull; return
    (the batches that succeeded, the step that failed, its transaction, its values)."""
    written = []
    for i in range(1_000_000):
        values = [b"%07d-%d:" % (i, k) + b"x" * size for k in range(5)]
        txn = None
        step = "new_transaction"
        try:
            if make_txn:
                txn = client.new_transaction()
            step = "send_batch"
            assert producer.send_batch(values, txn=txn) == 5
            if make_txn:
                step = "commit"
                txn.commit()
        except StorageFull as exc:
            assert "full" in str(exc)
            return written, step, txn, values
        written.append(values)
    raise AssertionError("the map never filled")


@pytest.mark.parametrize("size", [300, 3000])
@pytest.mark.parametrize("transactional", [False, True])
def test_map_full_is_storage_full_and_nothing_is_half_written(tmp_path, size, transactional):
    data = tmp_path / "data"
    broker = pulsartxn.Broker(data, sync=False, map_size=SMALL_MAP, num_coordinators=2)
    client = broker.client()
    broker.create_topic("t", 2)
    producer = client.create_producer("t", batching_enabled=False)
    written, step, txn, failed = _fill(client, producer, size, transactional)
    assert len(written) > 10
    expected = sorted(v for batch in written for v in batch)
    # Every call that returned is readable; the one that failed left nothing.
    assert sorted(scanned(client, "t")) == expected
    assert broker.admin.topic_stats("t")["messages"] == len(expected)
    if txn is not None:
        try:
            txn.abort()
        except StorageFull:
            pass  # aborted after the reopen below
        except InvalidTxnStatus:
            assert step == "commit"  # its commit, whose sends did not fit, aborted it
    broker.close()  # closing a full store neither hangs nor raises

    broker = pulsartxn.Broker(data, sync=False, map_size=BIG_MAP, num_coordinators=2)
    client = broker.client()
    if txn is not None:
        try:
            client.transaction(txn.id).abort()
        except TransactionNotFound:
            pass  # it wrote nothing the store kept
        except InvalidTxnStatus:
            # Its abort was durable before the reopen, and how it ended is kept.
            assert client.transaction(txn.id).state is TxnState.ABORTED
    assert sorted(scanned(client, "t")) == expected
    assert not set(failed) & set(scanned(client, "t"))
    # Still ordered within each partition and writable, plain and transactional.
    for values in per_partition(client, "t").values():
        assert values == sorted(values)
    producer = client.create_producer("t", batching_enabled=False)
    producer.send_batch([b"after-1"])
    with client.new_transaction() as t:
        producer.send(b"after-2", txn=t)
    assert sorted(scanned(client, "t")) == sorted(expected + [b"after-1", b"after-2"])
    consumer = client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    assert len(consumer.batch_receive(100_000, 500)) >= 1
    broker.close()


def test_map_full_on_batched_sends_fails_each_future_clearly(tmp_path):
    data = tmp_path / "data"
    with pulsartxn.Broker(data, sync=False, map_size=SMALL_MAP) as broker:
        client = broker.client()
        producer = client.create_producer("t")
        ok, failed = [], 0
        for round_ in range(2000):
            futures = [(b"%06d-%03d" % (round_, k) + b"y" * 500, None) for k in range(50)]
            futures = [(v, producer.send_async(v)) for v, _ in futures]
            producer.flush()
            for value, fut in futures:
                exc = fut.exception(timeout=30)
                if exc is None:
                    ok.append(value)
                else:
                    assert isinstance(exc, StorageFull), exc
                    failed += 1
            if failed:
                break
        assert failed and ok
        assert scanned(client, "t") == ok  # in order, nothing of a failed send
    with pulsartxn.Broker(data, sync=False, map_size=BIG_MAP) as broker:
        client = broker.client()
        assert scanned(client, "t") == ok
        client.create_producer("t").send(b"more")
        assert scanned(client, "t")[-1] == b"more"


@pytest.fixture
def small_filesystem(tmp_path):
    """A 24 MiB tmpfs mounted for the test: a real ENOSPC from the kernel, not a full map."""
    with small_tmpfs(tmp_path / "small", "24m") as mnt:
        yield mnt


@pytest.mark.parametrize("transactional", [False, True])
def test_a_full_disk_is_storage_full_and_writes_resume_when_space_is_freed(
    small_filesystem, transactional
):
    """The disk fills before the map does: the failing call raises StorageFull and leaves
    nothing half-written; once space is freed the same broker writes again, and a reopen
    finds exactly what was acknowledged."""
    ballast = small_filesystem / "ballast"
    ballast.write_bytes(b"\0" * (4 << 20))
    data = small_filesystem / "data"
    broker = pulsartxn.Broker(data, sync=True, map_size=BIG_MAP, num_coordinators=2)
    try:
        client = broker.client()
        broker.create_topic("t", 2)
        producer = client.create_producer("t", batching_enabled=False)
        written, step, txn, failed = _fill(client, producer, 3000, transactional)
        assert len(written) > 10
        expected = sorted(v for batch in written for v in batch)
        assert sorted(scanned(client, "t")) == expected
        if txn is not None:
            try:
                txn.abort()
            except StorageFull:
                pass  # the disk is still full; its timeout or the reopen ends it
            except InvalidTxnStatus:
                assert step == "commit"  # its commit, whose sends did not fit, aborted it
        ballast.unlink()  # space again: the same broker writes without a restart
        producer.send_batch([b"after-1"])
        with client.new_transaction() as t:
            producer.send(b"after-2", txn=t)
        expected += [b"after-1", b"after-2"]
        assert sorted(scanned(client, "t")) == sorted(expected)
    finally:
        broker.close()
    with pulsartxn.Broker(data, sync=True, map_size=BIG_MAP, num_coordinators=2) as broker:
        client = broker.client()
        got = scanned(client, "t")
        assert sorted(got) == sorted(expected)
        assert not set(failed) & set(got)
        for values in per_partition(client, "t").values():
            assert values == sorted(values)


# -- directories that are not ours ---------------------------------------------------------


def _refused(path, match):
    with pytest.raises(InvalidConfiguration, match=match):
        pulsartxn.Broker(path, sync=False)


def test_a_file_instead_of_a_directory(tmp_path):
    f = tmp_path / "afile"
    f.write_bytes(b"not a directory")
    _refused(f, "not a directory")
    assert f.read_bytes() == b"not a directory"


def test_a_directory_of_other_files(tmp_path):
    d = tmp_path / "photos"
    d.mkdir()
    (d / "cat.jpg").write_bytes(b"\xff\xd8")
    _refused(d, "holds no pulsartxn store but other files \\(cat.jpg\\)")
    assert sorted(os.listdir(d)) == ["cat.jpg"]
    # Dot files (a .gitkeep) and lost+found (a mount point) do not make it foreign.
    e = tmp_path / "mount"
    e.mkdir()
    (e / ".gitkeep").write_bytes(b"")
    (e / "lost+found").mkdir()
    pulsartxn.Broker(e, sync=False).close()


def test_garbage_where_the_lmdb_file_should_be(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "data.mdb").write_bytes(os.urandom(64 * 1024))
    _refused(d, "cannot open the LMDB environment")


@pytest.mark.parametrize("layout", ["plain keys", "named databases", "a meta database"])
def test_another_programs_lmdb_environment_is_left_alone(tmp_path, layout):
    d = tmp_path / "theirs"
    env = lmdb.open(str(d), max_dbs=4)
    db = {"plain keys": None, "named databases": b"users", "a meta database": b"meta"}[layout]
    db = env.open_db(db) if db else None
    with env.begin(write=True, db=db) as txn:
        txn.put(b"alice", b"42")
    env.close()
    _refused(d, "not a pulsartxn store")
    _refused(d, "not a pulsartxn store")  # nothing stays open or locked by the first try
    env = lmdb.open(str(d), max_dbs=4, readonly=True)
    with env.begin() as txn:
        names = sorted(bytes(k) for k, _ in txn.cursor())
        target = env.open_db(db_name := names[0], txn=txn) if layout != "plain keys" else None
        assert names == ([b"alice"] if layout == "plain keys" else [db_name])
        assert bytes(txn.get(b"alice", db=target)) == b"42"
        assert txn.stat(target)["entries"] == 1  # nothing was added to their data
    env.close()


def test_a_store_of_another_format(tmp_path):
    d = tmp_path / "data"
    pulsartxn.Broker(d, sync=False).close()
    env = lmdb.open(str(d), max_dbs=64)
    meta = env.open_db(b"meta")
    with env.begin(write=True, db=meta) as txn:
        txn.put(b"format", b"pulsartxn/99")
    env.close()
    _refused(d, "format b'pulsartxn/99'")
    _refused(d, "format b'pulsartxn/99'")


def test_our_own_store_reopens(tmp_path):
    d = tmp_path / "data"
    with pulsartxn.Broker(d, sync=False) as broker:
        broker.client().create_producer("t").send(b"kept")
    with pulsartxn.Broker(d, sync=False) as broker:
        assert scanned(broker.client(), "t") == [b"kept"]


_READ_ONLY_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import pulsartxn
    if os.getuid() == 0:  # root writes anywhere: be nobody (modules are imported already)
        os.setgid(65534)
        os.setuid(65534)
    for path in sys.argv[1:]:
        try:
            pulsartxn.Broker(path, sync=False).close()
            print("opened", path)
        except pulsartxn.InvalidConfiguration as exc:
            print("refused", exc)
    """
)


def test_a_read_only_data_directory(tmp_path):
    base = tempfile.mkdtemp()  # outside tmp_path: another user must be able to reach it
    try:
        existing = os.path.join(base, "existing")
        pulsartxn.Broker(existing, sync=False).close()
        for root, _dirs, files in os.walk(base):
            os.chmod(root, 0o555)
            for f in files:
                os.chmod(os.path.join(root, f), 0o444)
        paths = [existing, base, os.path.join(base, "new")]
        run = subprocess.run(
            [sys.executable, "-c", _READ_ONLY_SCRIPT, *paths],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert run.returncode == 0, run.stderr[-3000:]
        lines = run.stdout.splitlines()
        assert len(lines) == 3 and all(line.startswith("refused") for line in lines), lines
        assert "not writable" in lines[0] and "not writable" in lines[1]
        assert "cannot create data directory" in lines[2]
    finally:
        for root, _dirs, _files in os.walk(base):
            os.chmod(root, 0o755)
        shutil.rmtree(base)
