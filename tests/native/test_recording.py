"""The journal's recorder (``_native/recording.pyx`` and its twin): on random writes through
the recording transaction and cursor, native == twin (the same record bytes and the same
database), and replaying the record on the state before gives the state after."""

from __future__ import annotations

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsartxn._native import load
from pulsartxn.errors import Unrecordable
from pulsartxn.storage.recording import apply_record

NATIVE, REFERENCE = load("native"), load("reference")
NAMES = (b"a", b"b")

keys = st.binary(min_size=1, max_size=6)
values = st.one_of(st.binary(max_size=40), st.binary(min_size=600, max_size=3000))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(NAMES), keys, values),
        st.tuples(st.just("replace"), st.sampled_from(NAMES), keys, values),
        st.tuples(st.just("delete"), st.sampled_from(NAMES), keys),
        st.tuples(st.just("pop"), st.sampled_from(NAMES), keys),
        st.tuples(st.just("cput"), st.sampled_from(NAMES), keys, values),
        st.tuples(st.just("cdelete"), st.sampled_from(NAMES), keys),
        st.tuples(st.just("cpop"), st.sampled_from(NAMES), keys),
        st.tuples(
            st.just("putmulti"),
            st.sampled_from(NAMES),
            st.lists(st.tuples(keys, values), min_size=1, max_size=5),
        ),
        st.tuples(st.just("main"), keys, values),
    ),
    max_size=30,
)


def _env(path):
    env = lmdb.open(str(path), max_dbs=4, map_size=1 << 26, sync=False)
    handles = {}
    with env.begin(write=True) as txn:
        for name in NAMES:
            handles[name] = env.open_db(name, txn=txn, create=True)
    return env, handles


def _run(impl, txn, handles, sequence):
    """The writes of `sequence` through impl's RecordingTxn; the record's payload."""
    rec = impl.Recorder({id(h): name for name, h in handles.items()})
    view = impl.RecordingTxn(txn, rec)
    for op in sequence:
        kind = op[0]
        if kind == "main":
            # LMDB's main database holds the named databases: keys of ours stay apart.
            view.put(b"\x00" + op[1], op[2])
            continue
        db = handles[op[1]]
        if kind == "put":
            view.put(op[2], op[3], db=db)
        elif kind == "replace":
            view.replace(op[2], memoryview(op[3]), db=db)
        elif kind == "delete":
            view.delete(op[2], db=db)
        elif kind == "pop":
            view.pop(op[2], db=db)
        elif kind == "cput":
            view.cursor(db=db).put(op[2], op[3])
        elif kind == "cdelete":
            cursor = view.cursor(db=db)
            if cursor.set_key(op[2]):
                cursor.delete()
        elif kind == "cpop":
            view.cursor(db=db).pop(op[2])
        elif kind == "putmulti":
            rows = dict(op[2])  # one value per key, as a putmulti of distinct keys
            view.cursor(db=db).putmulti(list(rows.items()))
    return rec.payload(), rec.size


def _dump(env, handles):
    with env.begin() as txn:
        out = {name: dict(txn.cursor(db=h)) for name, h in handles.items()}
        out[None] = {k: v for k, v in txn.cursor() if k.startswith(b"\x00")}
    return out


@settings(max_examples=80)
@given(before=ops, sequence=ops)
def test_native_and_twin_record_the_same_and_the_record_replays(tmp_path_factory, before, sequence):
    results = []
    for impl in (NATIVE, REFERENCE):
        env, handles = _env(tmp_path_factory.mktemp(impl.kind))
        with env.begin(write=True) as txn:
            _run(impl, txn, handles, before)
        start = _dump(env, handles)
        with env.begin(write=True) as txn:
            payload, size = _run(impl, txn, handles, sequence)
        results.append((payload, size, start, _dump(env, handles)))
        env.close()
    (p1, s1, start, after), (p2, s2, _, after2) = results
    assert p1 == p2 and s1 == s2 == len(p1)
    assert after == after2
    # Replayed on the state before, the record gives the state after; twice, the same.
    env, handles = _env(tmp_path_factory.mktemp("replay"))
    with env.begin(write=True) as txn:
        _run(NATIVE, txn, handles, before)
    for _ in range(2):
        with env.begin(write=True) as txn:
            apply_record(env, txn, p1, {})
        assert _dump(env, handles) == after
    env.close()


@pytest.mark.parametrize("impl", [NATIVE, REFERENCE], ids=["native", "twin"])
def test_writes_the_journal_cannot_replay_are_refused(tmp_path, impl):
    env, handles = _env(tmp_path)
    other = None
    with env.begin(write=True) as txn:
        other = env.open_db(b"other", txn=txn, create=True)
    db = handles[b"a"]
    with env.begin(write=True) as txn:
        rec = impl.Recorder({id(db): b"a"})
        view = impl.RecordingTxn(txn, rec)
        with pytest.raises(Unrecordable):
            view.put(b"k", b"v", db=db, overwrite=False)
        with pytest.raises(Unrecordable):
            view.cursor(db=db).putmulti([(b"k", b"v")], overwrite=False)
        with pytest.raises(Unrecordable):
            view.put(b"k", b"v", db=other)  # a handle the store never registered
        with pytest.raises(Unrecordable):
            view.drop(db)
        view.cursor(db=db).putmulti([(b"b", b"1")], append=True)
        with pytest.raises(Unrecordable):  # out of order: stopped part way
            view.cursor(db=db).putmulti([(b"c", b"1"), (b"a", b"2")], append=True)
        txn.abort()
    env.close()
