"""Load: 10k concurrently open transactions, 1M aborted TxnIDs in one partition, 64 producer
and consumer threads, 600 messages of 1 MiB taken by one consumer, 2000 consumers parked on
one subscription. Memory is reported (RSS from /proc/self/status) and bounded, a watchdog
dumps every thread's stack and fails the test if a deadline passes, throughput is printed
(``pytest -s`` shows it). ``PULSARTXN_LOAD_SCALE=10`` runs it ten times larger (the aborted
TxnIDs at most 4x: 4M; the large messages and parked consumers as they are)."""

from __future__ import annotations

import faulthandler
import gc
import os
import random
import sys
import threading
import time

import pytest

import pulsartxn
from pulsartxn import TxnID
from pulsartxn._native import encode_entry
from pulsartxn._native.types import MarkerType
from pulsartxn.txn import log
from tests.helpers import scanned

SCALE = float(os.environ.get("PULSARTXN_LOAD_SCALE", "1"))
pytestmark = pytest.mark.slow


def memory() -> dict:
    """VmRSS, VmHWM (peak) and RssAnon (RSS but mapped files: LMDB's pages) of this process,
    in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon"):
                out[key] = int(value.split()[0]) / 1024.0
    return out


def report(what: str, **figures) -> None:
    text = ", ".join(
        f"{k}={v:,.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
    )
    print(f"\n[load] {what}: {text}", flush=True)


class Watchdog:
    """Fails the test if the block has not finished by `seconds`: dumps every thread's stack
    first. As a last resort (a deadlock the test cannot get out of) the process exits."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds * max(SCALE, 1.0)
        self.what = what
        self.fired = threading.Event()
        self.deadline = 0.0

    def __enter__(self) -> Watchdog:
        self.deadline = time.monotonic() + self.seconds
        faulthandler.dump_traceback_later(self.seconds + 60, exit=True)
        self.timer = threading.Timer(self.seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()
        return self

    def _fire(self) -> None:
        self.fired.set()
        print(f"\n[watchdog] {self.what}: {self.seconds:.0f} s passed; stacks:", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def join(self, threads) -> None:
        for t in threads:
            t.join(self.remaining())
            if t.is_alive():
                self._fire()
                pytest.fail(f"{self.what}: thread {t.name} stuck (deadlock?); stacks dumped")

    def check(self) -> None:
        if self.fired.is_set():
            pytest.fail(f"{self.what}: deadline of {self.seconds:.0f} s passed; stacks dumped")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.timer.cancel()
        faulthandler.cancel_dump_traceback_later()
        if exc_type is None:
            self.check()


def run_threads(n: int, target, wd: Watchdog, name: str) -> None:
    """Run target(i) on n threads; re-raise the first error; the watchdog bounds the wait."""
    errors: list = []

    def body(i):
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), name=f"{name}-{i}") for i in range(n)]
    for t in threads:
        t.daemon = True
        t.start()
    wd.join(threads)
    if errors:
        raise errors[0]


def drain(consumer, timeout_ms: int = 300) -> list[bytes]:
    out: list[bytes] = []
    while True:
        msgs = consumer.batch_receive(max_num_messages=1000, timeout_millis=timeout_ms)
        if not msgs:
            return out
        for m in msgs:
            consumer.acknowledge(m)
        out.extend(m.data() for m in msgs)


