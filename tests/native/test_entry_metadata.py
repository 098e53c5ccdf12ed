"""Per-message metadata in entries (FLAG_METADATA): ordering key, event time, delivery time.
Native == twin byte for byte, entries without it unchanged, truncations caught."""

from __future__ import annotations

import struct
from collections import deque

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulsartxn._native import load
from pulsartxn._native.entryformat import FLAG_METADATA
from pulsartxn.errors import CorruptEntry

NATIVE, REFERENCE = load("native"), load("reference")
I64 = (-(1 << 63), (1 << 63) - 1)

meta = st.none() | st.tuples(
    st.integers(*I64), st.integers(*I64), st.none() | st.binary(max_size=12)
)
msgs = st.lists(
    st.tuples(st.binary(max_size=50), st.none() | st.binary(max_size=6), meta),
    min_size=1,
    max_size=8,
)


@given(msgs)
def test_native_and_twin_encode_and_decode_metadata_alike(items):
    values = [m[0] for m in items]
    keys = [m[1] for m in items]
    metadata = [m[2] for m in items]
    native = NATIVE.encode_entry(values, keys, metadata=metadata, sequence_id=3)
    twin = REFERENCE.encode_entry(values, keys, metadata=metadata, sequence_id=3)
    assert native == twin
    assert struct.unpack_from("<H", native, 6)[0] == FLAG_METADATA
    plain = NATIVE.encode_entry(values, keys, sequence_id=3)
    assert struct.unpack_from("<H", plain, 6)[0] == 0
    # Entries with and without metadata decode together; those without have none.
    for impl in (NATIVE, REFERENCE):
        d = impl.decode_entries([1, 2], [plain, native])
        n = len(items)
        assert d.values() == values + values
        assert [d.metadata(i) for i in range(n)] == [None] * n
        expected = [None if m in (None, (0, 0, None)) else m for m in metadata]
        assert [d.metadata(n + i) for i in range(n)] == expected
        assert d.equals(NATIVE.decode_entries([1, 2], [plain, native]))
    assert NATIVE.encode_entries(values, metadata=metadata, batch_size=3) == (
        REFERENCE.encode_entries(values, metadata=metadata, batch_size=3)
    )


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "twin"])
def test_entries_without_metadata_are_unchanged_and_decode_without_columns(impl):
    raw = impl.encode_entry([b"a", b"b"], [b"k", None], [{"p": "q"}, None], metadata=None)
    assert raw == NATIVE.encode_entry([b"a", b"b"], [b"k", None], [{"p": "q"}, None])
    assert raw[6:8] == b"\0\0"
    d = impl.decode_entries([0], [raw])
    assert d.event_time is None and d.metadata(0) is None


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "twin"])
def test_every_truncation_of_a_metadata_entry_is_corrupt(impl):
    raw = impl.encode_entry([b"xy", b"z"], metadata=[(5, 6, b"ok"), (0, 9, None)])
    for cut in range(len(raw)):
        with pytest.raises(CorruptEntry):
            impl.decode_entries([0], [raw[:cut]], verify=False)
    # An unknown flag bit is refused, the metadata flag alone is known.
    for flags in (2, 0x100, FLAG_METADATA | 4):
        bad = raw[:6] + struct.pack("<H", flags) + raw[8:]
        with pytest.raises(CorruptEntry, match="unknown flags"):
            impl.decode_entries([0], [bad], verify=False)
    # A flag cleared on an entry with metadata: bytes after the messages, or a bad length.
    cleared = raw[:6] + b"\0\0" + raw[8:]
    with pytest.raises(CorruptEntry):
        impl.decode_entries([0], [cleared], verify=False)


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "twin"])
@pytest.mark.parametrize(
    "metadata, error",
    [
        ([(1, 2)], TypeError),
        (["x"], TypeError),
        ([(True, 0, None)], TypeError),
        ([(1, 2, "str")], TypeError),
        ([(1 << 63, 0, None)], ValueError),
        ([None, None], ValueError),
        ({}, TypeError),
    ],
)
def test_bad_metadata_is_refused(impl, metadata, error):
    with pytest.raises(error):
        impl.encode_entry([b"v"], metadata=metadata)


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "twin"])
def test_entry_log_appends_messages_with_metadata(impl, tmp_path):
    env = lmdb.open(str(tmp_path / "env"), max_dbs=4, map_size=1 << 26, sync=False)
    try:
        log = impl.EntryLog(env, b"ledger/t")
        metadata = [(7, 0, b"k%d" % i) if i % 2 else None for i in range(5)]
        with env.begin(write=True) as txn:
            first, counts = log.append_messages(
                txn, [b"m%d" % i for i in range(5)], metadata=metadata, batch_size=2
            )
        assert (first, counts) == (0, [2, 2, 1])
        with env.begin(buffers=True) as txn:
            d = log.read(txn, 0)
        assert [d.metadata(i) for i in range(5)] == metadata
    finally:
        env.close()


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "twin"])
def test_message_accessors_and_dispatch_of_a_payload_with_metadata(impl):
    m = impl.Message(b"d", None, None, (1, 2, -1, -1, 0), "t", 5)
    assert (m.event_timestamp(), m.ordering_key()) == (0, None)
    m = impl.Message(b"d", None, None, (1, 2, -1, -1, 0), "t", 5, 0, None, 42, "ok")
    assert (m.event_timestamp(), m.ordering_key()) == (42, "ok")
    for message_type in (impl.Message, lambda *a: impl.Message(*a)):
        buffer = deque(
            [
                ((3, -1), (b"a", None, None, 9, 0, None)),
                ((4, -1), (b"b", None, "pk", 9, 0, None, (77, "ord"))),
            ]
        )
        out: list = []
        impl.take_buffered(
            buffer, 5, 1 << 20, out, "c", {}, {}, -1, set(), {}, None,
            lambda t: False, 1, 0, "t", impl.Pending, message_type, None,
        )  # fmt: skip
        assert [(x.data(), x.event_timestamp(), x.ordering_key()) for x in out] == [
            (b"a", 0, None),
            (b"b", 77, "ord"),
        ]
        assert out[1].partition_key() == "pk"
