"""TxnID and TxnIdAllocator: behaviour on both implementations, native == twin on random input."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulsartxn._native import load

NATIVE, REFERENCE = load("native"), load("reference")

MAX_SEQ = (1 << 112) - 1
coordinators = st.one_of(st.sampled_from([0, 1, 65534, 65535]), st.integers(0, 65535))
sequences = st.one_of(
    st.sampled_from([0, 1, (1 << 64) - 1, 1 << 64, MAX_SEQ - 1, MAX_SEQ]), st.integers(0, MAX_SEQ)
)


def test_layout_of_the_128_bits(impl):
    t = impl.TxnID(0xABCD, (0x123456789ABC << 64) | 0xDEADBEEF)
    assert int(t) == (0xABCD << 112) | (0x123456789ABC << 64) | 0xDEADBEEF
    assert t.most_sig_bits == (0xABCD << 48) | 0x123456789ABC
    assert t.least_sig_bits == 0xDEADBEEF
    assert t.coordinator_id == 0xABCD
    assert t.sequence == (0x123456789ABC << 64) | 0xDEADBEEF
    assert str(t) == f"{0xABCD}:{t.sequence}"
    assert repr(t) == f"TxnID({0xABCD}, {t.sequence})"


def test_extremes(impl):
    top = impl.TxnID(65535, MAX_SEQ)
    assert int(top) == (1 << 128) - 1
    assert top.pack() == b"\xff" * 16
    assert impl.TxnID(0, 0).pack() == bytes(16)
    assert impl.TxnID.from_int((1 << 128) - 1) == top


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((-1, 0), ValueError),
        ((65536, 0), ValueError),
        ((0, -1), ValueError),
        ((0, MAX_SEQ + 1), ValueError),
        ((1.0, 0), TypeError),
        (("1", 0), TypeError),
        ((0, None), TypeError),
        ((True, 0), TypeError),
    ],
)
def test_out_of_range_and_wrong_types_are_refused(impl, args, error):
    with pytest.raises(error, match=r"coordinator_id|sequence"):
        impl.TxnID(*args)


def test_from_int_parse_unpack_refuse_bad_input(impl):
    with pytest.raises(ValueError, match="out of range"):
        impl.TxnID.from_int(1 << 128)
    with pytest.raises(ValueError, match="out of range"):
        impl.TxnID.from_int(-1)
    with pytest.raises(TypeError):
        impl.TxnID.from_int("5")
    for text in [
        "",
        "1",
        "1:2:3",
        "-1:2",
        "1:-2",
        " 1:2",
        "1:2 ",
        "a:b",
        "1:+2",
        "1_0:2",
        "65536:0",
    ]:
        with pytest.raises(ValueError):
            impl.TxnID.parse(text)
    with pytest.raises(TypeError):
        impl.TxnID.parse(b"1:2")
    with pytest.raises(ValueError, match="16 bytes"):
        impl.TxnID.unpack(b"\x00" * 15)
    with pytest.raises(ValueError, match="16 bytes"):
        impl.TxnID.unpack(b"\x00" * 17)
    with pytest.raises(TypeError):
        impl.TxnID.unpack(12)


def test_ordering_hashing_and_pickling(impl):
    ids = [impl.TxnID(c, s) for c, s in [(2, 0), (1, 1 << 70), (1, 5), (0, MAX_SEQ), (1, 5)]]
    assert sorted(ids) == [ids[3], ids[2], ids[4], ids[1], ids[0]]
    assert len(set(ids)) == 4
    assert ids[2] == ids[4] and ids[2] is not ids[4]
    assert ids[0] != ids[1] and ids[0] > ids[1] >= ids[2]
    assert hash(ids[1]) == hash(int(ids[1]))
    assert (ids[0] == 42) is False
    with pytest.raises(TypeError):
        _ = ids[0] < 42
    for t in ids:
        assert pickle.loads(pickle.dumps(t)) == t
    assert {ids[2]: "x"}[impl.TxnID(1, 5)] == "x"


@given(coordinators, sequences)
def test_native_and_twin_agree(c, s):
    n, r = NATIVE.TxnID(c, s), REFERENCE.TxnID(c, s)
    assert int(n) == int(r) == (c << 112) | s
    assert (n.most_sig_bits, n.least_sig_bits) == (r.most_sig_bits, r.least_sig_bits)
    assert n.pack() == r.pack() == int(n).to_bytes(16, "big")
    assert str(n) == str(r) and repr(n) == repr(r)
    assert hash(n) == hash(r)
    for impl, t in [(NATIVE, n), (REFERENCE, r)]:
        assert impl.TxnID.parse(str(t)) == t
        assert impl.TxnID.unpack(t.pack()) == t
        assert impl.TxnID.from_int(int(t)) == t
        assert impl.TxnID.from_halves(t.most_sig_bits, t.least_sig_bits) == t
        assert (t.coordinator_id, t.sequence) == (c, s)


@given(st.lists(st.tuples(coordinators, sequences), min_size=2, max_size=20))
def test_order_matches_integer_order(pairs):
    for impl in (NATIVE, REFERENCE):
        ids = [impl.TxnID(c, s) for c, s in pairs]
        assert [int(t) for t in sorted(ids)] == sorted(int(t) for t in ids)
        assert [t.pack() for t in sorted(ids)] == sorted(t.pack() for t in ids)


def test_allocator_is_strictly_increasing_across_halves(impl):
    a = impl.TxnIdAllocator(7, (1 << 64) - 2)
    first = a.next()
    msb, lsb = a.allocate(3)
    last = a.next()
    got = [first] + [impl.TxnID.from_halves(int(h), int(l)) for h, l in zip(msb, lsb)] + [last]
    assert [t.sequence for t in got] == [(1 << 64) - 2 + i for i in range(5)]
    assert all(t.coordinator_id == 7 for t in got)
    assert msb.dtype == np.uint64 and lsb.dtype == np.uint64
    assert a.next_sequence == (1 << 64) + 3
    assert len(a.allocate(0)[0]) == 0


def test_allocator_refuses_at_two_to_the_112(impl):
    a = impl.TxnIdAllocator(65535, MAX_SEQ - 1)
    with pytest.raises(OverflowError, match="exhausted"):
        a.allocate(3)
    assert a.next_sequence == MAX_SEQ - 1  # the refused call took nothing
    assert a.next() == impl.TxnID(65535, MAX_SEQ - 1)
    assert a.next() == impl.TxnID(65535, MAX_SEQ)
    with pytest.raises(OverflowError):
        a.next()
    with pytest.raises(OverflowError):
        a.allocate(1)
    assert a.next_sequence == MAX_SEQ + 1


def test_allocator_bad_arguments(impl):
    for args, kwargs, error in [
        ((65536,), {}, ValueError),
        ((-1,), {}, ValueError),
        ((0, -1), {}, ValueError),
        ((0, MAX_SEQ + 2), {}, ValueError),
        (("0",), {}, TypeError),
        ((0,), {"reserve": 5}, TypeError),
        ((0,), {"reserve": print, "block_size": 0}, ValueError),
    ]:
        with pytest.raises(error):
            impl.TxnIdAllocator(*args, **kwargs)
    a = impl.TxnIdAllocator(0)
    with pytest.raises(ValueError):
        a.allocate(-1)
    with pytest.raises(TypeError):
        a.allocate(2.0)


def test_reservation_blocks_survive_a_simulated_restart(impl):
    """The coordinator persists each mark; a restart resumes at the mark, never below it."""
    persisted = []
    a = impl.TxnIdAllocator(3, reserve=persisted.append, block_size=100)
    issued = [a.next() for _ in range(150)]
    assert persisted == [100, 200]
    msb, _ = a.allocate(500)
    assert persisted[-1] == 650 and a.reserved_until == 650
    # "Crash": every id handed out is below the durable mark.
    assert a.next_sequence <= persisted[-1]
    b = impl.TxnIdAllocator(3, persisted[-1], reserve=persisted.append, block_size=100)
    again = [b.next() for _ in range(10)]
    assert min(t.sequence for t in again) == 650
    assert not set(issued) & set(again)


def test_failed_reservation_hands_out_nothing(impl):
    calls = []

    def reserve(mark):
        calls.append(mark)
        if len(calls) == 2:
            raise OSError("disk full")

    a = impl.TxnIdAllocator(0, reserve=reserve, block_size=2)
    a.next()
    a.next()
    with pytest.raises(OSError):
        a.next()
    assert a.next_sequence == 2 and a.reserved_until == 2
    assert a.next().sequence == 2  # the next reservation succeeds
    assert calls == [2, 4, 4]


@given(st.integers(0, MAX_SEQ - 2000), st.lists(st.integers(0, 300), max_size=8), coordinators)
def test_allocators_agree(start, sizes, c):
    na, ra = NATIVE.TxnIdAllocator(c, start), REFERENCE.TxnIdAllocator(c, start)
    for n in sizes:
        nm, nl = na.allocate(n)
        rm, rl = ra.allocate(n)
        assert np.array_equal(nm, rm) and np.array_equal(nl, rl)
        assert na.next() == NATIVE.TxnID.from_int(int(ra.next()))
    assert na.next_sequence == ra.next_sequence
