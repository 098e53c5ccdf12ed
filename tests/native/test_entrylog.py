"""Entry codec and entry log: native == twin byte for byte, round trips, corrupt input, LMDB."""

from __future__ import annotations

import os
import struct

import lmdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsartxn._native import load
from pulsartxn.errors import CorruptEntry

NATIVE, REFERENCE = load("native"), load("reference")
U64 = (1 << 64) - 1

payloads = st.binary(max_size=300)
keys = st.one_of(st.none(), st.binary(max_size=20), st.text(max_size=10))
props = st.one_of(st.none(), st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3))
messages = st.lists(st.tuples(payloads, keys, props), max_size=12)
header_ints = st.fixed_dictionaries(
    {
        "txn_msb": st.one_of(st.just(0), st.just(U64), st.integers(0, U64)),
        "txn_lsb": st.one_of(st.just(0), st.just(U64), st.integers(0, U64)),
        "producer_id": st.integers(0, U64),
        "sequence_id": st.integers(0, U64),
        "publish_time": st.integers(-(1 << 63), (1 << 63) - 1),
    }
)


def split(msgs):
    values = [m[0] for m in msgs]
    ks = [m[1] for m in msgs]
    ps = [m[2] for m in msgs]
    return values, (ks if any(k is not None for k in ks) else None), (ps if any(ps) else None)


def as_bytes_key(k):
    return k.encode() if isinstance(k, str) else k


@given(messages, header_ints, st.sampled_from([0, 21, 22]))
def test_native_and_twin_encode_the_same_bytes_and_decode_back(msgs, ints, marker):
    values, ks, ps = split(msgs)
    native = NATIVE.encode_entry(values, ks, ps, marker_type=marker, **ints)
    twin = REFERENCE.encode_entry(values, ks, ps, marker_type=marker, **ints)
    assert native == twin
    header = NATIVE.decode_header(native)
    assert header == REFERENCE.decode_header(twin)
    assert header.message_count == len(values) and header.marker_type == marker
    assert (header.txn_msb, header.txn_lsb, header.sequence_id) == (
        ints["txn_msb"],
        ints["txn_lsb"],
        ints["sequence_id"],
    )
    assert header.publish_time == ints["publish_time"]
    nd = NATIVE.decode_entries([7], [native])
    rd = REFERENCE.decode_entries([7], [twin])
    assert nd.equals(rd)
    assert nd.values() == values
    assert nd.keys() == [as_bytes_key(k) for k in ks] if ks else nd.keys() == [None] * len(values)
    assert nd.properties() == [p or {} for p in ps] if ps else all(p == {} for p in nd.properties())


@given(st.lists(messages, min_size=1, max_size=5))
def test_many_entries_decode_in_one_call(batches):
    entries = [NATIVE.encode_entry(*split(m), sequence_id=i) for i, m in enumerate(batches)]
    ids = list(range(100, 100 + len(entries)))
    nd = NATIVE.decode_entries(ids, entries)
    assert nd.equals(REFERENCE.decode_entries(ids, entries))
    assert nd.num_entries == len(entries)
    assert nd.num_messages == sum(len(m) for m in batches)
    assert nd.values() == [m[0] for b in batches for m in b]
    assert nd.first_message.tolist() == np.cumsum([0] + [len(b) for b in batches])[:-1].tolist()
    assert nd.entry_id[nd.msg_entry].tolist() == [ids[e] for e, b in enumerate(batches) for _ in b]


@settings(max_examples=20)
@given(
    st.lists(st.binary(max_size=64), max_size=300),
    st.integers(1, 50),
    st.integers(60, 2000),
    st.integers(0, 1 << 40),
)
def test_encode_entries_splits_the_same_way(values, batch_size, max_bytes, first_seq):
    native = NATIVE.encode_entries(
        values,
        batch_size=batch_size,
        max_entry_bytes=max_bytes,
        first_sequence_id=first_seq,
        producer_id=3,
    )
    twin = REFERENCE.encode_entries(
        values,
        batch_size=batch_size,
        max_entry_bytes=max_bytes,
        first_sequence_id=first_seq,
        producer_id=3,
    )
    assert native == twin
    heads = [NATIVE.decode_header(e) for e in native]
    assert sum(h.message_count for h in heads) == len(values)
    assert all(1 <= h.message_count <= batch_size for h in heads)
    assert all(len(e) <= max_bytes or h.message_count == 1 for e, h in zip(native, heads))
    seqs = [h.sequence_id for h in heads]
    assert seqs == [first_seq + sum(h.message_count for h in heads[:i]) for i in range(len(heads))]
    if native:
        assert NATIVE.decode_entries(list(range(len(native))), native).values() == values


