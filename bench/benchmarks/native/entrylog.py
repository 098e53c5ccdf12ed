"""asv: entry encode, decode and bulk append (native and twin; twin on a tenth of the data)."""

import os
import shutil
import tempfile

import lmdb

from pulsartxn._native import load


class Codec:
    params = ["native", "reference"]
    param_names = ["impl"]
    timeout = 300

    def setup(self, impl):
        self.impl = load(impl)
        n = 1_000_000 if impl == "native" else 100_000
        self.values = [os.urandom(100) for _ in range(n)]
        self.entries = self.impl.encode_entries(self.values, batch_size=1000)
        self.ids = list(range(len(self.entries)))
        self.tmp = tempfile.mkdtemp()
        self.env = lmdb.open(self.tmp, map_size=8 << 30, max_dbs=2, sync=False)
        self.log = self.impl.EntryLog(self.env, b"ledger/asv")

    def teardown(self, impl):
        self.env.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_encode(self, impl):
        self.impl.encode_entries(self.values, batch_size=1000)

    def time_decode(self, impl):
        self.impl.decode_entries(self.ids, self.entries)

    def time_append_messages(self, impl):
        with self.env.begin(write=True) as txn:
            self.log.append_messages(txn, self.values, batch_size=1000)
