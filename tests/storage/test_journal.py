"""The write-ahead journal of a synced store (storage/journal.py): a group is durable once its
record is, LMDB commits without syncing, and recovery after a kill, or after a power loss
that kept any mix of the pages written since the last checkpoint, finds exactly what was
acknowledged."""

from __future__ import annotations

import mmap
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap

import pytest

from pulsartxn.errors import CorruptEntry, StorageFull
from pulsartxn.storage import Storage, WriteOp
from pulsartxn.storage.journal import Journal
from pulsartxn.storage.journal_format import HEAD, read_header
from tests.helpers import small_tmpfs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DBS = (b"a", b"b", b"c")
_BE = struct.Struct(">Q")


# -- a deterministic workload: groups of every kind of write the recorder knows ------------


def make_groups(seed: int, n: int) -> list[list[tuple]]:
    rng = random.Random(seed)
    appended = dict.fromkeys(DBS, 0)
    groups = []
    for _ in range(n):
        group = []
        for _ in range(rng.randint(1, 6)):
            db = rng.choice(DBS)
            key = b"k%03d" % rng.randrange(60)
            kind = rng.choices(
                ("put", "delete", "append", "cdelete", "replace", "pop"), (6, 2, 2, 1, 1, 1)
            )[0]
            if kind in ("put", "replace"):
                group.append((kind, db, key, rng.randbytes(rng.choice((8, 200, 1500, 3000)))))
            elif kind == "append":
                count = rng.randint(1, 4)
                rows = [
                    (b"\xff" + _BE.pack(appended[db] + i), rng.randbytes(rng.randint(1, 900)))
                    for i in range(count)
                ]
                appended[db] += count
                group.append((kind, db, rows))
            else:
                group.append((kind, db, key))
        groups.append(group)
    return groups


def open_dbs(storage) -> dict:
    return {name: storage.open_db(name) for name in DBS}


def apply_group(dbs, txn, group) -> None:
    for op in group:
        kind, db = op[0], dbs[op[1]]
        if kind == "put":
            txn.put(op[2], op[3], db=db)
        elif kind == "replace":
            txn.replace(op[2], op[3], db=db)
        elif kind == "delete":
            txn.delete(op[2], db=db)
        elif kind == "pop":
            txn.pop(op[2], db=db)
        elif kind == "append":
            txn.cursor(db=db).putmulti(op[2], append=True)
        elif kind == "cdelete":
            cursor = txn.cursor(db=db)
            if cursor.set_key(op[2]):
                cursor.delete()


def model(groups, changed: list | None = None) -> dict:
    """The databases after `groups`; `changed` gets, per group, whether it wrote anything
    (deletes of absent keys write nothing, and such a group leaves no journal record)."""
    state = {db: {} for db in DBS}
    for group in groups:
        wrote = False
        for op in group:
            kind, db = op[0], state[op[1]]
            if kind in ("put", "replace"):
                db[op[2]] = op[3]
                wrote = True
            elif kind == "append":
                db.update(op[2])
                wrote = True
            else:
                wrote |= db.pop(op[2], None) is not None
        if changed is not None:
            changed.append(wrote)
    return state


def contents(storage) -> dict:
    out = {}
    dbs = open_dbs(storage)  # before the read transaction, which sees only older handles
    with storage.read() as txn:
        for name in DBS:
            out[name] = {bytes(k): bytes(v) for k, v in txn.cursor(db=dbs[name])}
    return out


