"""AckSet and PendingAckIndex: behaviour on both implementations; native == twin == a model."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pulsartxn._native import load
from pulsartxn.errors import TransactionConflict

NATIVE, REFERENCE = load("native"), load("reference")
SIZES = [1, 63, 64, 65, 128, 256, 257, 1000]


@pytest.mark.parametrize("size", SIZES + [1 << 20])
def test_empty_full_and_ranges(impl, size):
    s = impl.AckSet(size)
    assert s.is_empty() and not s.is_full() and len(s) == 0 and s.size == size
    f = impl.AckSet(size, full=True)
    assert f.is_full() and f.cardinality() == size
    s.set_range(0, size)
    assert s == f
    s.clear_range(size // 2, size)
    assert s.cardinality() == size // 2
    assert list(s) == list(range(size // 2)) if size < 5000 else True
    assert len(f.to_words()) == (size + 63) // 64


def test_set_clear_test_and_errors(impl):
    s = impl.AckSet(100)
    s.set(0)
    s.set(63)
    s.set(64)
    s.set(99)
    assert [i for i in range(100) if s.test(i)] == [0, 63, 64, 99] == list(s)
    assert 63 in s and 62 not in s and 100 not in s and -1 not in s and "x" not in s
    s.clear(63)
    assert not s.test(63)
    for bad in (100, -1):
        with pytest.raises(IndexError, match=str(bad)):
            s.set(bad)
    with pytest.raises(TypeError):
        s.set(1.0)
    with pytest.raises(ValueError):
        s.set_range(5, 101)
    with pytest.raises(ValueError):
        s.clear_range(6, 5)
    for bad_size in (0, -3, (1 << 20) + 1):
        with pytest.raises(ValueError):
            impl.AckSet(bad_size)
    with pytest.raises(ValueError, match="100 and 64"):
        s.overlaps(impl.AckSet(64))
    with pytest.raises(TypeError):
        s.union("x")


def test_set_algebra(impl):
    a, b = impl.AckSet(130), impl.AckSet(130)
    a.set_range(0, 70)
    b.set_range(60, 130)
    assert a.overlaps(b) and list(a & b) == list(range(60, 70))
    assert (a | b).is_full() and list(a - b) == list(range(60))
    c = a.copy()
    c |= b
    assert c.is_full() and not a.is_full()
    c -= b
    assert c == a - b
    assert not (a - b).overlaps(b)
    assert a.overlaps_outside(b, impl.AckSet(130)) and not a.overlaps_outside(b, a)


def test_words_and_pulsar_convention(impl):
    s = impl.AckSet(70)
    s.set(0)
    s.set(65)
    assert s.to_words() == [1, 2]
    assert impl.AckSet.from_words([1, 2], 70) == s
    assert impl.AckSet.from_words(np.array([1, 2], dtype=np.uint64), 70) == s
    full = impl.AckSet(64, full=True)
    assert full.to_words() == [(1 << 64) - 1]
    assert impl.AckSet.from_words([-1], 64) == full  # a protobuf int64 word
    # Pulsar's ack_set marks what is still unacknowledged: the complement within the size.
    pw = s.to_pulsar_words()
    assert pw[0] == -2 and pw[1] == (1 << 6) - 1 - 2
    assert impl.AckSet.from_pulsar_words(pw, 70) == s
    with pytest.raises(ValueError, match="past size"):
        impl.AckSet.from_words([0, 1 << 6], 70)
    with pytest.raises(ValueError, match="words"):
        impl.AckSet.from_words([0], 70)
    with pytest.raises(TypeError):
        impl.AckSet.from_words(["1"], 1)
    assert pickle.loads(pickle.dumps(s)) == s


ops = st.lists(
    st.tuples(
        st.sampled_from(["set", "clear", "set_range", "clear_range"]),
        st.integers(0, 1 << 20),
        st.integers(0, 1 << 20),
    ),
    max_size=30,
)


@given(st.sampled_from(SIZES), ops, ops)
def test_native_twin_and_model_agree(size, ops_a, ops_b):
    results = []
    for impl in (NATIVE, REFERENCE, None):
        sets = []
        for ops_ in (ops_a, ops_b):
            s = set() if impl is None else impl.AckSet(size)
            for name, x, y in ops_:
                i, j = sorted((x % (size + 1), y % (size + 1)))
                k = x % size
                if impl is None:
                    if name == "set":
                        s.add(k)
                    elif name == "clear":
                        s.discard(k)
                    elif name == "set_range":
                        s |= set(range(i, j))
                    else:
                        s -= set(range(i, j))
                elif name in ("set", "clear"):
                    getattr(s, name)(k)
                else:
                    getattr(s, name)(i, j)
            sets.append(s)
        a, b = sets
        if impl is None:
            results.append(
                (
                    sorted(a),
                    sorted(b),
                    bool(a & b),
                    sorted(a | b),
                    sorted(a - b),
                    sorted(a & b),
                    len(a),
                    len(a) == 0,
                    len(a) == size,
                )
            )
        else:
            results.append(
                (
                    list(a),
                    list(b),
                    a.overlaps(b),
                    list(a | b),
                    list(a - b),
                    list(a & b),
                    a.cardinality(),
                    a.is_empty(),
                    a.is_full(),
                )
            )
            words = a.to_words()
            assert impl.AckSet.from_words(words, size) == a
            assert impl.AckSet.from_pulsar_words(a.to_pulsar_words(), size) == a
    assert results[0] == results[1] == results[2]


def test_pending_ack_index_basics(impl):
    t1, t2 = ("txn", 1), ("txn", 2)
    idx = impl.PendingAckIndex()
    a = impl.AckSet(10)
    a.set_range(0, 5)
    b = impl.AckSet(10)
    b.set_range(5, 10)
    idx.add(1, 7, t1, a)
    idx.add(1, 7, t2, b)  # disjoint batch indexes of one entry: fine
    idx.add(1, 7, t1, a)  # the same transaction again: idempotent
    assert idx.is_pending(1, 7) and idx.is_pending(1, 7, 3) and idx.is_pending(1, 7, 9)
    overlap = impl.AckSet(10)
    overlap.set(4)
    assert idx.check(1, 7, t2, overlap) == t1
    with pytest.raises(TransactionConflict, match="ledger 1 entry 7"):
        idx.add(1, 7, t2, overlap)
    assert idx.holders(1, 7) == {t1: a, t2: b}
    with pytest.raises(TransactionConflict):
        idx.add(1, 7, ("txn", 3))  # whole entry over held batch indexes
    idx.add(1, 8, t2)
    with pytest.raises(TransactionConflict):
        idx.add(1, 8, t1, a)  # batch indexes of a whole-held entry
    idx.add(1, 8, t2, a)  # the holder itself: already whole
    assert idx.holders(1, 8) == {t2: None}
    assert len(idx) == 2 and (1, 7) in idx and (1, 9) not in idx
    assert sorted(idx.transactions()) == [t1, t2]
    assert idx.entries_of(t2) == [(1, 7, b), (1, 8, None)]
    assert idx.release(t1) == [(1, 7, a)]
    assert not idx.is_pending(1, 7, 3) and idx.is_pending(1, 7, 6)
    idx.add(1, 7, ("txn", 3), overlap)  # t1's indexes are free again
    assert idx.release(("none",)) == []
    with pytest.raises(ValueError, match="size"):
        idx.add(1, 7, ("txn", 4), impl.AckSet(11))
    with pytest.raises(ValueError):
        idx.add(-1, 0, t1)
    with pytest.raises(ValueError):
        idx.add(0, 1 << 64, t1)
    with pytest.raises(TypeError):
        idx.add(0, 0, t1, ack_set=[1, 2])
    with pytest.raises(TypeError):
        idx.add(0, 0, [1])  # unhashable transaction
    assert len(idx) == 2
    idx.clear()
    assert len(idx) == 0 and idx.transactions() == []


class PendingAckMachine(RuleBasedStateMachine):
    """Random add/release on native and twin against a dict model of who holds what."""

    def __init__(self):
        super().__init__()
        self.native = NATIVE.PendingAckIndex()
        self.twin = REFERENCE.PendingAckIndex()
        self.model: dict[tuple[int, int], dict[int, set | None]] = {}

    @rule(
        entry=st.integers(0, 3),
        txn=st.integers(0, 3),
        bits=st.one_of(st.none(), st.sets(st.integers(0, 69), min_size=1, max_size=5)),
    )
    def add(self, entry, txn, bits):
        holders = self.model.get((0, entry), {})
        conflict = any(
            other != txn and (bits is None or held is None or bits & held)
            for other, held in holders.items()
        )
        outcomes = []
        for impl in (NATIVE, REFERENCE):
            acks = None
            if bits is not None:
                acks = impl.AckSet(70)
                for b in bits:
                    acks.set(b)
            index = self.native if impl is NATIVE else self.twin
            try:
                index.add(0, entry, txn, acks)
                outcomes.append(False)
            except TransactionConflict:
                outcomes.append(True)
        assert outcomes == [conflict, conflict]
        if not conflict:
            mine = holders.get(txn, set())
            holders[txn] = None if bits is None or mine is None else mine | bits
            self.model[(0, entry)] = holders

    @rule(txn=st.integers(0, 3))
    def release(self, txn):
        expected = sorted(e for (_, e), h in self.model.items() if txn in h)
        got_n = self.native.release(txn)
        got_t = self.twin.release(txn)
        assert [e for _, e, _ in got_n] == [e for _, e, _ in got_t] == expected
        for _, e, acks in got_n:
            held = self.model[(0, e)].pop(txn)
            assert (acks is None) == (held is None)
            if acks is not None:
                assert set(acks) == held
            if not self.model[(0, e)]:
                del self.model[(0, e)]

    @invariant()
    def agree(self):
        assert len(self.native) == len(self.twin) == len(self.model)
        for (lid, e), holders in self.model.items():
            for impl_index in (self.native, self.twin):
                got = impl_index.holders(lid, e)
                assert set(got) == set(holders)
                for t, acks in got.items():
                    assert (None if acks is None else set(acks)) == holders[t]
            for b in (0, 35, 69):
                pending = any(h is None or b in h for h in holders.values())
                assert (
                    self.native.is_pending(lid, e, b) == self.twin.is_pending(lid, e, b) == pending
                )


TestPendingAckMachine = PendingAckMachine.TestCase