def test_arrow_values_are_read_from_buffers(impl):
    arr = pa.array(["a", "", "ünï", "d" * 100])
    sliced = pa.array([b"zz", b"a", b"", "ünï".encode(), b"d" * 100]).slice(1)
    large = pa.array([b"a", b"", "ünï".encode(), b"d" * 100], pa.large_binary())
    as_list = [b"a", b"", "ünï".encode(), b"d" * 100]
    expected = impl.encode_entry(as_list)
    for values in (arr, sliced, large, pa.chunked_array([arr[:2], arr[2:]])):
        assert impl.encode_entry(values) == expected
    with pytest.raises(ValueError, match="nulls"):
        impl.encode_entry(pa.array([b"a", None]))
    with pytest.raises(TypeError):
        impl.encode_entry(pa.array([1, 2]))


def test_edge_values(impl):
    big = os.urandom(5 * 1024 * 1024)
    entry = impl.encode_entry(
        [b"", big, b""],
        keys=[b"", None, "k"],
        txn_msb=U64,
        txn_lsb=U64,
        producer_id=U64,
        sequence_id=U64,
        publish_time=-1,
    )
    d = impl.decode_entries([U64], [entry])
    assert d.values() == [b"", big, b""]
    assert d.keys() == [b"", None, b"k"]
    assert d.entry_id.tolist() == [U64]
    assert impl.decode_header(entry).sequence_id == U64
    marker = impl.encode_entry([], marker_type=22, txn_msb=1, txn_lsb=2)
    d = impl.decode_entries([0], [marker])
    assert d.num_messages == 0 and d.marker_type.tolist() == [22]
    assert impl.decode_entries([], []).num_entries == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"txn_msb": -1}, ValueError),
        ({"txn_lsb": 1 << 64}, ValueError),
        ({"producer_id": 1.5}, TypeError),
        ({"sequence_id": "1"}, TypeError),
        ({"publish_time": 1 << 63}, ValueError),
        ({"marker_type": 256}, ValueError),
        ({"marker_type": True}, TypeError),
    ],
)
def test_bad_header_values(impl, kwargs, error):
    with pytest.raises(error):
        impl.encode_entry([b"x"], **kwargs)


def test_bad_messages(impl):
    with pytest.raises(TypeError, match=r"values\[1\]"):
        impl.encode_entry([b"a", "b"])
    with pytest.raises(TypeError):
        impl.encode_entry(b"abc")
    with pytest.raises(ValueError, match="keys has"):
        impl.encode_entry([b"a"], keys=["a", "b"])
    with pytest.raises(TypeError, match=r"keys\[0\]"):
        impl.encode_entry([b"a"], keys=[5])
    with pytest.raises(TypeError, match=r"properties\[0\]"):
        impl.encode_entry([b"a"], properties=[{"a": 1}])
    with pytest.raises(ValueError, match="batch_size"):
        impl.encode_entries([b"a"], batch_size=0)
    with pytest.raises(ValueError, match="2\\^64"):
        impl.encode_entries([b"a", b"b"], first_sequence_id=U64)
    with pytest.raises(ValueError):
        impl.decode_entries([-1], [impl.encode_entry([b"a"])])
    with pytest.raises(ValueError):
        impl.decode_entries([1, 2], [impl.encode_entry([b"a"])])


def test_crc32c_known_values_and_continuation(impl):
    assert impl.crc32c(b"123456789") == 0xE3069283
    assert impl.crc32c(b"") == 0
    assert impl.crc32c(b"\x00" * 32) == 0x8A9136AA
    data = os.urandom(10_001)
    assert impl.crc32c(data[4000:], impl.crc32c(data[:4000])) == impl.crc32c(data)
    with pytest.raises(ValueError):
        impl.crc32c(b"x", -1)


