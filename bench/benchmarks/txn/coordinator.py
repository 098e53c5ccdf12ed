"""asv: transactions through the coordinators (begin + commit, empty and with participants)."""

import os
import shutil
import tempfile
import threading

import pulsartxn


class Coordinators:
    timeout = 300
    params = [False, True]
    param_names = ["sync"]

    def setup(self, sync):
        self.tmp = tempfile.mkdtemp()
        self.broker = pulsartxn.Broker(os.path.join(self.tmp, "d"), sync=sync)
        self.client = self.broker.client()

    def teardown(self, sync):
        self.broker.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_new_commit_200(self, sync):
        for _ in range(200):
            self.client.new_transaction().commit()

    def time_new_commit_200_on_8_threads(self, sync):
        def work():
            for _ in range(25):
                self.client.new_transaction().commit()

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def time_commit_group_of_64(self, sync):
        txns = [self.client.new_transaction(group="job") for _ in range(64)]
        self.client.commit_group("job", txns[:32])


class Recovery:
    timeout = 300

    def setup(self):
        self.tmp = tempfile.mkdtemp()
        self.path = os.path.join(self.tmp, "d")
        with pulsartxn.Broker(self.path, sync=False) as broker:
            client = broker.client()
            for _ in range(10_000):
                client.new_transaction()

    def teardown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_open_with_10k_open_transactions(self):
        pulsartxn.Broker(self.path, sync=False).close()
