"""The native per-partition producer and its twin store the same messages, answer the same ids."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pulsartxn
from pulsartxn._native import load
from pulsartxn.errors import InvalidTxnStatus
from pulsartxn.messaging import producer as producer_module
from pulsartxn.messaging import txn_batches as txn_batches_module

NATIVE, REFERENCE = load("native"), load("reference")

sends = st.lists(
    st.tuples(
        st.binary(max_size=40),
        st.one_of(st.none(), st.sampled_from(["a", "b"])),
        st.one_of(st.none(), st.just({"p": "q"})),
        st.one_of(st.none(), st.integers(0, 30)),
        st.booleans(),  # flush after this one
    ),
    max_size=40,
)


@contextmanager
def producers_of(impl):
    """The producer modules on `impl`'s batch containers and transaction batches."""
    old = producer_module.PartitionProducer, txn_batches_module.TxnBatch
    producer_module.PartitionProducer = impl.PartitionProducer
    txn_batches_module.TxnBatch = impl.TxnBatch
    try:
        yield
    finally:
        producer_module.PartitionProducer, txn_batches_module.TxnBatch = old


@contextmanager
def producing_with(impl, tmp_path, name):
    """(client, producer of "t" in batches of 4) on a fresh broker, on `impl`'s containers."""
    with producers_of(impl), pulsartxn.Broker(tmp_path / name, sync=False) as broker:
        client = broker.client()
        p = client.create_producer(
            "t",
            producer_name="p",
            batching_max_messages=4,
            batching_max_publish_delay_ms=60_000,
        )
        assert type(p._parts[0]) is impl.PartitionProducer
        yield client, p


def run(impl, tmp_path, workload, name):
    with producing_with(impl, tmp_path, name) as (client, p):
        futures = []
        for value, key, props, seq, flush in workload:
            futures.append(
                p.send_async(value, properties=props, partition_key=key, sequence_id=seq)
            )
            if flush:
                p.flush()
        p.flush()
        ids = [(f.result().entry_id(), f.result().batch_index()) for f in futures]
        assert len(ids) == len(workload)
        stored = [
            (r["entry_id"], r["batch_index"], r["key"], r["value"], r["properties"])
            for b in client.scan("t")
            for r in b.to_pylist()
        ]
        return ids, stored, p.last_sequence_id()


@settings(max_examples=25, deadline=None)
@given(sends)
def test_native_and_twin_producers_agree(tmp_path_factory, workload):
    tmp = tmp_path_factory.mktemp("prod")
    assert run(NATIVE, tmp, workload, "n") == run(REFERENCE, tmp, workload, "r")


txn_sends = st.lists(
    st.tuples(
        st.binary(max_size=40),
        st.integers(0, 2),  # which of three transactions
        st.one_of(st.none(), st.sampled_from(["a", "b"])),  # a key leaves the fast path
        st.sampled_from(["none", "flush", "commit", "abort"]),  # what follows this send
    ),
    max_size=40,
)


def run_txns(impl, tmp_path, workload, name):
    with producing_with(impl, tmp_path, name) as (client, p):
        txns = [client.new_transaction() for _ in range(3)]
        outcomes = []
        sent: dict = {}  # transaction -> values sent in it
        committed = []
        for value, which, key, then in workload:
            fut = p.send_async(value, partition_key=key, txn=txns[which])
            outcomes.append(fut)
            sent.setdefault(txns[which].id, []).append(value)
            if then == "flush":
                p.flush()
            elif then in ("commit", "abort"):
                getattr(txns[which], then)()
                if then == "commit":
                    committed.extend(sent.get(txns[which].id, []))
                txns[which] = client.new_transaction()
        for t in txns:
            t.commit()
            committed.extend(sent.get(t.id, []))
        answers = []
        for f in outcomes:
            exc = f.exception()
            answers.append(type(exc).__name__ if exc else f.result().batch_index())
        stored = [(r["key"], r["value"]) for b in client.scan("t") for r in b.to_pylist()]
        assert sorted(v for _, v in stored) == sorted(committed)  # read committed
        return answers, stored