@given(st.binary(max_size=5000), st.integers(0, 0xFFFFFFFF))
def test_crc32c_native_equals_twin(data, start):
    assert NATIVE.crc32c(data, start) == REFERENCE.crc32c(data, start)


VALID = NATIVE.encode_entry(
    [b"hello", b"", b"world" * 10],
    keys=["k", None, b""],
    properties=[{"a": "b"}, None, {"x": "yz"}],
    txn_msb=9,
    sequence_id=4,
)


@pytest.mark.parametrize("cut", range(len(VALID)))
def test_every_truncation_is_a_corrupt_entry(impl, cut):
    with pytest.raises(CorruptEntry, match="entry 42"):
        impl.decode_entries([42], [VALID[:cut]])
    with pytest.raises(CorruptEntry):
        impl.decode_entries([42], [VALID[:cut]], verify=False)


def test_every_bit_flip_is_caught_by_the_checksum(impl):
    for i in range(len(VALID)):
        for bit in (0, 3, 7):
            broken = bytearray(VALID)
            broken[i] ^= 1 << bit
            with pytest.raises(CorruptEntry, match="entry 5"):
                impl.decode_entries([5], [bytes(broken)])


def test_trailing_bytes_and_lying_counts(impl):
    with pytest.raises(CorruptEntry, match="after the last"):
        impl.decode_entries([1], [VALID + b"\0"], verify=False)
    lying = bytearray(VALID)
    struct.pack_into("<I", lying, 48, 0xFFFFFFFF)
    with pytest.raises(CorruptEntry):
        impl.decode_entries([1], [bytes(lying)], verify=False)
    with pytest.raises(CorruptEntry, match="magic"):
        impl.decode_header(b"XXXX" + VALID[4:])


@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_decoder(data):
    for impl in (NATIVE, REFERENCE):
        for verify in (True, False):
            try:
                impl.decode_entries([3], [data], verify=verify)
            except CorruptEntry:
                pass


@given(st.binary(min_size=56, max_size=400))
def test_random_bodies_behind_a_valid_header_never_crash(body):
    raw = bytearray(VALID[:56] + body[56:])
    struct.pack_into("<I", raw, 48, body[0] % 8)
    for impl in (NATIVE, REFERENCE):
        try:
            d = impl.decode_entries([3], [bytes(raw)], verify=False)
        except CorruptEntry:
            continue
        assert d.num_messages == body[0] % 8


@pytest.fixture
def env(tmp_path):
    e = lmdb.open(str(tmp_path / "env"), max_dbs=8, map_size=1 << 30, sync=False)
    yield e
    e.close()


def test_entry_log_append_scan_read_trim(impl, env, tmp_path):
    log = impl.EntryLog(env, b"ledger/t")
    with env.begin(write=True) as txn:
        assert log.last_entry_id(txn) == -1 and log.first_entry_id(txn) == -1
        assert log.append(txn, [impl.encode_entry([b"e%d" % i]) for i in range(5)]) == 0
        assert (
            log.append(txn, impl.encode_entries([b"m%d" % i for i in range(25)], batch_size=10))
            == 5
        )
        assert log.append(txn, []) == 8
    with env.begin(buffers=True) as txn:
        assert log.count(txn) == 8 and log.last_entry_id(txn) == 7
        ids, bufs = log.scan(txn, 2, 6)
        assert ids == [2, 3, 4, 5]
        assert log.scan(txn, 6, 2) == ([], [])
        assert log.scan(txn, 0, None, 3)[0] == [0, 1, 2]
        d = log.read(txn, 4)
        assert d.entry_id.tolist() == [4, 5, 6, 7]
        assert d.values() == [b"e4"] + [b"m%d" % i for i in range(25)]
    with env.begin(write=True) as txn:
        assert log.trim_below(txn, 3) == 3
        assert log.trim_below(txn, 100) == 4  # the last entry stays: ids are never reused
        assert log.append(txn, [impl.encode_entry([b"next"])]) == 8
    with pytest.raises(TypeError):
        with env.begin(write=True) as txn:
            log.append(txn, ["str"])
    with pytest.raises(ValueError):
        with env.begin() as txn:
            log.scan(txn, -1)
    env.close()
    again = lmdb.open(str(tmp_path / "env"), max_dbs=8, map_size=1 << 30)
    log2 = impl.EntryLog(again, b"ledger/t")
    with again.begin() as txn:
        assert log2.read(txn).values() == [b"m20", b"m21", b"m22", b"m23", b"m24", b"next"]
    again.close()


