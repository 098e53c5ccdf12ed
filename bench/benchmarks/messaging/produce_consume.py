"""asv: produce (bulk and per message), scan, receive + acknowledge on the embedded broker."""

import os
import shutil
import tempfile

import pyarrow as pa

import pulsartxn


class Messaging:
    timeout = 300

    def setup(self):
        self.tmp = tempfile.mkdtemp()
        self.broker = pulsartxn.Broker(os.path.join(self.tmp, "d"), sync=False)
        self.client = self.broker.client()
        self.values = [os.urandom(100) for _ in range(100_000)]
        self.arrow = pa.array(self.values, pa.binary())
        self.producer = self.client.create_producer("t")
        self.producer.send_batch(self.arrow)

    def teardown(self):
        self.broker.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_send_batch_arrow(self):
        self.producer.send_batch(self.arrow)

    def time_send_async_10k(self):
        for v in self.values[:10_000]:
            self.producer.send_async(v)
        self.producer.flush()

    def time_scan(self):
        for _ in self.client.scan("t"):
            pass
