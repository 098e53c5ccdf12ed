"""Coordinators (txn/coordinators.py): growing them within the store's limits, and opening a store
whose saved count of coordinators cannot open."""

from __future__ import annotations

import struct
import tracemalloc

import lmdb
import pytest

import pulsartxn
from pulsartxn.errors import InvalidConfiguration, QuotaExceeded
from pulsartxn.txn import log
from pulsartxn.txn.meta import COORDINATOR_BYTES


def stored_count(path) -> int:
    env = lmdb.open(str(path), max_dbs=64, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            raw = txn.get(log.COORDINATORS_KEY, db=env.open_db(b"meta", txn=txn, create=False))
    finally:
        env.close()
    return struct.unpack("<I", raw)[0]


def brick(path, count: int, used: range = range(0)) -> None:
    """What an older broker left after a scale that ran out of named databases: `count` saved,
    empty logs for some of the coordinators it never finished opening; hwm keys (sequences
    handed out) for the coordinators in `used`."""
    env = lmdb.open(str(path), max_dbs=128)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(log.COORDINATORS_KEY, struct.pack("<I", count), db=meta)
        for c in used:
            txn.put(log.hwm_key(c), (4096).to_bytes(16, "big"), db=meta)
    for c in range(2, 40):
        env.open_db(log.log_db_name(c))
    env.close()


def test_a_scale_past_the_named_databases_is_refused_and_saves_nothing(tmp_path):
    """Before: the count was saved first, the coordinators then ran out of LMDB named
    databases, and the next open failed for good."""
    data = tmp_path / "d"
    with pulsartxn.Broker(data, sync=False, max_dbs=64, num_coordinators=2) as broker:
        with pytest.raises(QuotaExceeded, match="max_dbs"):
            broker.admin.scale_coordinators(100)
        assert len(broker.admin.coordinators()) == 2
        assert broker.client().new_transaction(coordinator_id=1).id.coordinator_id == 1
    assert stored_count(data) == 2
    with pulsartxn.Broker(data, sync=False, max_dbs=64, num_coordinators=2) as broker:
        assert len(broker.admin.coordinators()) == 2


def test_a_scale_leaves_room_for_the_partitions(tmp_path):
    """Coordinators may not take the named databases that max_partitions promises."""
    with pulsartxn.Broker(
        tmp_path / "d", sync=False, max_dbs=100, num_coordinators=2, max_partitions=60
    ) as broker:
        with pytest.raises(QuotaExceeded, match="max_partitions"):
            broker.admin.scale_coordinators(40)
        broker.admin.scale_coordinators(20)
        assert len(broker.admin.coordinators()) == 20
        broker.create_topic("t", 60)  # every partition it promised still opens
        producer = broker.client().create_producer("t")
        for i in range(60):
            producer.send(b"x", partition_key=str(i))
        producer.flush()


def test_a_scale_past_the_memory_budget_is_refused(tmp_path):
    budget = 10 * COORDINATOR_BYTES
    with pulsartxn.Broker(
        tmp_path / "d", sync=False, num_coordinators=2, max_coordinators_memory_bytes=budget
    ) as broker:
        with pytest.raises(QuotaExceeded, match="max_coordinators_memory_bytes"):
            broker.admin.scale_coordinators(11)
        broker.admin.scale_coordinators(10)
        assert len(broker.admin.coordinators()) == 10
    with pytest.raises(ValueError, match="max_coordinators_memory_bytes"):
        pulsartxn.Broker(tmp_path / "e", num_coordinators=11, max_coordinators_memory_bytes=budget)


def test_the_default_budget_refuses_thousands_of_coordinators_at_once(tmp_path):
    """4000 coordinators cost about a GiB once their outcome rings fill: refused by default,
    before anything is opened or saved."""
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        with pytest.raises(QuotaExceeded):
            broker.admin.scale_coordinators(4000)
        with pytest.raises(QuotaExceeded):
            broker.admin.scale_coordinators(20000)
        assert len(broker.admin.coordinators()) == 16
    assert stored_count(tmp_path / "d") == 16


def test_idle_coordinators_cost_little(tmp_path):
    """A coordinator's outcome ring grows with the transactions it ends: 500 idle ones cost a
    few MB, not 500 rings of 256 KiB (128 MB before)."""
    with pulsartxn.Broker(tmp_path / "d", sync=False, num_coordinators=1) as broker:
        tracemalloc.start()
        try:
            broker.admin.scale_coordinators(500)
            used = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert used < 16 << 20, used


def test_a_bricked_store_opens_with_the_coordinators_it_ran(tmp_path):
    """A store an older broker left with a count it never opened (its coordinators past the
    first ones handed out no id: no sequence was reserved for them) opens with those it ran,
    and the count it saves is theirs."""
    data = tmp_path / "d"
    with pulsartxn.Broker(data, sync=False, num_coordinators=2) as broker:
        client = broker.client(session="s")  # outlives the close
        kept = client.new_transaction(coordinator_id=1)
        broker.client().create_producer("t").send(b"x", txn=kept)
    brick(data, 200)
    with pulsartxn.Broker(data, sync=False, max_dbs=64, num_coordinators=2) as broker:
        assert len(broker.admin.coordinators()) == 2
        assert broker.admin.transaction_metadata(kept.id)["state"] == "OPEN"
        broker.client().transaction(kept.id).commit()
        broker.client().new_transaction(coordinator_id=1).commit()
    assert stored_count(data) == 2


def test_a_store_whose_used_coordinators_do_not_fit_names_the_way_out(tmp_path):
    """Coordinators that handed out ids are never dropped: the open fails, in one line naming
    the option that opens it."""
    data = tmp_path / "d"
    pulsartxn.Broker(data, sync=False, num_coordinators=2).close()
    brick(data, 60, used=range(60))
    with pytest.raises(InvalidConfiguration) as raised:
        pulsartxn.Broker(data, sync=False, max_dbs=64, num_coordinators=2)
    message = str(raised.value)
    assert "\n" not in message and "--max-dbs" in message and "max_dbs=" in message
    with pulsartxn.Broker(data, sync=False, max_dbs=128, num_coordinators=2) as broker:
        assert len(broker.admin.coordinators()) == 60