@settings(max_examples=25, deadline=None)
@given(txn_sends)
def test_native_and_twin_agree_on_transactional_sends(tmp_path_factory, workload):
    tmp = tmp_path_factory.mktemp("prodtxn")
    assert run_txns(NATIVE, tmp, workload, "n") == run_txns(REFERENCE, tmp, workload, "r")


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "reference"])
def test_transactional_fast_path_ends_with_its_batch(impl, tmp_path):
    """The send path appends a transaction's plain messages to the batch the producer opened
    for it last; another transaction's send, a commit or an abort closes that, and a send
    with a finished transaction raises without storing anything."""
    with producers_of(impl), pulsartxn.Broker(tmp_path / "b", sync=False) as broker:
        client = broker.client()
        p = client.create_producer("t", batching_max_publish_delay_ms=60_000)
        part = p._parts[0]
        a, b = client.new_transaction(), client.new_transaction()
        fa = [p.send_async(b"a%d" % i, txn=a) for i in range(3)]
        fb = [p.send_async(b"b%d" % i, txn=b) for i in range(3)]  # b's batch is the open one
        # a's next sequence id is not next in a's batch: that one is sent, a new one opened.
        fa.append(p.send_async(b"a3", txn=a))
        assert [len(x.values) for x in p._txn_batches.values()] == [3, 1]
        fa.append(p.send_async(b"a4", txn=a))  # the open batch is a's again
        a.commit()
        assert [f.result().batch_index() for f in fa] == [0, 1, 2, 0, 1]
        with pytest.raises(InvalidTxnStatus):
            p.send_async(b"late", txn=a)
        b.abort()  # written, aborted: answered, never read
        assert [f.result().batch_index() for f in fb] == [0, 1, 2]
        with pytest.raises(InvalidTxnStatus):
            p.send_async(b"late", txn=b)
        # Nothing of a finished transaction is held: no open batch, no transaction.
        assert not p._txn_batches
        c = client.new_transaction()
        p.send_async(b"c0", txn=c)
        batch = next(iter(p._txn_batches.values()))
        c.commit()
        assert batch.sealed and not p._txn_batches
        with pytest.raises(InvalidTxnStatus):
            part.send_async(b"c1", txn=c)
        values = [r["value"] for x in client.scan("t") for r in x.to_pylist()]
        assert values == [b"a0", b"a1", b"a2", b"a3", b"a4", b"c0"]


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "reference"])
def test_duplicate_of_a_message_still_in_its_batch(impl, tmp_path):
    _, _, last = run(
        impl, tmp_path, [(b"a", None, None, 5, False), (b"a2", None, None, 5, False)], "d"
    )
    assert last == 5


# -- the per-message future -------------------------------------------------------------------


@contextmanager
def producer_on(impl, tmp_path, **options):
    """A one-partition producer whose partition container is `impl`'s, on its own broker."""
    with producers_of(impl), pulsartxn.Broker(tmp_path / "b", sync=False) as broker:
        client = broker.client()
        options.setdefault("batching_max_messages", 10)
        options.setdefault("batching_max_publish_delay_ms", 60_000)
        p = client.create_producer("t", producer_name="p", **options)
        assert type(p._parts[0]) is impl.PartitionProducer
        yield p


