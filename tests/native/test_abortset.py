"""AbortSet: behaviour on both implementations; native == twin == a Python set on random input."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pulsartxn._native import load

NATIVE, REFERENCE = load("native"), load("reference")
MAX_SEQ = (1 << 112) - 1

ids = st.builds(
    lambda c, s: (c, s),
    st.one_of(st.sampled_from([0, 1, 65535]), st.integers(0, 65535)),
    st.one_of(st.sampled_from([0, 1, 2, (1 << 64) - 1, 1 << 64, MAX_SEQ]), st.integers(0, MAX_SEQ)),
)
# Small pools make collisions between adds, discards and probes likely.
pooled = st.builds(lambda c, s: (c, s), st.integers(0, 3), st.integers(0, 40))


def halves(impl, pairs):
    txns = [impl.TxnID(c, s) for c, s in pairs]
    return (
        np.array([t.most_sig_bits for t in txns], dtype=np.uint64),
        np.array([t.least_sig_bits for t in txns], dtype=np.uint64),
    )


def test_basic_set_behaviour(impl):
    s = impl.AbortSet()
    a, b, zero = impl.TxnID(1, 10), impl.TxnID(2, 10), impl.TxnID(0, 0)
    assert len(s) == 0 and not s and a not in s
    s.add(a)
    s.add(a)
    s.add(zero)
    assert len(s) == 2 and a in s and zero in s and b not in s
    assert "1:10" not in s and 5 not in s
    assert set(s) == {a, zero}
    s.discard(b)
    s.discard(zero)
    assert set(s) == {a}
    with pytest.raises(KeyError):
        s.remove(zero)
    s.remove(a)
    assert len(s) == 0
    with pytest.raises(TypeError, match="TxnID"):
        s.add("1:10")
    with pytest.raises(TypeError, match="TxnID"):
        s.discard((1, 10))


def test_contains_many_over_arrays(impl):
    s = impl.AbortSet(impl.TxnID(c, q) for c in range(3) for q in range(0, 100, 2))
    probes = [(c, q) for c in range(4) for q in range(100)]
    msb, lsb = halves(impl, probes)
    mask = s.contains_many(msb, lsb)
    assert mask.dtype == np.bool_ and mask.shape == (400,)
    assert mask.tolist() == [c < 3 and q % 2 == 0 for c, q in probes]
    # Java-style signed halves are reinterpreted, not refused.
    top = impl.TxnID(65535, MAX_SEQ)
    s.add(top)
    assert s.contains_many(
        np.array([-1], dtype=np.int64), np.array([-1], dtype=np.int64)
    ).tolist() == [True]
    assert s.contains_many([], []).shape == (0,)
    assert impl.AbortSet().contains_many(msb[:3], lsb[:3]).tolist() == [False] * 3
    with pytest.raises(ValueError, match="length"):
        s.contains_many(msb, lsb[:-1])
    with pytest.raises(TypeError):
        s.contains_many(np.array([1.5]), np.array([2.5]))
    with pytest.raises(ValueError):
        s.contains_many(np.zeros((2, 2), dtype=np.uint64), np.zeros((2, 2), dtype=np.uint64))


def test_prune_below_only_touches_one_coordinator(impl):
    s = impl.AbortSet(impl.TxnID(c, q) for c in (0, 1, 2) for q in (0, 5, 9, 1 << 80))
    assert s.prune_below(1, 9) == 2
    assert {(t.coordinator_id, t.sequence) for t in s if t.coordinator_id == 1} == {
        (1, 9),
        (1, 1 << 80),
    }
    assert s.prune_below(0, MAX_SEQ + 1) == 4  # everything of coordinator 0
    assert all(t.coordinator_id == 2 for t in s if t.coordinator_id != 1)
    assert s.prune_below(2, 0) == 0
    assert len(s) == 6
    with pytest.raises(ValueError):
        s.prune_below(65536, 1)
    with pytest.raises(ValueError):
        s.prune_below(0, MAX_SEQ + 2)
    with pytest.raises(ValueError):
        s.prune_below(0, -1)
    assert len(s) == 6


def test_snapshot_round_trip_and_corrupt_snapshots(impl):
    s = impl.AbortSet(impl.TxnID(c, q) for c, q in [(3, 1), (0, 0), (65535, MAX_SEQ), (1, 1 << 64)])
    data = s.to_bytes()
    assert data[:4] == b"PTAS" and len(data) == 16 + 16 * 4
    # Sorted, big-endian: the members' pack() in TxnID order.
    assert data[16:] == b"".join(t.pack() for t in sorted(s))
    back = impl.AbortSet.from_bytes(data)
    assert back == s and set(back) == set(s)
    assert impl.AbortSet.from_bytes(memoryview(data)) == s
    assert pickle.loads(pickle.dumps(s)) == s
    assert s.copy() == s and s.copy() is not s
    assert impl.AbortSet.from_bytes(impl.AbortSet().to_bytes()) == impl.AbortSet()
    for bad in [
        b"",
        b"PTAS",
        b"XXXX" + data[4:],
        data[:-1],
        data + b"\x00",
        data[:4] + b"\x02" + data[5:],
    ]:
        with pytest.raises(ValueError):
            impl.AbortSet.from_bytes(bad)
    huge = bytearray(data)
    huge[8:16] = (1 << 63).to_bytes(8, "little")
    with pytest.raises(ValueError, match="cannot hold"):
        impl.AbortSet.from_bytes(bytes(huge))
    with pytest.raises(TypeError):
        impl.AbortSet.from_bytes(3)


def test_iteration_detects_mutation():
    s = NATIVE.AbortSet(NATIVE.TxnID(0, q) for q in range(10))
    with pytest.raises(RuntimeError, match="changed"):
        for t in s:
            s.add(NATIVE.TxnID(1, t.sequence))


def test_many_members_with_deletions(impl):
    """Backward-shift deletion keeps every remaining member findable after heavy churn."""
    n = 20_000 if impl is NATIVE else 4_000
    rng = np.random.default_rng(7)
    seqs = rng.choice(1 << 40, size=n, replace=False)
    s = impl.AbortSet()
    msb = np.full(n, 5 << 48, dtype=np.uint64)
    lsb = seqs.astype(np.uint64)
    s.add_many(msb, lsb)
    assert len(s) == n
    for q in seqs[::2]:
        s.discard(impl.TxnID(5, int(q)))
    mask = s.contains_many(msb, lsb)
    assert mask.tolist() == [i % 2 == 1 for i in range(n)]
    assert len(s) == n // 2


def test_a_million_members_native_matches_twin():
    rng = np.random.default_rng(11)
    n = 1_000_000
    msb = (rng.integers(0, 16, n, dtype=np.uint64) << np.uint64(48)) | rng.integers(
        0, 4, n, dtype=np.uint64
    )
    lsb = rng.integers(0, 1 << 63, n, dtype=np.uint64)
    native, twin = NATIVE.AbortSet(), REFERENCE.AbortSet()
    native.add_many(msb, lsb)
    twin.add_many(msb, lsb)
    assert len(native) == len(twin)
    probe_msb = np.concatenate([msb[:50_000], msb[:50_000]])
    probe_lsb = np.concatenate([lsb[:50_000], lsb[:50_000] ^ np.uint64(1)])
    assert np.array_equal(
        native.contains_many(probe_msb, probe_lsb), twin.contains_many(probe_msb, probe_lsb)
    )
    assert native.to_bytes() == twin.to_bytes()
    assert native.prune_below(3, 1 << 60) == twin.prune_below(3, 1 << 60)
    assert len(native) == len(twin)


@given(st.lists(ids, max_size=40), st.lists(ids, max_size=40))
def test_native_and_twin_agree_on_random_members(members, probes):
    sets = []
    for impl in (NATIVE, REFERENCE):
        s = impl.AbortSet(impl.TxnID(c, q) for c, q in members)
        sets.append((impl, s))
    (n_impl, native), (r_impl, twin) = sets
    assert len(native) == len(twin) == len(set(members))
    assert native.to_bytes() == twin.to_bytes()
    assert {int(t) for t in native} == {int(t) for t in twin}
    pm = probes + members[:5]
    assert np.array_equal(
        native.contains_many(*halves(n_impl, pm)), twin.contains_many(*halves(r_impl, pm))
    )
    assert np.array_equal(native.to_arrays()[0], twin.to_arrays()[0])


class AbortSetMachine(RuleBasedStateMachine):
    """Random add/discard/prune/snapshot sequences against a set of (coordinator, sequence)."""

    def __init__(self):
        super().__init__()
        self.model: set[tuple[int, int]] = set()
        self.native = NATIVE.AbortSet()
        self.twin = REFERENCE.AbortSet()

    @rule(t=pooled)
    def add(self, t):
        self.model.add(t)
        self.native.add(NATIVE.TxnID(*t))
        self.twin.add(REFERENCE.TxnID(*t))

    @rule(t=pooled)
    def discard(self, t):
        self.model.discard(t)
        self.native.discard(NATIVE.TxnID(*t))
        self.twin.discard(REFERENCE.TxnID(*t))

    @rule(c=st.integers(0, 3), w=st.integers(0, 42))
    def prune(self, c, w):
        expected = {t for t in self.model if t[0] == c and t[1] < w}
        self.model -= expected
        assert self.native.prune_below(c, w) == len(expected)
        assert self.twin.prune_below(c, w) == len(expected)

    @precondition(lambda self: len(self.model) > 0)
    @rule()
    def snapshot_restore(self):
        self.native = NATIVE.AbortSet.from_bytes(self.native.to_bytes())
        self.twin = REFERENCE.AbortSet.from_bytes(self.twin.to_bytes())

    @invariant()
    def agree(self):
        assert len(self.native) == len(self.twin) == len(self.model)
        probes = sorted(self.model | {(c, q) for c in range(2) for q in range(0, 41, 7)})
        expected = [p in self.model for p in probes]
        assert self.native.contains_many(*halves(NATIVE, probes)).tolist() == expected
        assert self.twin.contains_many(*halves(REFERENCE, probes)).tolist() == expected
        assert {(t.coordinator_id, t.sequence) for t in self.native} == self.model


TestAbortSetMachine = AbortSetMachine.TestCase
