"""Headroom: a synced store keeps zeros written after LMDB's last page, so that commits that
append overwrite them instead of growing the file; never at the cost of the data, of a crash,
or of the last of the disk."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import pulsartxn
from pulsartxn.storage import Storage
from pulsartxn.storage.headroom import Headroom
from tests.helpers import scanned, small_tmpfs

VALUE = 64 << 10


def _value(i: int) -> bytes:
    seed = hashlib.sha256(b"%d" % i).digest()
    return (seed * (VALUE // len(seed) + 1))[:VALUE]


def _file_size(storage: Storage) -> int:
    return os.stat(os.path.join(storage.data_dir, "data.mdb")).st_size


def _used(storage: Storage) -> int:
    return (storage.env.info()["last_pgno"] + 1) * storage.env.stat()["psize"]


def _small(i: int) -> bytes:
    return _value(i)[: 16 << 10]


def test_synced_appends_overwrite_zeros_written_ahead(tmp_path):
    storage = Storage(str(tmp_path / "env"), sync=True, journal=False)
    db = storage.open_db(b"t")
    grown_by_lmdb = 0
    for i in range(1200):
        before, extensions = _file_size(storage), storage.headroom.extensions
        storage.write(lambda txn, i=i: txn.put(b"%08d" % i, _small(i), db=db))
        assert _file_size(storage) >= _used(storage)
        if _file_size(storage) > before and storage.headroom.extensions == extensions:
            grown_by_lmdb += 1
    # About 19 MiB appended, 16 KiB a commit: the headroom grew the file a few times, LMDB
    # itself (nearly) never did, and there is room left past the last page.
    assert storage.headroom.extensions >= 3
    assert grown_by_lmdb <= 1
    assert _file_size(storage) > _used(storage)
    storage.close()

    again = Storage(str(tmp_path / "env"), sync=True, journal=False)
    db = again.open_db(b"t")
    with again.read() as txn:
        assert [bytes(k) for k, _ in txn.cursor(db=db)] == [b"%08d" % i for i in range(1200)]
        assert all(bytes(txn.get(b"%08d" % i, db=db)) == _small(i) for i in range(1200))
    again.write(lambda txn: txn.put(b"after", b"reopen", db=db))
    again.close()


def test_bulk_appends_write_no_zeros_ahead_and_small_ones_again(tmp_path):
    """Groups that append 64 KiB or more each: zeros written ahead would be written to the
    disk twice over for each byte, so the headroom stops and LMDB grows the file; once the
    groups append little again, the headroom resumes."""
    storage = Storage(str(tmp_path / "env"), sync=True, journal=False)
    db = storage.open_db(b"t")
    for i in range(20):  # the moving average learns that these groups append in bulk
        storage.write(lambda txn, i=i: txn.put(b"a%08d" % i, _value(i), db=db))
    extensions = storage.headroom.extensions
    for i in range(20, 320):  # about 19 MiB more
        storage.write(lambda txn, i=i: txn.put(b"a%08d" % i, _value(i), db=db))
    assert storage.headroom.extensions == extensions
    assert _file_size(storage) > 19 << 20  # grown by LMDB itself
    for i in range(1200):
        storage.write(lambda txn, i=i: txn.put(b"b%08d" % i, _small(i), db=db))
    assert storage.headroom.extensions > extensions
    assert _file_size(storage) > _used(storage)
    with storage.read() as txn:
        assert all(bytes(txn.get(b"a%08d" % i, db=db)) == _value(i) for i in range(320))
        assert all(bytes(txn.get(b"b%08d" % i, db=db)) == _small(i) for i in range(1200))
    storage.close()


def test_an_unsynced_store_writes_no_zeros(tmp_path):
    storage = Storage(str(tmp_path / "env"), sync=False)
    db = storage.open_db(b"t")
    for i in range(50):
        storage.write(lambda txn, i=i: txn.put(b"%08d" % i, _value(i), db=db))
    assert storage.headroom is None
    storage.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_while_appending_loses_nothing_acknowledged(tmp_path, seed):
    """A producer of 64 KiB messages on a synced broker (a headroom extension every few
    sends) is killed at a random moment: every send that returned is there, intact."""
    data_dir = tmp_path / "crash"
    script = textwrap.dedent(
        f"""
        import hashlib, os, pulsartxn
        VALUE = {VALUE}
        def value(i):
            seed = hashlib.sha256(b"%d" % i).digest()
            return (seed * (VALUE // len(seed) + 1))[:VALUE]
        broker = pulsartxn.Broker({str(data_dir)!r}, sync=True, journal=False)
        producer = broker.client().create_producer("t", batching_enabled=False)
        i = 0
        while True:
            producer.send(value(i))
            os.write(1, b"%d\\n" % i)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    stop_after = random.Random(seed).randrange(20, 200)
    acknowledged = 0
    for _ in proc.stdout:
        acknowledged += 1
        if acknowledged >= stop_after:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    acknowledged += sum(1 for line in proc.stdout if line.endswith("\n"))
    with pulsartxn.Broker(data_dir, sync=True, journal=False) as broker:
        stored = scanned(broker.client(), "t")
        assert len(stored) >= acknowledged
        assert stored == [_value(i) for i in range(len(stored))]
        # and the reopened store goes on writing
        broker.client().create_producer("t").send(b"more")
        assert scanned(broker.client(), "t")[-1] == b"more"


def test_never_takes_the_last_of_the_disk(tmp_path):
    """On a 24 MiB filesystem the headroom writes nothing (it keeps 64 MiB free); made to
    (no reserve), it stops at the first ENOSPC, cuts its partial write off again, and the
    store goes on writing into what it did write."""
    with small_tmpfs(tmp_path / "small", "24m") as mnt:
        storage = Storage(str(mnt / "env"), sync=True, journal=False, map_size=64 << 20)
        db = storage.open_db(b"t")
        for i in range(20):
            storage.write(lambda txn, i=i: txn.put(b"%08d" % i, _value(i), db=db))
        assert storage.headroom.extensions == 0
        assert _file_size(storage) == _used(storage)

        greedy = Headroom(
            storage.env,
            storage.data_dir,
            64 << 20,
            min_chunk=4 << 20,
            max_chunk=4 << 20,
            min_free_bytes=0,
        )
        for _ in range(10):
            greedy._extend()
            greedy._skip = 0
        assert 1 <= greedy.extensions < 10  # it stopped when the disk was full
        size = _file_size(storage)
        assert size == _used(storage) + greedy.bytes_written  # no partial chunk left
        # LMDB appends into the zeros without growing the file, until they are used up.
        written = 20
        while _file_size(storage) == size and written < 200:
            storage.write(lambda txn, i=written: txn.put(b"%08d" % i, _value(i), db=db))
            written += 1
        assert written > 20 + greedy.bytes_written // VALUE // 2
        greedy.close()
        storage.close()
        again = Storage(str(mnt / "env"), sync=True, journal=False, map_size=64 << 20)
        db = again.open_db(b"t")
        with again.read() as txn:
            got = {bytes(k): bytes(v) for k, v in txn.cursor(db=db)}
        assert all(got[b"%08d" % i] == _value(i) for i in range(written - 1))
        again.close()


def test_a_write_transaction_elsewhere_waits_for_the_extension(tmp_path):
    """The zeros are written under LMDB's writer lock: a write transaction opened outside the
    group commit (as open_db does) cannot be writing pages past the end at that moment."""
    storage = Storage(str(tmp_path / "env"), sync=True, journal=False)
    db = storage.open_db(b"t")
    storage.write(lambda txn: txn.put(b"a", b"1", db=db))
    txn = storage.env.begin(write=True)  # holds LMDB's writer lock
    done = threading.Event()
    worker = threading.Thread(target=lambda: (storage.headroom._extend(), done.set()))
    worker.start()
    assert not done.wait(0.3)
    txn.put(b"b", b"2", db=db)
    txn.commit()
    assert done.wait(10)
    worker.join()
    with storage.read() as r:
        assert bytes(r.get(b"b", db=db)) == b"2"
    storage.close()