def eventually(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def stored_values(p):
    return [v for b in p.client.scan("t") for v in b.column("value").to_pylist()]


def test_future_protocol_while_queued_and_when_durable(impl, tmp_path):
    with producer_on(impl, tmp_path) as p:
        fut = p.send_async(b"a")
        assert isinstance(fut, Future)
        assert not fut.done() and fut.running()
        assert fut.cancel() is False  # a queued message cannot be taken back
        assert not fut.cancelled()
        with pytest.raises(FutureTimeout):
            fut.result(timeout=0.01)
        with pytest.raises(FutureTimeout):
            fut.exception(timeout=0.01)
        assert "running" in repr(fut)
        p.flush()
        assert fut.done() and not fut.running() and not fut.cancelled()
        assert fut.exception() is None
        mid = fut.result(timeout=0)
        assert (mid.entry_id(), mid.batch_index()) == (0, -1)
        assert fut.result() is mid  # made once
        assert "finished" in repr(fut)
        assert stored_values(p) == [b"a"]


def test_callbacks_run_once_in_order_and_after_done_at_once(impl, tmp_path, caplog):
    with producer_on(impl, tmp_path) as p:
        seen = []
        futures = [p.send_async(b"%d" % i) for i in range(3)]
        futures[1].add_done_callback(lambda f: seen.append(("first", f.result().batch_index())))
        futures[1].add_done_callback(lambda f: 1 / 0)  # logged, the others still run
        futures[1].add_done_callback(lambda f: seen.append(("second", f.result().batch_index())))
        futures[2].add_done_callback(lambda f: seen.append(("other", f.result().batch_index())))
        assert seen == []
        with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
            p.flush()
            # As with any Future, callbacks run just after the futures are marked done.
            eventually(lambda: len(seen) == 3)
        assert seen == [("first", 1), ("second", 1), ("other", 2)]
        assert "exception calling callback" in caplog.text
        p.flush()
        assert seen == [("first", 1), ("second", 1), ("other", 2)]  # once only
        futures[0].add_done_callback(lambda f: seen.append(("late", f.result().batch_index())))
        assert seen[-1] == ("late", 0)  # already durable: called at once


def test_native_futures_stay_out_of_the_collector_until_they_hold_a_callback_or_waiter(
    tmp_path,
):
    """A native message future refers to its batch's Outcome only, so the garbage collector
    need not walk it (a caller that keeps its futures would pay for every one at each
    collection); once it holds a callback or a waiter, which may refer back to it, it is
    tracked again, and such a cycle is collected once the batch has landed."""
    import gc

    with producer_on(NATIVE, tmp_path) as p:
        plain = p.send_async(b"a")
        called = p.send_async(b"b")
        waited = p.send_async(b"c")
        assert not gc.is_tracked(plain)
        assert not gc.is_tracked(called) and not gc.is_tracked(waited)
        seen = []
        called.add_done_callback(lambda f, keep=called: seen.append(keep.result()))
        assert gc.is_tracked(called)
        done, not_done = wait([waited], timeout=0.01)  # registers a waiter, times out
        assert not done and gc.is_tracked(waited)
        assert not gc.is_tracked(plain)
        p.flush()
        eventually(lambda: seen)
        assert seen == [called.result()] and waited.result().batch_index() == 2
        assert plain.result().batch_index() == 0
        # Keeping futures (the caller's list) leaves them untracked, answers and all.
        kept = [p.send_async(b"%d" % i) for i in range(100)]
        p.flush()
        assert not any(gc.is_tracked(f) for f in kept)
        ids = [f.result() for f in kept]
        assert ids == sorted(set(ids)) and len(ids) == 100


def test_producer_callback_and_futures_of_a_duplicate(impl, tmp_path):
    with producer_on(impl, tmp_path) as p:
        got = []
        first = p.send_async(b"x", sequence_id=3, callback=lambda e, m: got.append((e, m)))
        again = p.send_async(b"x", sequence_id=3)  # still in its batch: same answer
        p.flush()
        eventually(lambda: got)
        assert got == [(pulsartxn.Result.Ok, first.result())]
        assert again.result() == first.result()
        assert p.send_async(b"x", sequence_id=3).result(timeout=0) == first.result()
        assert stored_values(p) == [b"x"]


def test_resends_of_aborted_sequences_are_stored_anew(impl, tmp_path):
    """Sequence ids of an aborted send do not count: their resends make one new batch (a
    resend still in it is a duplicate) and the producer's last sequence id stays."""
    with producer_on(impl, tmp_path) as p:
        txn = p.client.new_transaction()
        for i in range(4):
            p.send_async(b"a%d" % i, sequence_id=i, txn=txn)
        p.flush()
        txn.abort()
        p.send(b"n4", sequence_id=4)
        again = [p.send_async(b"r%d" % i, sequence_id=i) for i in range(4)]
        dup = p.send_async(b"r1-again", sequence_id=1)
        p.flush()
        ids = [f.result() for f in again]
        assert len({m.entry_id() for m in ids}) == 1
        assert [m.batch_index() for m in ids] == [0, 1, 2, 3]
        assert dup.result() == ids[1]
        assert p.send(b"r2-again", sequence_id=2) == ids[2]
        assert p.last_sequence_id() == 4
        # Aborted while it waited in its batch: the abort writes it, aborted; it does not
        # count either.
        aborted = p.client.new_transaction()
        waiting = p.send_async(b"w5", sequence_id=5, txn=aborted)
        aborted.abort()
        assert waiting.result().entry_id() > ids[0].entry_id()
        assert p.send(b"w5-retry", sequence_id=5).entry_id() > waiting.result().entry_id()
        assert p.last_sequence_id() == 5
        assert stored_values(p) == [b"n4", b"r0", b"r1", b"r2", b"r3", b"w5-retry"]


def test_wait_as_completed_and_asyncio_take_the_futures(impl, tmp_path):
    with producer_on(impl, tmp_path, batching_max_messages=4) as p:
        futures = [p.send_async(b"%d" % i) for i in range(6)]  # one full batch, two waiting
        done, not_done = wait(futures, timeout=10, return_when=FIRST_COMPLETED)
        assert done == set(futures[:4]) and not_done == set(futures[4:])
        threading.Timer(0.05, p.flush).start()
        assert sorted(f.result() for f in as_completed(futures, timeout=10)) == [
            f.result() for f in futures
        ]

        fut = p.send_async(b"async")

        async def through_asyncio():
            return await asyncio.wrap_future(fut)

        threading.Timer(0.05, p.flush).start()
        assert asyncio.run(through_asyncio()).entry_id() == 2


def test_a_failed_write_fails_every_future_of_the_batch(impl, tmp_path, monkeypatch):
    with producer_on(impl, tmp_path) as p:
        ok = p.send_async(b"kept")
        p.flush()
        partition = p._parts[0].partition
        real = partition.append_op

        def failing(*args, **kwargs):
            op = real(*args, **kwargs)

            def apply(txn):
                raise RuntimeError("disk on fire")

            op.apply = apply
            return op

        monkeypatch.setattr(partition, "append_op", failing)
        got = []
        futures = [p.send_async(b"lost%d" % i) for i in range(3)]
        cb = p.send_async(b"lost-cb", callback=lambda e, m: got.append((e, m)))
        futures[0].add_done_callback(lambda f: got.append((f.exception(), "fut")))
        waiter = threading.Thread(
            target=lambda: got.append(("waited", futures[1].exception(timeout=10)))
        )
        waiter.start()
        p.flush()  # does not raise: the futures report it
        waiter.join(10)
        eventually(lambda: len(got) == 3)
        for f in [*futures, cb]:
            assert f.done()
            assert isinstance(f.exception(), RuntimeError)
            with pytest.raises(RuntimeError, match="disk on fire"):
                f.result()
        error = futures[0].exception()
        assert sorted(got, key=repr) == sorted(
            [(error, "fut"), (error, None), ("waited", error)], key=repr
        )
        monkeypatch.undo()
        assert stored_values(p) == [b"kept"]
        assert ok.result().entry_id() == 0
        assert p.send(b"after").entry_id() == 1


def test_send_async_checks_before_queueing(impl, tmp_path):
    with producer_on(impl, tmp_path) as p:
        with pytest.raises(pulsartxn.MessageTooBig):
            p.send_async(b"x" * (p.max_message_size + 1))
        with pytest.raises(TypeError):
            p.send_async("str")
        fut = p.send_async(bytearray(b"ba"))
        p.close()
        assert fut.result(timeout=0).entry_id() == 0
        with pytest.raises(pulsartxn.AlreadyClosed):
            p.send_async(b"late")
        assert stored_values(p) == [b"ba"]


def test_publish_delay_flushes_each_lone_batch_after_full_and_idle_ones(impl, tmp_path):
    # The container asks the broker's flusher to watch it once per idle period, not per batch:
    # a lone message right after a full batch, after an idle full batch, and after a lone one
    # that the delay sent, all still go out on time.
    with producer_on(impl, tmp_path, batching_max_messages=3, batching_max_publish_delay_ms=5) as p:
        for _ in range(2):
            futures = [p.send_async(b"%d" % i) for i in range(4)]  # a full batch + a lone one
            assert [f.result(timeout=10).batch_index() for f in futures] == [0, 1, 2, -1]
            time.sleep(0.05)
            full = [p.send_async(b"%d" % i) for i in range(3)]  # sent when full
            assert full[-1].result(timeout=10).batch_index() == 2
            time.sleep(0.05)  # the flusher finds nothing waiting and lets the container go
            assert p.send_async(b"lone").result(timeout=10).batch_index() == -1
            time.sleep(0.05)
        assert len(stored_values(p)) == 16


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "reference"])
def test_waiting_on_a_transactional_future_writes_its_batch_now(impl, tmp_path):
    """result() and exception() write the waiting transaction batch in the caller's thread:
    the answer is there at once (timeout=0), stored but invisible until the commit; wait()
    and as_completed() hand the write to the broker's flusher."""
    with producer_on(impl, tmp_path, batching_max_messages=1000) as p:
        client = p.client
        txn = client.new_transaction()
        futures = [p.send_async(b"%d" % i, txn=txn) for i in range(5)]
        assert not any(f.done() for f in futures)  # the batch waits for more
        mid = futures[2].result(timeout=0)
        assert (mid.entry_id(), mid.batch_index(), mid.batch_size()) == (0, 2, 5)
        assert all(f.done() for f in futures)
        assert stored_values(p) == []  # stored, not committed
        later = p.send_async(b"later", txn=txn)
        assert later.exception(timeout=0) is None
        txn.commit()
        assert stored_values(p) == [b"%d" % i for i in range(5)] + [b"later"]

        txn = client.new_transaction()
        futures = [p.send_async(b"w%d" % i, txn=txn) for i in range(3)]
        done, not_done = wait(futures, timeout=10)
        assert not not_done
        futures = [p.send_async(b"c%d" % i, txn=txn) for i in range(3)]
        assert len(list(as_completed(futures, timeout=10))) == 3
        txn.abort()
        assert stored_values(p)[-1] == b"later"  # nothing of the aborted one shows