CHILD = textwrap.dedent(
    """
    import os, shutil, signal, sys, threading, time
    from pulsartxn.storage import Storage
    from tests.storage.test_journal import apply_group, make_groups, open_dbs

    path, seed, n, journal_bytes, copy_at, kill_after = sys.argv[1:7]
    seed, n, journal_bytes, copy_at = int(seed), int(n), int(journal_bytes), int(copy_at)
    storage = Storage(path, sync=True, journal_bytes=journal_bytes)
    dbs = open_dbs(storage)
    for i, group in enumerate(make_groups(seed, n)):
        storage.write(lambda txn, group=group: apply_group(dbs, txn, group))
        if i == 0 and float(kill_after) > 0:  # timed from the first acknowledged group
            timer = threading.Timer(float(kill_after), os.kill, (os.getpid(), signal.SIGKILL))
            timer.daemon = True
            timer.start()
        if i == copy_at:
            # The disk right after a checkpoint: every page written until now is on it.
            with storage.commits.commit_lock:
                storage.journal.checkpoint()
                shutil.copyfile(os.path.join(path, "data.mdb"), os.path.join(path, "durable"))
        print(i, storage.journal.records, storage.journal.checkpoints, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def run_child(path, seed, n, journal_bytes=16 << 20, copy_at=-1, kill_after=0.0):
    """Run the workload in a process that SIGKILLs itself; the acknowledged groups' count
    and the journal's last counters (records, checkpoints)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(path),
            str(seed),
            str(n),
            str(journal_bytes),
            str(copy_at),
            str(kill_after),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # Whole lines only: the kill may cut the last one short.
    lines = proc.stdout[: proc.stdout.rfind("\n") + 1].splitlines()
    last = [int(x) for x in lines[-1].split()] if lines else [-1, 0, 0]
    return last[0] + 1, last[1], last[2]


def check_recovered(path, groups, acked) -> Storage:
    storage = Storage(str(path), sync=True)
    got = contents(storage)
    # The group in flight at the kill may have landed or not; every acknowledged one has.
    assert got in (model(groups[:acked]), model(groups[: acked + 1]))
    return storage


# -- tests ---------------------------------------------------------------------------------


def test_a_synced_group_is_one_journal_record_and_lmdb_does_not_sync(tmp_path):
    storage = Storage(str(tmp_path / "env"), sync=True)
    try:
        assert storage.journal is not None and storage.headroom is None
        assert storage.env.flags()["sync"] is False
        before = storage.journal.records
        groups = make_groups(1, 40)
        dbs = open_dbs(storage)
        for group in groups:
            storage.write(lambda txn, group=group: apply_group(dbs, txn, group))
        changed: list = []
        assert contents(storage) == model(groups, changed)
        assert storage.journal.records == before + sum(changed) > before + 30
    finally:
        storage.close()
    again = Storage(str(tmp_path / "env"), sync=True)
    try:
        assert again.journal.replayed == 0  # a clean close checkpoints
        assert contents(again) == model(groups)
    finally:
        again.close()


def test_without_a_journal_lmdb_syncs_itself(tmp_path):
    storage = Storage(str(tmp_path / "env"), sync=True, journal=False)
    try:
        assert storage.journal is None and storage.env.flags()["sync"] is True
    finally:
        storage.close()
    assert not os.path.exists(tmp_path / "env" / "journal")


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_sigkill_recovers_every_acknowledged_group(tmp_path, seed):
    path = tmp_path / "env"
    Storage(str(path), sync=True).close()
    groups = make_groups(seed, 3000)
    kill_after = random.Random(seed).uniform(0.05, 0.2)
    acked, records, checkpoints = run_child(path, seed, len(groups), kill_after=kill_after)
    assert 0 < acked < len(groups)  # killed while writing
    storage = check_recovered(path, groups, acked)
    try:
        if checkpoints == 0:  # every record since the open's checkpoint (and the one in flight)
            assert storage.journal.replayed in (records, records + 1)
    finally:
        storage.close()


@pytest.mark.parametrize("options", [{"sync": False}, {"sync": True, "journal": False}])
def test_a_store_reopened_without_its_journal_replays_it_first(tmp_path, options):
    """sync=False or journal=False on a store whose journaled run was killed: the records
    after the last checkpoint go into LMDB, which is made durable, before the journal goes."""
    path = tmp_path / "env"
    groups = make_groups(61, 300)
    acked, records, _ = run_child(path, 61, len(groups), copy_at=99)
    assert acked == len(groups) and records > 0
    _power_loss_image(path, random.Random(61))
    storage = Storage(str(path), **options)
    try:
        assert storage.journal is None
        assert not os.path.exists(path / "journal")
        assert contents(storage) == model(groups)
    finally:
        storage.close()
    storage = Storage(str(path), sync=True)  # and back: a new journal, nothing to replay
    try:
        assert storage.journal.replayed == 0
        assert contents(storage) == model(groups)
    finally:
        storage.close()


def test_a_store_of_a_broker_without_a_journal_gets_one(tmp_path):
    path = tmp_path / "env"
    storage = Storage(str(path), sync=True, journal=False)
    groups = make_groups(71, 100)
    try:
        dbs = open_dbs(storage)
        for group in groups[:50]:
            storage.write(lambda txn, group=group: apply_group(dbs, txn, group))
    finally:
        storage.close()
    storage = Storage(str(path), sync=True)
    try:
        assert storage.journal is not None and contents(storage) == model(groups[:50])
        dbs = open_dbs(storage)
        for group in groups[50:]:
            storage.write(lambda txn, group=group: apply_group(dbs, txn, group))
        assert contents(storage) == model(groups)
    finally:
        storage.close()


def _power_loss_image(path, rng) -> None:
    """data.mdb as a power loss could leave it: each page written since the copy taken at
    the checkpoint either reached the disk or did not (meta pages included), and the file's
    growth since then may be lost."""
    data = path / "data.mdb"
    new = data.read_bytes()
    old = (path / "durable").read_bytes()
    psize = 4096
    out = bytearray()
    length = len(new) if rng.random() < 0.5 else len(old)
    for off in range(0, length, psize):
        page_new = new[off : off + psize]
        page_old = old[off : off + psize].ljust(len(page_new), b"\0")
        out += page_new if rng.random() < 0.5 else page_old
    data.write_bytes(bytes(out))


@pytest.mark.parametrize("seed", [21, 22])
def test_power_loss_keeps_any_mix_of_unsynced_pages_and_loses_nothing(tmp_path, seed):
    """The checkpoint's pages are never reused until the next checkpoint and its meta page is
    put back, so whatever mix of later pages reached the disk, the journal rebuilds the rest."""
    path = tmp_path / "env"
    groups = make_groups(seed, 600)
    acked, _, _ = run_child(path, seed, len(groups), copy_at=99)
    assert acked == len(groups)
    saved = tmp_path / "saved"
    shutil.copytree(path, saved)
    rng = random.Random(seed)
    for _ in range(4):
        shutil.rmtree(path)
        shutil.copytree(saved, path)
        _power_loss_image(path, rng)
        storage = Storage(str(path), sync=True)
        try:
            changed: list = []
            model(groups, changed)
            assert storage.journal.replayed == sum(changed[100:])
            assert contents(storage) == model(groups)
        finally:
            storage.close()


def test_the_journal_wraps_around_behind_checkpoints(tmp_path):
    path = tmp_path / "env"
    groups = make_groups(31, 3000)
    acked, records, checkpoints = run_child(path, 31, len(groups), journal_bytes=1 << 20)
    assert acked == len(groups)
    storage = check_recovered(path, groups, acked)
    try:
        assert checkpoints >= 4  # a quarter of the journal at a time
        assert storage.journal.header["replay_lsn"] > storage.journal.region  # wrapped
    finally:
        storage.close()


def test_a_group_too_large_for_the_journal_is_made_durable_by_a_checkpoint(tmp_path):
    storage = Storage(str(tmp_path / "env"), sync=True, journal_bytes=1 << 20)
    try:
        db = storage.open_db(b"a")
        records, checkpoints = storage.journal.records, storage.journal.checkpoints
        big = os.urandom(2 << 20)
        storage.run(WriteOp(lambda txn: txn.put(b"big", big, db=db), nbytes=len(big)))
        assert (storage.journal.records, storage.journal.checkpoints) == (
            records,
            checkpoints + 1,
        )
        # An op that says it is small but writes much: recorded, refused by the journal
        # (over half of it), committed directly all the same.
        storage.run(WriteOp(lambda txn: txn.put(b"big2", big, db=db), nbytes=10))
        assert storage.journal.records == records
        assert storage.journal.checkpoints == checkpoints + 2
        storage.write(lambda txn: txn.put(b"small", b"s", db=db))
        assert storage.journal.records == records + 1
    finally:
        storage.close()
    again = Storage(str(tmp_path / "env"), sync=True)
    try:
        db = again.open_db(b"a")
        with again.read() as txn:
            assert bytes(txn.get(b"big", db=db)) == big
            assert bytes(txn.get(b"big2", db=db)) == big
            assert bytes(txn.get(b"small", db=db)) == b"s"
    finally:
        again.close()


def test_a_torn_or_stale_record_ends_the_replay(tmp_path):
    """After a kill, garbage where the next record would go (a record torn by a crash, with
    a plausible magic) is not replayed, nor are the records of earlier laps behind it."""
    path = tmp_path / "env"
    groups = make_groups(41, 300)
    acked, _, _ = run_child(path, 41, len(groups), journal_bytes=1 << 20)
    assert acked == len(groups)
    with open(path / "journal", "r+b") as f:
        header = read_header(f.fileno())
        # Walk the records after the checkpoint to the end of the last one.
        journal = Journal(str(path / "journal"), f.fileno(), header["region"], header)
        ends = [end for end, _ in journal._records(header["replay_lsn"])]
        assert ends
        lsn = ends[-1]
        f.seek(HEAD + lsn % header["region"])
        f.write(struct.pack("<IIQ", 0x4A525031, 100, lsn) + os.urandom(200))
    storage = Storage(str(path), sync=True)
    try:
        assert contents(storage) == model(groups)
    finally:
        storage.close()


def test_a_damaged_header_slot_is_passed_over_and_two_are_refused(tmp_path):
    path = tmp_path / "env"
    storage = Storage(str(path), sync=True)
    db = storage.open_db(b"a")
    storage.write(lambda txn: txn.put(b"k", b"v", db=db))
    storage.close()
    with open(path / "journal", "r+b") as f:
        header = read_header(f.fileno())
        slot = header["seq"] & 1
        f.seek(slot * 4096 + 40)
        f.write(b"\x00\x01garbage")  # the newest slot
        f.flush()
        older = read_header(f.fileno())
        assert older is not None and older["seq"] == header["seq"] - 1
        f.seek((1 - slot) * 4096 + 40)
        f.write(b"\x00\x01garbage")
        f.flush()
        with pytest.raises(CorruptEntry):
            read_header(f.fileno())


def test_a_small_disk_gets_a_small_journal(tmp_path):
    with small_tmpfs(tmp_path / "mnt", "24m") as mnt:
        storage = Storage(str(mnt / "env"), sync=True, map_size=64 << 20)
        try:
            # An eighth of the free space, in whole MiB: room left for the data.
            assert storage.journal is not None and storage.journal.region <= 3 << 20
            groups = make_groups(51, 100)
            dbs = open_dbs(storage)
            for group in groups:
                storage.write(lambda txn, group=group: apply_group(dbs, txn, group))
        finally:
            storage.close()
        with open(mnt / "filler", "wb") as f:  # leave under 8 MiB free
            f.write(bytes(os.statvfs(mnt).f_bavail * 4096 - (6 << 20)))
        (mnt / "other").mkdir()
        assert Journal.open(str(mnt / "other"), 16 << 20) is None


def test_a_group_lmdb_fails_to_commit_is_taken_back_from_the_journal(tmp_path):
    """The journal writes a group's record while LMDB commits it; when that commit fails (a
    full disk: data.mdb cannot grow), the group fails, its record is zeroed, and nothing of
    it comes back: not in the store, not from a replay."""
    with small_tmpfs(tmp_path / "mnt", "32m") as mnt:
        path = mnt / "env"
        storage = Storage(str(path), sync=True, map_size=64 << 20, journal_bytes=2 << 20)
        try:
            db = storage.open_db(b"a")
            storage.write(lambda txn: txn.put(b"before", b"1", db=db))
            records = storage.journal.records
            with open(mnt / "filler", "wb") as f:  # leave under 64 KiB free
                f.write(bytes(os.statvfs(mnt).f_bavail * 4096 - (48 << 10)))
            big = os.urandom(400 << 10)  # a journal record, but no room for its LMDB pages
            with pytest.raises(StorageFull):
                storage.write(lambda txn: txn.put(b"big", big, db=db), nbytes=len(big))
            assert storage.journal.records == records
            shutil.copytree(path, tmp_path / "killed")  # a kill right after the failure
            os.unlink(mnt / "filler")
            storage.write(lambda txn: txn.put(b"after", b"2", db=db))
            with storage.read() as txn:
                assert txn.get(b"big", db=db) is None
            # As a kill would leave it: recovered from the checkpoint and the records.
            shutil.copytree(path, tmp_path / "copy")
        finally:
            storage.close()
        for copy, keys in (("killed", {b"before"}), ("copy", {b"before", b"after"})):
            again = Storage(str(tmp_path / copy), sync=True)
            try:
                db = again.open_db(b"a")
                with again.read() as txn:
                    assert {bytes(k) for k, _ in txn.cursor(db=db)} == keys
            finally:
                again.close()


def test_a_file_system_refusing_the_direct_write_gets_it_through_the_page_cache(tmp_path):
    """A direct write the kernel refuses (EINVAL, as from a file system without direct I/O;
    here a staging buffer off its alignment) is written through the page cache instead, and
    the records still replay."""
    path = tmp_path / "env"
    storage = Storage(str(path), sync=True)
    db = storage.open_db(b"a")
    journal = storage.journal
    if journal._direct is None:
        storage.close()
        pytest.skip("no direct writes on this file system")
    journal._stage = memoryview(mmap.mmap(-1, 1 << 17))[16:]
    records = journal.records
    storage.write(lambda txn: txn.put(b"k1", b"v1", db=db))
    assert journal._direct is None and journal.records == records + 1
    storage.write(lambda txn: txn.put(b"k2", b"v2", db=db))
    shutil.copytree(path, tmp_path / "copy")  # as a kill would leave it: no checkpoint
    storage.close()
    again = Storage(str(tmp_path / "copy"), sync=True)
    try:
        assert again.journal.replayed >= 2
        db = again.open_db(b"a")
        with again.read() as txn:
            assert bytes(txn.get(b"k1", db=db)) == b"v1"
            assert bytes(txn.get(b"k2", db=db)) == b"v2"
    finally:
        again.close()


STORED_CHILD = textwrap.dedent(
    """
    import os, sys
    from pulsartxn.storage import Storage
    storage = Storage(sys.argv[1], sync=True)
    db = storage.open_db(b"t")
    for i in range(int(sys.argv[2])):
        # Stored, not flushed: the record may still be on its way to the device.
        storage.write(lambda t, i=i: t.put(b"%08d" % i, b"v%d" % i, db=db), durable=False)
    print("stored", flush=True)
    os.kill(os.getpid(), 9)
    """
)


def test_a_stored_group_outlives_the_process(tmp_path):
    """A group of ops durable only by a later flush (a transaction's sends and acks) is
    answered once stored: its record may still be in flight, but a process that dies at
    once (no flush, no close) leaves it to the next open."""
    path = tmp_path / "env"
    proc = subprocess.run(
        [sys.executable, "-c", STORED_CHILD, str(path), "50"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL and "stored" in proc.stdout, proc.stderr
    storage = Storage(str(path), sync=True)
    try:
        db = storage.open_db(b"t")
        with storage.read() as t:
            got = {bytes(k): bytes(v) for k, v in t.cursor(db=db)}
        assert got == {b"%08d" % i: b"v%d" % i for i in range(50)}
        assert storage.journal.flushes == 0 and storage.journal.replayed >= 50
    finally:
        storage.close()


HELD_CHILD = textwrap.dedent(
    """
    import os, sys
    from pulsartxn.storage import Storage
    storage = Storage(sys.argv[1], sync=True)
    db = storage.open_db(b"t")

    def put(key, **how):
        storage.write(lambda t: t.put(key, b"v", db=db), **how)

    put(b"held-1", durable=False, held=True)
    put(b"held-2", durable=False, held=True)
    put(b"durable", durable=True)  # its record carries the two held groups first
    put(b"held-3", durable=False, held=True)  # no record after it: dies with the process
    print(storage.journal.records, flush=True)
    os.kill(os.getpid(), 9)
    """
)


def test_held_groups_ride_in_the_next_record_and_die_with_the_process_before_it(tmp_path):
    """Ops held (an in-process transaction's data: it dies with the process anyway) commit
    to LMDB and write no record of their own: the next record carries them, in order, before
    its own group. Held after the last record, they are gone after a crash."""
    path = tmp_path / "env"
    Storage(str(path), sync=True).close()
    proc = subprocess.run(
        [sys.executable, "-c", HELD_CHILD, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert int(proc.stdout.split()[0]) == 1  # one record for four groups
    storage = Storage(str(path), sync=True)
    try:
        db = storage.open_db(b"t")
        with storage.read() as t:
            got = sorted(bytes(k) for k, _ in t.cursor(db=db))
        assert got == [b"durable", b"held-1", b"held-2"]
    finally:
        storage.close()