def test_entry_log_writes_at_claimed_ids(impl, env):
    """`first`: entries at ids set aside earlier, after the last entry or into ids that hold
    none (a claim written after later entries); an id holding an entry is refused, whole."""
    log = impl.EntryLog(env, b"ledger/claims")
    one = [impl.encode_entry([b"x"])]
    with env.begin(write=True) as txn:
        assert log.append(txn, one, 2) == 2  # 0 and 1 claimed, written later
        assert log.append(txn, [impl.encode_entry([b"y"])] * 2, 5) == 5
        assert log.append(txn, one) == 7
        assert log.append(txn, one, 0) == 0  # below the last: fills the hole
        assert log.append(txn, [impl.encode_entry([b"z"])] * 2, 3) == 3
        first, counts = log.append_messages(txn, [b"a", b"b"], batch_size=1, first_entry_id=9)
        assert (first, counts) == (9, [1, 1])
        for bad in (-1, True, 1 << 63, "1"):
            with pytest.raises(ValueError):
                log.append(txn, one, bad)
        for taken in (2, 1):  # holds an entry; 1 is free but 2 is not: nothing written
            with pytest.raises(ValueError, match="exists already"):
                log.append(txn, one * 2, taken)
        with pytest.raises(ValueError, match="not after the last"):
            log.append_messages(txn, [b"c"], first_entry_id=10)
    with env.begin() as txn:
        ids, _ = log.scan(txn)
        assert ids == [0, 2, 3, 4, 5, 6, 7, 9, 10]
        assert log.read(txn).values() == [b"x", b"x", b"z", b"z", b"y", b"y", b"x", b"a", b"b"]


def test_corrupt_stored_entry_names_its_position(impl, env):
    log = impl.EntryLog(env, b"ledger/c")
    with env.begin(write=True) as txn:
        log.append(txn, [impl.encode_entry([b"fine"]), impl.encode_entry([b"soon broken"])])
        raw = bytearray(txn.get(struct.pack(">Q", 1), db=log.db))
        raw[-1] ^= 0xFF
        txn.put(struct.pack(">Q", 1), bytes(raw), db=log.db)
    with env.begin() as txn:
        assert log.read(txn, 0, 1).values() == [b"fine"]
        with pytest.raises(CorruptEntry, match="entry 1: checksum"):
            log.read(txn)


def test_to_arrow_schema_and_mask(impl):
    entries = [
        impl.encode_entry(
            [b"a", b"b"], keys=["k", None], properties=[{"p": "q"}, None], publish_time=1000
        ),
        impl.encode_entry([b"c"], publish_time=2000),
    ]
    d = impl.decode_entries([3, 4], entries)
    batch = d.to_arrow(topic="persistent://public/default/t", partition=2, ledger_id=9)
    assert batch.schema.names == [
        "topic",
        "partition",
        "ledger_id",
        "entry_id",
        "batch_index",
        "key",
        "value",
        "properties",
        "publish_time",
    ]
    rows = batch.to_pylist()
    assert [r["value"] for r in rows] == [b"a", b"b", b"c"]
    assert [r["batch_index"] for r in rows] == [0, 1, -1]
    assert [r["entry_id"] for r in rows] == [3, 3, 4]
    assert [r["key"] for r in rows] == [b"k", None, None]
    assert rows[0]["properties"] == [("p", "q")] and rows[1]["properties"] == []
    assert {r["partition"] for r in rows} == {2} and {r["ledger_id"] for r in rows} == {9}
    masked = d.to_arrow(mask=np.array([True, False, True]))
    assert masked.column("value").to_pylist() == [b"a", b"c"]
    msb, lsb = d.message_txn()
    assert msb.tolist() == [0, 0, 0]