def test_a_sequence_id_at_the_top_is_refused_and_the_name_keeps_working(impl, tmp_path):
    """Before: sequence_id=2**63-1 was stored, the next send's sequence id overflowed, and
    every later send of the producer name failed, also after a restart. Explicit ids stop at
    2**62-1: the ids assigned after one have 2**62 of headroom."""
    from pulsartxn.messaging.producer import MAX_EXPLICIT_SEQUENCE_ID as top

    data = tmp_path / "b"
    with producers_of(impl), pulsartxn.Broker(data, sync=False) as broker:
        client = broker.client()
        p = client.create_producer("t", producer_name="p", batching_enabled=False)
        txn = client.new_transaction()
        for bad in (2**63 - 1, top + 1, 2**64, -1):
            for send in (p.send, p.send_async, lambda *a, **k: p.send(*a, txn=txn, **k)):
                with pytest.raises(ValueError, match="sequence_id"):
                    send(b"x", sequence_id=bad)
        txn.commit()
        assert p.last_sequence_id() == -1
        p.send(b"a")
        at_top = p.send(b"top", sequence_id=top)
        p.send(b"after")  # assigned: top + 1, in the headroom
        txn = client.new_transaction()
        p.send(b"in-txn", txn=txn)
        txn.commit()
        assert p.last_sequence_id() == top + 2
        p.close()
    with producers_of(impl), pulsartxn.Broker(data, sync=False) as broker:
        p = broker.client().create_producer("t", producer_name="p")
        assert p.last_sequence_id() == top + 2
        p.send(b"restarted")
        assert p.send(b"dup", sequence_id=top) == at_top
        assert stored_values(p) == [b"a", b"top", b"after", b"in-txn", b"restarted"]


