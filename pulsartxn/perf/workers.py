"""The four perf workloads. Each worker runs operations while the Recorder lets it claim one:
a failed operation is counted by its exception's type and the worker goes on."""

from __future__ import annotations

import os
import random
import threading
import time

import pulsartxn

SUBSCRIPTION_TYPES = {
    "Exclusive": pulsartxn.ConsumerType.Exclusive,
    "Shared": pulsartxn.ConsumerType.Shared,
    "Failover": pulsartxn.ConsumerType.Failover,
    "Key_Shared": pulsartxn.ConsumerType.KeyShared,
}


class Pacer:
    """At most `rate` operations per second for one worker (0: unlimited)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()

    def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next > now:
            time.sleep(self.next - now)
        self.next = max(self.next, now) + self.interval


def _quiet_abort(txn) -> None:
    try:
        txn.abort()
    except pulsartxn.PulsarTxnError:
        pass  # already ended (timed out, or aborted by its failed operation)


class _Txns:
    """The worker's open transaction of `size` messages or acks (size 0: none)."""

    def __init__(self, client, args, rec) -> None:
        self.client, self.size, self.rec = client, args.txn_size, rec
        self.timeout_ms = args.txn_timeout_ms or None
        self.txn, self.n = None, 0

    def current(self):
        if self.size and self.txn is None:
            self.txn = self.client.new_transaction(timeout_ms=self.timeout_ms)
        return self.txn

    def added(self, n: int) -> None:
        self.n += n
        if self.txn is not None and self.n >= self.size:
            self.end()

    def end(self) -> None:
        txn, self.txn, self.n = self.txn, None, 0
        if txn is None:
            return
        start = time.perf_counter()
        try:
            txn.commit()
        except Exception as exc:  # noqa: BLE001 - counted, the run goes on
            self.rec.fail(exc, start, op=False)

    def drop(self) -> None:
        """After a failed operation: its transaction can only abort."""
        if self.txn is not None:
            _quiet_abort(self.txn)
        self.txn, self.n = None, 0


def produce(client, args, rec, pacer, index: int) -> None:
    """send_async with at most --max-outstanding awaiting completion, --sync or --batch."""
    producer = client.create_producer(
        args.topic,
        max_pending_messages=max(args.max_outstanding, 1000),
        block_if_queue_full=True,
    )
    value = os.urandom(args.size)
    txns = _Txns(client, args, rec)
    permits = threading.BoundedSemaphore(args.max_outstanding)

    def completed(start, nbytes):
        def callback(result, msg_id):
            permits.release()
            if isinstance(result, BaseException):
                rec.fail(result, start)
            else:
                rec.add(1, nbytes, start)

        return callback

    try:
        while rec.claim():
            pacer.wait()
            start = time.perf_counter()
            try:
                txn = txns.current()
                if args.sync:
                    producer.send(value, txn=txn)
                    n = 1
                elif args.batch:
                    n = producer.send_batch([value] * args.batch, txn=txn)
                else:
                    if not permits.acquire(blocking=False):
                        producer.flush()  # what is waiting (a transaction's batch) goes now
                        permits.acquire()
                    start = time.perf_counter()
                    try:
                        producer.send_async(value, completed(start, args.size), txn=txn)
                    except BaseException:
                        permits.release()
                        raise
                    txns.added(1)
                    continue
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                rec.fail(exc, start)
                txns.drop()
                continue
            rec.add(n, n * args.size, start)
            txns.added(n)
    finally:
        try:
            txns.end()
            producer.flush()
            deadline = time.monotonic() + 30.0
            for _ in range(args.max_outstanding):  # every outstanding send has completed
                if not permits.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                    break
        finally:
            producer.close()


def _subscribe(client, args, topic):
    return client.subscribe(
        topic,
        args.subscription,
        subscription_type=SUBSCRIPTION_TYPES[args.subscription_type],
        initial_position=pulsartxn.InitialPosition.Earliest,  # what --prefill sent first
    )


def consume(client, args, rec, pacer, index: int) -> None:
    """batch_receive and acknowledge, in transactions of --txn-size acks if given."""
    consumer = _subscribe(client, args, args.topic)
    txns = _Txns(client, args, rec)
    try:
        while rec.claim():
            pacer.wait()
            start = time.perf_counter()
            msgs = consumer.batch_receive(args.receive_batch, 100)
            if not msgs:
                rec.unclaim(start)
                continue
            try:
                txn = txns.current()
                for m in msgs:
                    consumer.acknowledge(m, txn=txn)
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                rec.fail(exc, start)
                txns.drop()
                continue
            rec.add(len(msgs), sum(len(m.data()) for m in msgs), start)
            txns.added(len(msgs))
    finally:
        try:
            txns.end()
        finally:
            consumer.close()


def txn(client, args, rec, pacer, index: int) -> None:
    """begin, send_batch --messages-per-txn, commit (or abort: --abort-ratio of them)."""
    producer = client.create_producer(args.topic) if args.messages_per_txn else None
    value = os.urandom(args.size)
    seed = None if args.random_seed is None else args.random_seed + index
    rng = random.Random(seed)
    timeout_ms = args.txn_timeout_ms or None
    try:
        while rec.claim():
            pacer.wait()
            start = time.perf_counter()
            t = None
            try:
                t = client.new_transaction(timeout_ms=timeout_ms)
                if producer is not None:
                    producer.send_batch([value] * args.messages_per_txn, txn=t)
                if args.abort_ratio and rng.random() < args.abort_ratio:
                    t.abort()
                    rec.add(0, 0, start, aborted=True)
                    continue
                t.commit()
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                rec.fail(exc, start)
                if t is not None:
                    _quiet_abort(t)
                continue
            n = args.messages_per_txn
            rec.add(n, n * args.size, start)
    finally:
        if producer is not None:
            producer.close()


def pipeline(client, args, rec, pacer, index: int) -> None:
    """consume-process-produce: each batch received, reversed, sent and acked in one txn."""
    consumer = _subscribe(client, args, args.topic)
    producer = client.create_producer(args.output)
    size = max(args.txn_size, 1)
    timeout_ms = args.txn_timeout_ms or None
    try:
        while rec.claim():
            pacer.wait()
            start = time.perf_counter()
            msgs = consumer.batch_receive(size, 100)
            if not msgs:
                rec.unclaim(start)
                continue
            try:
                with client.new_transaction(timeout_ms=timeout_ms) as t:
                    producer.send_batch([m.data()[::-1] for m in msgs], txn=t)
                    for m in msgs:
                        consumer.acknowledge(m, txn=t)
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                rec.fail(exc, start)
                continue
            rec.add(len(msgs), sum(len(m.data()) for m in msgs), start)
    finally:
        consumer.close()
        producer.close()


WORKERS = {"produce": produce, "consume": consume, "txn": txn, "pipeline": pipeline}