def test_ten_thousand_open_transactions(tmp_path):
    n = int(10_000 * SCALE)
    threads = 16
    with (
        Watchdog(60, "10k open transactions") as wd,
        pulsartxn.Broker(tmp_path / "data", num_coordinators=4, sync=False) as broker,
    ):
        broker.create_topic("open", partitions=8)
        client = broker.client()
        producers = [client.create_producer("open") for _ in range(threads)]
        txns: list = [None] * n
        base = memory()
        start = time.monotonic()

        def begin(w):
            for i in range(w, n, threads):
                txn = client.new_transaction()
                producers[w].send(f"m{i}".encode(), partition_key=f"k{i}", txn=txn)
                txns[i] = txn

        run_threads(threads, begin, wd, "begin")
        began_s = time.monotonic() - start
        held = memory()
        # All of them are open at once: every coordinator and buffer knows it.
        active = sum(c["active"] for c in broker.admin.coordinators())
        assert active == n
        tb = broker.admin.transaction_buffer_stats("open")["partitions"]
        assert sum(p["ongoing_txn_size"] for p in tb.values()) == n
        assert len({t.id for t in txns}) == n

        start = time.monotonic()

        def end(w):
            for i in range(w, n, threads):
                (txns[i].commit if i % 2 == 0 else txns[i].abort)()

        run_threads(threads, end, wd, "end")
        ended_s = time.monotonic() - start
        assert sum(c["active"] for c in broker.admin.coordinators()) == 0
        consumer = client.subscribe(
            "open", "check", initial_position=pulsartxn.InitialPosition.Earliest
        )
        start = time.monotonic()
        got = drain(consumer)
        consumed_s = time.monotonic() - start
        assert len(got) == len(set(got))
        assert set(got) == {f"m{i}".encode() for i in range(0, n, 2)}
        per_txn_kib = (held["VmRSS"] - base["VmRSS"]) * 1024.0 / n
        report(
            f"{n} open transactions",
            begin_and_send_per_s=n / began_s,
            end_per_s=n / ended_s,
            consume_msgs_per_s=len(got) / consumed_s,
            rss_mib_before=base["VmRSS"],
            rss_mib_all_open=held["VmRSS"],
            kib_per_open_txn=per_txn_kib,
            peak_mib=memory()["VmHWM"],
        )
        # Bounded: a few KiB per open transaction (coordinator, buffer, client handle).
        assert per_txn_kib < 16, per_txn_kib


def test_million_aborted_txnids_in_one_partition(tmp_path):
    """1M aborted TxnIDs of coordinator 0, written in bulk as their abort markers would have
    been (one LMDB transaction per 100k), plus 1,000 aborted and 1,000 committed messages
    among them: recovery rebuilds the abort set, reads filter against it, a snapshot reloads
    it, and new transactions keep working beside it."""
    n = int(1_000_000 * min(SCALE, 4.0))  # ~400 B each in memory: capped at 4M
    data = tmp_path / "data"
    with Watchdog(60, "1M aborted TxnIDs"):
        base = memory()
        start = time.monotonic()
        with pulsartxn.Broker(data, num_coordinators=4, sync=False) as broker:
            broker.create_topic("ab", partitions=0)
            part = broker.topics.partition(broker.topic_partitions("ab")[0])
            hwm = (n + 1).to_bytes(16, "big")  # coordinator 0 hands out sequences above them
            broker.storage.write(lambda t: t.put(log.hwm_key(0), hwm, db=broker.storage.meta))
            for lo in range(1, n + 1, 100_000):
                entries = []
                for seq in range(lo, min(lo + 100_000, n + 1)):
                    tid = TxnID(0, seq)
                    msb, lsb = tid.most_sig_bits, tid.least_sig_bits
                    if seq % 1000 == 0:
                        entries.append(
                            encode_entry([b"aborted-%d" % seq], txn_msb=msb, txn_lsb=lsb)
                        )
                        entries.append(encode_entry([b"ok-%d" % seq]))
                    entries.append(
                        encode_entry([], marker_type=MarkerType.TXN_ABORT, txn_msb=msb, txn_lsb=lsb)
                    )
                broker.storage.write(lambda t, e=entries: part.log.append(t, e))
        written_s = time.monotonic() - start
        expected = {b"ok-%d" % s for s in range(1000, n + 1, 1000)}

        start = time.monotonic()
        broker = pulsartxn.Broker(data, num_coordinators=4, sync=False)
        try:
            stats = broker.admin.transaction_buffer_stats("ab")
            recovered_s = time.monotonic() - start
            assert stats["aborted_txn_count"] == n
            assert stats["ongoing_txn_size"] == 0
            loaded = memory()
            client = broker.client()
            start = time.monotonic()
            values = scanned(client, "ab")
            scan_s = time.monotonic() - start
            assert sorted(values) == sorted(expected)
            start = time.monotonic()
            consumer = client.subscribe(
                "ab", "s", initial_position=pulsartxn.InitialPosition.Earliest
            )
            got = drain(consumer, 500)
            dispatch_s = time.monotonic() - start
            assert sorted(got) == sorted(expected)
            # Live transactions beside a 1M abort set: new TxnIDs, filtered by the same set.
            producer = client.create_producer("ab")
            for i in range(20):
                txn = client.new_transaction(coordinator_id=0)
                assert txn.id.sequence > n
                producer.send(b"live-%d" % i, txn=txn)
                (txn.commit if i % 2 else txn.abort)()
            live = drain(consumer)
            assert sorted(live) == sorted(b"live-%d" % i for i in range(1, 20, 2))
        finally:
            start = time.monotonic()
            broker.close()  # takes the snapshot (62 segments for 1M)
            closed_s = time.monotonic() - start
        del broker, client, consumer, producer
        start = time.monotonic()
        with pulsartxn.Broker(data, num_coordinators=4, sync=False) as broker:
            stats = broker.admin.transaction_buffer_stats("ab")
            from_snapshot_s = time.monotonic() - start
            assert stats["aborted_txn_count"] == n + 10
            assert stats["snapshot_load_error"] is None
            assert stats["snapshot_segments"] >= n // 16384  # loaded from the snapshot
            assert len(scanned(broker.client(), "ab")) == len(expected) + 10
        per_abort_b = (loaded["VmRSS"] - base["VmRSS"]) * 1024 * 1024 / n
        report(
            f"{n:,} aborted TxnIDs",
            bulk_write_s=written_s,
            recovery_from_ledger_s=recovered_s,
            scan_s=scan_s,
            dispatch_s=dispatch_s,
            close_with_snapshot_s=closed_s,
            recovery_from_snapshot_s=from_snapshot_s,
            rss_mib_before=base["VmRSS"],
            rss_mib_loaded=loaded["VmRSS"],
            bytes_per_aborted_txn=per_abort_b,
            peak_mib=memory()["VmHWM"],
        )
        # Bounded and linear: the abort set (32 B a slot) plus its positions for trimming.
        assert per_abort_b < 600, per_abort_b