@pytest.mark.parametrize("arrow", [False, True])
def test_append_messages_equals_encode_then_append(impl, env, arrow, monkeypatch):
    import pulsartxn._native.entrylog as native_module

    monkeypatch.setattr(native_module, "ARENA_ROUND_BYTES", 4096)  # many arena rounds
    values = [os.urandom(i % 300) for i in range(2000)]
    keys = [None if i % 3 else f"k{i}" for i in range(2000)]
    data = pa.array(values, pa.binary()) if arrow else values
    a, b = impl.EntryLog(env, b"ledger/a"), impl.EntryLog(env, b"ledger/b")
    kwargs = dict(
        batch_size=37,
        max_entry_bytes=5000,
        txn_msb=5,
        txn_lsb=6,
        producer_id=7,
        first_sequence_id=100,
        publish_time=1234,
    )
    with env.begin(write=True) as txn:
        a.append(txn, [impl.encode_entry([b"first"])])
        b.append(txn, [impl.encode_entry([b"first"])])
        first, counts = a.append_messages(txn, data, keys, **kwargs)
        entries = impl.encode_entries(data, keys, **kwargs)
        assert b.append(txn, entries) == first == 1
        assert counts == [impl.decode_header(e).message_count for e in entries]
    with env.begin() as txn:
        ids_a, bufs_a = a.scan(txn)
        ids_b, bufs_b = b.scan(txn)
        assert ids_a == ids_b and [bytes(x) for x in bufs_a] == [bytes(x) for x in bufs_b]
        assert a.read(txn, 1).values() == values


_GUARD_PAGE_SCRIPT = r"""
import ctypes, mmap, struct, sys
from pulsartxn._native import load
from pulsartxn.errors import CorruptEntry

impl = load(sys.argv[1])
# One message, no key, two property pairs declared; the first pair takes all the bytes there
# are (16 = the 2 * 8 the pair count asks for), so reading the second pair's key length would
# be the 4 bytes past the end of the entry.
body = struct.pack("<II", 0xFFFFFFFF, 2) + struct.pack("<I", 1) + b"a" + struct.pack("<I", 7)
body += b"bcdefgh"
entry = b"PTXE" + bytes([1, 0, 0, 0]) + bytes(40) + struct.pack("<II", 1, 0) + body
page = mmap.PAGESIZE
region = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
base = ctypes.addressof(ctypes.c_char.from_buffer(region))
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
if libc.mprotect(ctypes.c_void_p(base + page), page, 0) != 0:  # PROT_NONE: reads fault
    raise OSError(ctypes.get_errno(), "mprotect")
start = page - len(entry)
region[start:page] = entry
view = memoryview(region)[start:page]
try:
    impl.decode_entries([3], [view], verify=False)
except CorruptEntry as e:
    print("corrupt:", e)
else:
    print("decoded")
"""


@pytest.mark.parametrize("kind", ["native", "reference"])
def test_decoder_never_reads_past_the_entry(kind, tmp_path):
    """A property pair count that fits in total but not pair by pair: the decoder must stop at
    the entry's end. The entry ends at a PROT_NONE page, so one byte too far is a SIGSEGV."""
    import subprocess
    import sys

    script = tmp_path / "guard.py"
    script.write_text(_GUARD_PAGE_SCRIPT)
    run = subprocess.run([sys.executable, str(script), kind], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("corrupt: entry 3"), run.stdout


@given(st.lists(st.tuples(messages, header_ints, st.sampled_from([0, 21, 22])), max_size=8))
def test_header_columns_native_equals_twin_and_the_headers(entries):
    bufs = []
    for msgs, ints, marker in entries:
        values, ks, ps = split(msgs)
        bufs.append(NATIVE.encode_entry(values, ks, ps, marker_type=marker, **ints))
    native = NATIVE.header_columns(bufs)
    twin = REFERENCE.header_columns([memoryview(b) for b in bufs])
    for a, b in zip(native, twin):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()
    heads = [NATIVE.decode_header(b) for b in bufs]
    assert native[0].tolist() == [h.message_count for h in heads]
    assert native[1].tolist() == [h.marker_type for h in heads]
    assert native[2].tolist() == [h.txn_msb for h in heads]
    assert native[3].tolist() == [h.txn_lsb for h in heads]


@pytest.mark.parametrize("bad", [b"", b"PTXE" + bytes(10), b"XXXX" + bytes(60)])
def test_header_columns_names_the_bad_entry(impl, bad):
    with pytest.raises(CorruptEntry, match="entry 1 of the scan"):
        impl.header_columns([VALID, bad])