def test_a_name_with_every_sequence_id_used_fails_cleanly(impl, tmp_path):
    """A store where an older broker let a producer name reach 2**63-1: its next send is a
    clear error that changes nothing (before: a negative sequence id in the native producer
    and a lost message, a struct error in its twin), and other names are unaffected."""
    import struct

    with producer_on(impl, tmp_path) as p:
        client = p.client
        partition = p._parts[0].partition
        key = partition._dedup_prefix + b"old"
        partition.storage.write(
            lambda t: t.put(key, struct.pack("<q", 2**63 - 1), db=partition._dedup_db)
        )
        old = client.create_producer("t", producer_name="old", batching_max_messages=10)
        txn = client.new_transaction()
        for send in (
            old.send,
            old.send_async,
            lambda v: old.send(v, txn=txn),
            lambda v: old.send_async(v, txn=txn),
            lambda v: old.send_batch([v, v]),
        ):
            with pytest.raises(ValueError, match="every sequence id"):
                send(b"x")
            assert old.last_sequence_id() == 2**63 - 1
        old.flush()
        txn.commit()
        p.send(b"other names work")
        assert stored_values(p) == [b"other names work"]


def test_keywords_and_callback_order_agree_on_both_containers(impl, tmp_path):
    """The container's send_async takes pulsar-client's order (callback second) and hands a
    keyword it does not name to the producer's method, which names the nearest one."""
    with producer_on(impl, tmp_path) as p:
        assert p.send_async == p._parts[0].send_async  # the container answers
        with pytest.raises(TypeError, match="'partiton_key'; did you mean 'partition_key'"):
            p.send_async(b"x", partiton_key="k")
        with pytest.raises(TypeError, match="second argument is the callback"):
            p.send_async(b"x", {"k": "v"})
        got = []
        fut = p.send_async(b"cb", lambda res, mid: got.append((res, mid)))
        plain = p.send_async(b"plain", None, {"k": "v"})
        p.flush()
        eventually(lambda: got)
        assert got == [(pulsartxn.Result.Ok, fut.result())]
        assert plain.result().entry_id() == fut.result().entry_id()
        assert stored_values(p) == [b"cb", b"plain"]