def test_sixty_four_producer_and_consumer_threads(tmp_path):
    producers_n = consumers_n = 32
    txns_each = int(12 * SCALE)
    per_txn = 10
    with (
        Watchdog(90, "64 threads") as wd,
        pulsartxn.Broker(tmp_path / "data", num_coordinators=8, sync=False) as broker,
    ):
        broker.create_topic("work", partitions=8)
        client = broker.client()
        consumers = [
            client.subscribe(
                "work",
                "w",
                subscription_type=pulsartxn.ConsumerType.Shared,
                initial_position=pulsartxn.InitialPosition.Earliest,
            )
            for _ in range(consumers_n)
        ]
        lock = threading.Lock()
        produced: list[bytes] = []
        consumed: list[bytes] = []
        aborted_acks = [0]
        producers_done = threading.Event()
        stop = threading.Event()
        base = memory()
        peak = [base["VmRSS"]]

        def produce(w):
            rng = random.Random(w)
            producer = client.create_producer("work")
            for j in range(txns_each):
                txn = client.new_transaction()
                batch = [f"p{w}-{j}-{i}".encode() for i in range(per_txn)]
                for i, payload in enumerate(batch):
                    producer.send_async(payload, partition_key=f"{w}-{j}-{i}", txn=txn)
                if rng.random() < 0.1:
                    txn.abort()
                    continue
                txn.commit()
                with lock:
                    produced.extend(batch)

        def consume(w):
            rng = random.Random(1000 + w)
            consumer = consumers[w]
            while not stop.is_set():
                msgs = consumer.batch_receive(max_num_messages=20, timeout_millis=50)
                if not msgs:
                    continue
                txn = client.new_transaction()
                for m in msgs:
                    consumer.acknowledge(m, txn=txn)
                if rng.random() < 0.1:
                    txn.abort()  # its messages are delivered again
                    with lock:
                        aborted_acks[0] += len(msgs)
                    continue
                txn.commit()
                with lock:
                    consumed.extend(m.data() for m in msgs)

        def sample_memory():
            while not stop.is_set():
                peak[0] = max(peak[0], memory()["VmRSS"])
                stop.wait(0.2)

        start = time.monotonic()
        workers = [threading.Thread(target=sample_memory, daemon=True)]
        errors: list = []

        def guard(fn, i):
            try:
                fn(i)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)
                stop.set()

        prod = [
            threading.Thread(target=guard, args=(produce, i), name=f"producer-{i}", daemon=True)
            for i in range(producers_n)
        ]
        cons = [
            threading.Thread(target=guard, args=(consume, i), name=f"consumer-{i}", daemon=True)
            for i in range(consumers_n)
        ]
        for t in workers + prod + cons:
            t.start()
        wd.join(prod)
        producers_done.set()
        produced_s = time.monotonic() - start
        expected = len(produced)
        while not errors:
            with lock:
                if len(consumed) >= expected:
                    break
            if wd.fired.is_set() or wd.remaining() == 0:
                wd._fire()
                pytest.fail(f"consumed {len(consumed)} of {expected} before the deadline")
            time.sleep(0.01)
        elapsed = time.monotonic() - start
        stop.set()
        wd.join(cons + workers)
        if errors:
            raise errors[0]
        assert len(consumed) == len(set(consumed)), "a message was consumed twice"
        assert set(consumed) == set(produced), "consumed differs from what was committed"
        leftover = drain(consumers[0], 200)
        assert leftover == []
        stats = broker.admin.coordinators()
        assert sum(c["active"] for c in stats) == 0
        report(
            "64 threads (32 producers, 32 consumers)",
            committed_msgs=expected,
            produce_msgs_per_s=expected / produced_s,
            consume_msgs_per_s=len(consumed) / elapsed,
            txns_per_s=(producers_n * txns_each + len(consumed) / 10) / elapsed,
            redelivered_after_abort=aborted_acks[0],
            rss_mib_before=base["VmRSS"],
            rss_mib_peak_during=peak[0],
        )
        assert peak[0] - base["VmRSS"] < 512, "memory grew by more than 512 MiB"


