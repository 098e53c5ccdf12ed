"""asv: recovery on broker reopen (``pulsartxn/txn/buffer.py``, ``coordinator.py``).

Transaction buffer: a partition of N transactions of 5 one-message entries, every other one
aborted (N/2 aborted TxnIDs in its abort set, N markers); reopen and read its max read
position, from the snapshot written at close, or with the snapshots deleted (full replay of
the ledger, as after a damaged snapshot). Coordinator: N transactions left open (each with a
partition registered) in the coordinators' logs; reopen until every coordinator is ready.
``TxnMessagingRecovery`` (txn/messaging.py) and ``Recovery`` (txn/coordinator.py: empty open
transactions) keep their single sizes for their history.
"""

import os

import pulsartxn

from ._recovery import TOPIC, build_recovery, drop_snapshots

BUFFER_SIZES = [2_000, 20_000, 100_000]  # transactions: 10k, 100k, 500k data entries
OPEN_SIZES = [1_000, 10_000]
DAY_MS = 86_400_000  # open transactions must not time out between samples


class BufferRecovery:
    timeout = 900
    params = [BUFFER_SIZES, [True, False]]
    param_names = ["txns", "snapshot"]
    # One reopen per sample, each after setup: a reopen writes the snapshot again at close.
    number = 1
    repeat = 5
    warmup_time = 0

    def setup_cache(self):
        # asv keeps files written to the working directory for this class's benchmarks.
        paths = {}
        for n in BUFFER_SIZES:
            paths[n] = os.path.abspath(f"buffer-recovery-{n}")
            build_recovery(paths[n], n)  # asserts its n/2 aborted transactions
        return paths

    def setup(self, paths, txns, snapshot):
        if not snapshot:
            drop_snapshots(paths[txns])

    def time_reopen_max_read_position(self, paths, txns, snapshot):
        broker = pulsartxn.Broker(paths[txns], sync=False)
        stats = broker.admin.transaction_buffer_stats(TOPIC)
        broker.close()
        assert stats["aborted_txn_count"] == txns // 2, stats


class CoordinatorRecovery:
    timeout = 600
    params = [OPEN_SIZES]
    param_names = ["open_txns"]
    number = 1
    repeat = 5
    warmup_time = 0

    def setup_cache(self):
        paths = {}
        for n in OPEN_SIZES:
            path = paths[n] = os.path.abspath(f"coordinator-recovery-{n}")
            with pulsartxn.Broker(path, sync=False, default_txn_timeout_ms=DAY_MS) as broker:
                client = broker.client()
                producer = client.create_producer("open")
                for _ in range(n):
                    producer.send_batch([b"x"], txn=client.new_transaction())
                    done = client.new_transaction()  # and as many finished ones
                    producer.send_batch([b"y"], txn=done)
                    done.commit()
        return paths

    def time_reopen_coordinators_ready(self, paths, open_txns):
        broker = pulsartxn.Broker(paths[open_txns], sync=False, default_txn_timeout_ms=DAY_MS)
        coordinators = broker.admin.coordinators()
        broker.close()
        assert all(c["state"] == "READY" for c in coordinators), coordinators
        assert sum(c["active"] for c in coordinators) == open_txns, coordinators
