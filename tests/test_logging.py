"""What the broker logs, and under which logger (docs/operations.md, "Logs"): transaction
timeouts, finalize retries, recovery summaries, snapshot fallbacks, a halted store and a
journal left out for lack of room. Real brokers and stores on disk; records caught by caplog."""

from __future__ import annotations

import logging
import os
import shutil
import threading

import pytest

import pulsartxn
from pulsartxn.errors import StorageError
from pulsartxn.storage import Storage
from pulsartxn.txn.snapshot import DB as SNAPSHOT_DB
from tests.helpers import small_tmpfs, wait_for


def records(caplog, logger: str, level: int | None = None, has: str = "") -> list:
    return [
        r
        for r in caplog.records
        if r.name == logger and (level is None or r.levelno == level) and has in r.getMessage()
    ]


def test_the_library_leaves_logging_to_the_application():
    handlers = logging.getLogger("pulsartxn").handlers
    assert [type(h) for h in handlers] == [logging.NullHandler]


def test_a_timeout_is_logged_with_the_transaction_and_its_age(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pulsartxn")
    with pulsartxn.Broker(tmp_path / "d", sync=False, txn_timeout_tick_ms=10) as broker:
        client = broker.client()
        producer = client.create_producer("t")
        txn = client.new_transaction(timeout_ms=50)
        producer.send(b"secret-payload", txn=txn)
        ended = client.new_transaction(timeout_ms=50)
        ended.commit()  # ended in time: not logged
        wait_for(lambda: txn.state is pulsartxn.TxnState.TIMEOUT, what="the timeout")
        (rec,) = wait_for(lambda: records(caplog, "pulsartxn.txn", logging.INFO, "timed out:"))
    message = rec.getMessage()
    assert str(txn.id) in message and "timeout 50 ms" in message
    age = float(message.split("aborted ")[1].split(" ms")[0])
    assert 50 <= age < 10_000
    assert str(ended.id) not in caplog.text
    assert "secret-payload" not in caplog.text


class _Flaky:
    """A participant failing its first `failures` calls with an error naming the cause."""

    def __init__(self, failures: int) -> None:
        self.left = failures
        self.lock = threading.Lock()
        self.done = threading.Event()

    def end_txn(self, txn_id, commit, low_watermark) -> None:
        with self.lock:
            if self.left:
                self.left -= 1
                raise OSError("participant disk unplugged")
        self.done.set()


def test_finalize_retries_are_logged_with_their_error_first_then_exponentially_spaced(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="pulsartxn")
    flaky = _Flaky(failures=6)

    def resolve(kind, name):
        return flaky if name == "p-bad" else None

    with pulsartxn.Broker(tmp_path / "d", sync=False, txn_participants=resolve) as broker:
        txn = broker.client().new_transaction()
        broker.txn.add_partitions(txn.id, ["p-bad"])
        txn.commit()
        assert flaky.done.wait(10)
        wait_for(lambda: txn.state.value == "COMMITTED", what="the commit")
    warned = records(caplog, "pulsartxn.txn", logging.WARNING, "finalize of transaction")
    # Failures 1, 2 and 4 of 6: the first, then exponentially spaced.
    assert [r.getMessage().split("attempt ")[1].split(";")[0] for r in warned] == ["1", "2", "4"]
    for r in warned:
        msg = r.getMessage()
        assert str(txn.id) in msg and "(commit)" in msg and "p-bad" in msg
        assert "participant disk unplugged" in msg


def test_recovery_is_summarized(tmp_path, caplog):
    with pulsartxn.Broker(tmp_path / "live", sync=True, num_coordinators=2) as broker:
        client = broker.client()
        producer = client.create_producer("t")
        consumer = client.subscribe("t", "sub", initial_position=pulsartxn.InitialPosition.Earliest)
        producer.send(b"plain")
        done = client.new_transaction()
        producer.send(b"committed", txn=done)
        done.commit()
        left = client.new_transaction()  # an in-process client's: orphaned by the crash
        broker.txn.add_partitions(left.id, ["persistent://public/default/t"])  # logged
        consumer.acknowledge(consumer.receive(timeout_millis=5000), txn=left)
        broker.topics.partition("persistent://public/default/t").subscriptions[
            "sub"
        ].pending_ack.flush()
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")  # as a kill leaves it
    caplog.set_level(logging.INFO, logger="pulsartxn")
    with pulsartxn.Broker(tmp_path / "crashed", sync=True, num_coordinators=2) as broker:
        broker.client().subscribe("t", "sub")  # loads the partition and the subscription
    (txn,) = records(caplog, "pulsartxn.txn", logging.INFO, "coordinators recovered")
    msg = txn.getMessage()
    assert msg.startswith("2 transaction coordinators recovered in ")
    assert "1 transactions replayed" in msg and "1 orphaned" in msg
    (journal,) = records(caplog, "pulsartxn.journal", logging.INFO, "replayed")
    assert "after its checkpoint" in journal.getMessage()
    (part,) = records(caplog, "pulsartxn.buffer", logging.INFO, "persistent://public/default/t")
    msg = part.getMessage()
    assert "entries 0..2, 2 transactional ones replayed from the start" in msg  # data, marker
    assert "0 transactions ongoing, 0 aborted" in msg
    (acks,) = records(caplog, "pulsartxn.pendingack", logging.INFO)
    assert acks.getMessage().startswith("pending acks of sub on persistent://public/default/t")
    assert "1 records, 1 acks of 1 transactions" in acks.getMessage()


def test_a_journal_replay_after_a_crash_counts_its_records(tmp_path, caplog):
    storage = Storage(str(tmp_path / "live"), sync=True)
    try:
        db = storage.open_db(b"a")
        for i in range(5):
            storage.write(lambda t, i=i: t.put(b"%d" % i, b"v", db=db))
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")  # as a kill leaves it
    finally:
        storage.close()
    caplog.set_level(logging.INFO, logger="pulsartxn")
    again = Storage(str(tmp_path / "crashed"), sync=True)
    try:
        (rec,) = records(caplog, "pulsartxn.journal", logging.INFO, "replayed")
        replayed = int(rec.getMessage().split("replayed: ")[1].split(" records")[0])
        assert replayed == again.journal.replayed == again.stats()["replayed_records"] >= 1
    finally:
        again.close()


def test_a_snapshot_that_cannot_be_read_is_a_warning_and_the_ledger_is_replayed(tmp_path, caplog):
    data = tmp_path / "d"
    with pulsartxn.Broker(data, sync=False) as broker:
        client = broker.client()
        producer = client.create_producer("t")
        txn = client.new_transaction()
        producer.send(b"x", txn=txn)
        txn.abort()  # the close snapshots the buffer: an abort to remember
    storage = Storage(str(data), sync=False)
    try:
        db = storage.open_db(SNAPSHOT_DB)
        with storage.read() as t:
            heads = [bytes(k) for k, _ in t.cursor(db=db) if bytes(k).endswith(b"\0h")]
        assert heads
        storage.write(lambda t: [t.put(k, b"\x00garbage", db=db) for k in heads])
    finally:
        storage.close()
    caplog.set_level(logging.INFO, logger="pulsartxn")
    with pulsartxn.Broker(data, sync=False) as broker:
        broker.client().create_producer("t")
        stats = broker.admin.transaction_buffer_stats("t")
    (rec,) = records(caplog, "pulsartxn.buffer", logging.WARNING, "snapshot")
    assert "persistent://public/default/t" in rec.getMessage()
    assert "rebuilt from the whole ledger" in rec.getMessage()
    assert stats["aborted_txn_count"] == 1  # found again by the replay


def test_a_journal_without_room_is_a_warning(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pulsartxn")
    storage = Storage(str(tmp_path / "d"), sync=True, journal_bytes=4096)
    try:
        assert storage.journal is None and storage.stats()["journal"] is False
    finally:
        storage.close()
    (rec,) = records(caplog, "pulsartxn.journal", logging.WARNING, "no journal in")
    assert "under the least journal" in rec.getMessage()
    assert "LMDB syncs every commit itself" in rec.getMessage()


def test_a_disk_without_room_for_a_journal_is_a_warning(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pulsartxn")
    with small_tmpfs(tmp_path / "mnt", "16m") as mnt:
        with open(mnt / "filler", "wb") as f:  # leave under 8 MiB free: no 1 MiB journal
            f.write(bytes(os.statvfs(mnt).f_bavail * 4096 - (6 << 20)))
        storage = Storage(str(mnt / "d"), sync=True, map_size=64 << 20)
        try:
            assert storage.journal is None
            db = storage.open_db(b"a")
            storage.write(lambda t: t.put(b"k", b"v", db=db))  # LMDB syncs it itself
        finally:
            storage.close()
    (rec,) = records(caplog, "pulsartxn.journal", logging.WARNING, "no journal in")
    assert "no room for one (" in rec.getMessage() and "bytes free" in rec.getMessage()


def test_a_failed_journal_write_halts_the_store_with_one_error(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pulsartxn")
    storage = Storage(str(tmp_path / "d"), sync=True)
    try:
        db = storage.open_db(b"a")
        storage.write(lambda t: t.put(b"before", b"1", db=db))
        journal = storage.journal
        # The journal's descriptors now refuse writes (EBADF): a real failed write.
        ro = os.open(journal.path, os.O_RDONLY)
        try:
            for fd in (journal._fd, journal._direct):
                if fd is not None:
                    os.dup2(ro, fd)
        finally:
            os.close(ro)
        for _ in range(2):
            with pytest.raises(StorageError):
                storage.write(lambda t: t.put(b"after", b"2", db=db))
        stats = storage.stats()
        assert stats["halted"] is True and "Bad file descriptor" in stats["error"]
        assert stats["failed_groups"] == 2
    finally:
        storage.close()
    (rec,) = records(caplog, "pulsartxn.journal", logging.ERROR)
    assert rec.getMessage().startswith("storage halted, no more writes: the journal could not")
    assert str(tmp_path / "d") in rec.getMessage()
    # The failed groups: the first at once, the next one (within 10 s) held back.
    (group,) = records(caplog, "pulsartxn.storage", logging.ERROR)
    assert "failed, its 1 writes answered with the error" in group.getMessage()