def test_one_consumer_of_large_messages_holds_a_bounded_amount(tmp_path):
    """600 messages of 1 MiB: ``batch_receive(10**9)`` takes 64 MiB of them (it took all 600,
    2.3 GB of RSS through the network service), and once the consumer that held them all
    closes, the subscription keeps their positions, not their payloads (it kept 600 MiB)."""
    n, size = 600, 1 << 20
    with (
        Watchdog(120, "600 x 1 MiB") as wd,
        pulsartxn.Broker(tmp_path / "data", sync=False) as broker,
    ):
        client = broker.client()
        producer = client.create_producer("big", batching_enabled=False)
        for i in range(n):
            producer.send(i.to_bytes(4, "big") * (size // 4))
        consumer = client.subscribe(
            "big",
            "s",
            subscription_type=pulsartxn.ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        gc.collect()
        base = memory()["RssAnon"]
        start = time.monotonic()
        msgs = consumer.batch_receive(10**9, 2000)
        took_s = time.monotonic() - start
        one_call = memory()["RssAnon"]
        assert len(msgs) == 64 and sum(len(m.data()) for m in msgs) == 64 * size
        got = len(msgs)
        del msgs
        while got < n:
            wd.check()
            got += len(consumer.batch_receive(10**9, 2000))
        assert got == n
        consumer.close()
        gc.collect()
        closed = memory()["RssAnon"]
        again = client.subscribe(
            "big",
            "s",
            subscription_type=pulsartxn.ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        first = again.batch_receive(10**9, 2000)
        assert [m.data()[:4] for m in first] == [i.to_bytes(4, "big") for i in range(64)]
        assert {m.redelivery_count() for m in first} == {1}
        report(
            f"{n} x 1 MiB, one consumer",
            first_call_s=took_s,
            anon_mib_before=base,
            anon_mib_one_call=one_call,
            anon_mib_after_close=closed,
            peak_mib=memory()["VmHWM"],
        )
        assert one_call - base < 200, one_call - base
        assert closed - base < 64, closed - base


def test_two_thousand_parked_consumers_close_in_bounded_cpu(tmp_path):
    """2000 consumers parked in ``receive()`` on one Shared subscription, then closed one by
    one: each close wakes its own receive only (it woke every other consumer, each of which
    polled the subscription: 1000 consumers took 32 s of CPU through the network service,
    2000 more than two minutes)."""
    n = 2000
    with (
        Watchdog(120, "2000 parked consumers") as wd,
        pulsartxn.Broker(tmp_path / "data", sync=False) as broker,
    ):
        client = broker.client()
        kind = pulsartxn.ConsumerType.Shared
        consumers = [
            client.subscribe(
                "idle",
                "s",
                subscription_type=kind,
                initial_position=pulsartxn.InitialPosition.Earliest,
            )
            for _ in range(n)
        ]
        closed = []

        def park(i):
            try:
                consumers[i].receive()
            except pulsartxn.AlreadyClosed:
                closed.append(i)

        threads = [threading.Thread(target=park, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        while sum(c._parked for c in consumers) < n:
            wd.check()
            time.sleep(0.01)
        cpu, wall = time.process_time(), time.monotonic()
        for c in consumers:
            c.close()
        wd.join(threads)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        wakeups = sum(c._signal for c in consumers)
        report(f"{n} parked consumers closed", cpu_s=cpu, wall_s=wall, wakeups=wakeups)
        assert sorted(closed) == list(range(n))
        assert wakeups == n
        assert cpu < 10, cpu  # about 0.5 s; generous for a shared machine
