"""asv: the synced store's journal (pulsartxn/storage/journal.py): synced small writes and the
consume-process-produce pipeline with the journal and with LMDB syncing itself, and the
recorder and the journal's overlapped write, native and twin."""

import os
import shutil
import tempfile

from pulsartxn._native import load
from pulsartxn.storage import Storage

from ._journal import (
    direct_file,
    open_broker,
    overlapped_writes,
    pipeline,
    record_group,
    recorder_env,
    small_writes,
)


class _Synced:
    """A synced store (SyncedWrites) or broker (Pipeline), with its journal and without."""

    timeout = 300
    params = [True, False]
    param_names = ["journal"]

    def setup(self, journal):
        self.tmp = tempfile.mkdtemp()
        self.store = self.open(os.path.join(self.tmp, "s"), journal)

    def teardown(self, journal):
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class SyncedWrites(_Synced):
    @staticmethod
    def open(path, journal):
        return Storage(path, sync=True, journal=journal)

    def time_200_small_synced_writes(self, journal):
        small_writes(self.store, 200)


class Pipeline(_Synced):
    open = staticmethod(open_broker)

    def time_consume_process_produce_5000(self, journal):
        pipeline(self.store, 5000)


class Recorder:
    params = ["native", "reference"]
    param_names = ["impl"]

    def setup(self, impl):
        self.impl = load(impl)
        self.tmp = tempfile.mkdtemp()
        self.env, self.handles = recorder_env(self.tmp)

    def teardown(self, impl):
        self.env.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_record_a_group(self, impl):
        with self.env.begin(write=True) as txn:
            record_group(self.impl, txn, self.handles)
            txn.abort()


class OverlappedWrite:
    """A journal append as the group commit makes it: the native AsyncWriter (io_uring) runs
    the record's write while LMDB commits; the twin writes first."""

    params = ["native", "reference"]
    param_names = ["impl"]

    def setup(self, impl):
        self.impl = load(impl)
        self.tmp = tempfile.mkdtemp()
        self.env, self.handles = recorder_env(os.path.join(self.tmp, "env"))
        self.fd, self.stage = direct_file(os.path.join(self.tmp, "journal"))

    def teardown(self, impl):
        os.close(self.fd)
        self.env.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_100_overlapped_appends(self, impl):
        overlapped_writes(self.impl, self.fd, self.stage, self.env, self.handles, 100)
