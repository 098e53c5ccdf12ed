"""An installed wheel works: the native core loads and one transaction goes through a broker.

Run by cibuildwheel's test-command (pyproject.toml) and by tests/test_packaging.py, in an
environment holding the wheel and its dependencies only (no source tree on the path)."""

from __future__ import annotations

import tempfile

import numpy as np

import pulsartxn
from pulsartxn import _native

assert pulsartxn.IMPLEMENTATION == "native", pulsartxn.IMPLEMENTATION
t = pulsartxn.TxnID(65535, 2**112 - 1)
assert pulsartxn.TxnID.unpack(t.pack()) == t
s = _native.AbortSet([t])
found = s.contains_many(
    np.array([t.most_sig_bits], dtype=np.uint64), np.array([t.least_sig_bits], dtype=np.uint64)
)
assert found.tolist() == [True]
assert _native.AckSet(64, full=True).is_full()
entry = _native.encode_entry([b"a", b"bc"])
assert _native.decode_entries([0], [entry]).num_messages == 2

with tempfile.TemporaryDirectory() as data, pulsartxn.Broker(data) as broker:
    client = broker.client()
    consumer = client.subscribe("smoke", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    with client.new_transaction() as txn:
        client.create_producer("smoke").send(b"hello", txn=txn)
    msg = consumer.receive(timeout_millis=10_000)
    assert msg.data() == b"hello", msg
    consumer.acknowledge(msg)

print("ok", pulsartxn.__version__, pulsartxn.__file__)
