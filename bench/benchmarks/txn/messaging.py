"""asv: transactional messaging next to the same work without transactions (sync=False).

Produce at 1000 messages per transaction, read committed with 10% of transactions aborted,
acknowledgements in transactions, and transaction buffer recovery on reopen.
"""

import itertools
import os
import shutil
import tempfile

import lmdb

import pulsartxn

from ._recovery import TOPIC, build_recovery, drop_snapshots

PER_TXN = 1000
N_TXNS = 20  # transactions of 1000 messages in the read-committed ledgers
N_RECOVERY = 20_000  # transactions of 5 one-message entries, every other one aborted


def _fill(client, topic, values, abort_every):
    # A network session's client: its aborted transactions' batches are in the ledger (an
    # in-process transaction's ride in its commit, and an abort writes none of them).
    client = client.broker.client(session="fill")
    producer = client.create_producer(topic)
    committed = 0
    for i in range(len(values) // PER_TXN):
        t = client.new_transaction()
        producer.send_batch(values[i * PER_TXN : (i + 1) * PER_TXN], txn=t)
        if abort_every and i % abort_every == abort_every - 1:
            t.abort()
        else:
            t.commit()
            committed += PER_TXN
    producer.close()
    return committed


class TxnMessagingProduce:
    """1000 messages: per-message send_async, or one send_batch; then commit (or flush)."""

    timeout = 300
    params = [False, True]
    param_names = ["txn"]

    def setup(self, txn):
        self.tmp = tempfile.mkdtemp()
        self.broker = pulsartxn.Broker(os.path.join(self.tmp, "d"), sync=False)
        self.client = self.broker.client()
        self.values = [os.urandom(100) for _ in range(PER_TXN)]
        self.producer = self.client.create_producer("t")

    def teardown(self, txn):
        self.broker.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_send_async_1000(self, txn):
        producer = self.producer
        if txn:
            t = self.client.new_transaction()
            for v in self.values:
                producer.send_async(v, txn=t)
            t.commit()
        else:
            for v in self.values:
                producer.send_async(v)
            producer.flush()

    def time_send_batch_1000(self, txn):
        if txn:
            t = self.client.new_transaction()
            self.producer.send_batch(self.values, txn=t)
            t.commit()
        else:
            self.producer.send_batch(self.values)


class TxnMessagingReadCommitted:
    """Read committed over 20 transactions of 1000 messages, none or 10% of them aborted."""

    timeout = 300
    params = [0, 10]
    param_names = ["abort_every"]

    def setup(self, abort_every):
        self.tmp = tempfile.mkdtemp()
        self.broker = pulsartxn.Broker(os.path.join(self.tmp, "d"), sync=False)
        self.client = self.broker.client()
        values = [os.urandom(100) for _ in range(N_TXNS * PER_TXN)]
        self.expect = _fill(self.client, "rc", values, abort_every)
        self.names = itertools.count()

    def teardown(self, abort_every):
        self.broker.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_scan(self, abort_every):
        for _ in self.client.scan("rc"):
            pass

    def time_receive(self, abort_every):
        consumer = self.client.subscribe(
            "rc", f"s{next(self.names)}", initial_position=pulsartxn.InitialPosition.Earliest
        )
        for _ in range(self.expect):
            consumer.receive(1000)
        consumer.close()

    def time_batch_receive(self, abort_every):
        consumer = self.client.subscribe(
            "rc", f"b{next(self.names)}", initial_position=pulsartxn.InitialPosition.Earliest
        )
        got = 0
        while got < self.expect:
            got += len(consumer.batch_receive(PER_TXN, 1000))
        consumer.close()


class TxnMessagingAck:
    """receive + acknowledge of 5000 messages, in transactions of 1000 acks or without."""

    timeout = 300
    params = [False, True]
    param_names = ["txn"]

    def setup(self, txn):
        self.tmp = tempfile.mkdtemp()
        self.broker = pulsartxn.Broker(os.path.join(self.tmp, "d"), sync=False)
        self.client = self.broker.client()
        self.n = 5 * PER_TXN
        self.client.create_producer("a").send_batch([os.urandom(100) for _ in range(self.n)])
        self.names = itertools.count()

    def teardown(self, txn):
        self.broker.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_receive_acknowledge_5000(self, txn):
        consumer = self.client.subscribe(
            "a", f"s{next(self.names)}", initial_position=pulsartxn.InitialPosition.Earliest
        )
        for _ in range(self.n // PER_TXN):
            t = self.client.new_transaction() if txn else None
            for _ in range(PER_TXN):
                consumer.acknowledge(consumer.receive(1000), txn=t)
            if t is not None:
                t.commit()
        consumer.close()


class TxnMessagingRecovery:
    """Reopen on 100k one-message entries of 20k transactions (10k aborted) + 20k markers,
    and read the max read position; with the snapshot taken at close, or without any (full
    ledger replay). Raw py-lmdb iteration over the same ledger, for scale."""

    timeout = 600
    params = [True, False]
    param_names = ["snapshot"]
    # One reopen per sample, each after setup: a reopen writes a snapshot again at close.
    number = 1
    repeat = 5
    warmup_time = 0

    def setup_cache(self):
        # asv keeps files written to the working directory for the benchmarks of this class.
        path = os.path.abspath("txn-recovery")
        build_recovery(path, N_RECOVERY)
        return path

    def setup(self, path, snapshot):
        if not snapshot:
            drop_snapshots(path)

    def time_reopen_max_read_position(self, path, snapshot):
        broker = pulsartxn.Broker(path, sync=False)
        broker.admin.transaction_buffer_stats(TOPIC)["max_read_position"]
        broker.close()

    def time_raw_lmdb_iterate(self, path, snapshot):
        env = lmdb.open(path, max_dbs=16_384, map_size=1 << 40, readonly=True, lock=False)
        db = env.open_db(b"ledger/persistent://public/default/" + TOPIC.encode())
        with env.begin(db=db) as txn:
            for _ in txn.cursor():
                pass
        env.close()


class TxnPipeline:
    """Exactly-once consume-process-produce with every commit fsynced (sync=True): receive 100,
    write 100 results, acknowledge the 100 inputs, commit. The results by send_batch (durable
    when it returns: two group commits per transaction) or by send_async (they ride in the
    commit: one)."""

    timeout = 300
    params = ["send_batch", "send_async"]
    param_names = ["results"]
    number = 1
    repeat = 5

    def setup(self, results):
        self.tmp = tempfile.mkdtemp()
        self.broker = pulsartxn.Broker(os.path.join(self.tmp, "d"), sync=True)
        self.client = self.broker.client()
        self.client.create_producer("in").send_batch([os.urandom(100) for _ in range(20_000)])
        self.consumer = self.client.subscribe(
            "in", "fn", initial_position=pulsartxn.InitialPosition.Earliest
        )
        self.out = self.client.create_producer("out")

    def teardown(self, results):
        self.broker.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_10_transactions_of_100(self, results):
        client, consumer, out = self.client, self.consumer, self.out
        for _ in range(10):
            msgs = consumer.batch_receive(100, 1000)
            t = client.new_transaction()
            if results == "send_batch":
                out.send_batch([m.data() for m in msgs], txn=t)
            else:
                for m in msgs:
                    out.send_async(m.data(), txn=t)
            for m in msgs:
                consumer.acknowledge(m, txn=t)
            t.commit()
