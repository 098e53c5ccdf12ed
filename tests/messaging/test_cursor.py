"""The durable cursor: mark-delete, acknowledged ranges and batch acks, and their record."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulsartxn._native import AckSet
from pulsartxn.messaging.cursor import Cursor


def test_mark_delete_advances_over_contiguous_acks():
    c = Cursor()
    assert c.ack(1) and c.mark_delete == -1
    assert c.ack(0) and c.mark_delete == 1 and not c.acked
    assert not c.ack(0)  # already acknowledged
    c.ack(5)
    c.ack(3)
    assert c.mark_delete == 1 and c.acked == {3, 5}
    c.ack_cumulative(4)
    assert c.mark_delete == 5 and not c.acked


def test_batch_index_acks_complete_an_entry():
    c = Cursor()
    for i in range(3):
        assert c.ack(0, i, 4)
    assert c.mark_delete == -1 and c.is_acked(0, 1) and not c.is_acked(0, 3)
    assert not c.ack(0, 1, 4)
    c.ack(0, 3, 4)
    assert c.mark_delete == 0 and not c.batch_acks
    c.ack_cumulative(2, 1, 4)  # entries below 2, and indexes 0..1 of entry 2
    assert c.mark_delete == 1 and c.is_acked(2, 1) and not c.is_acked(2, 2)


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(-1, 7)), max_size=80))
def test_record_round_trip(acks):
    c = Cursor(3)
    for entry, index in acks:
        c.ack(entry, index, 8 if index >= 0 else 0)
    back = Cursor.deserialize(c.serialize())
    assert back.mark_delete == c.mark_delete and back.acked == c.acked
    assert {e: a.to_words() for e, a in back.batch_acks.items()} == {
        e: a.to_words() for e, a in c.batch_acks.items()
    }
    for entry in range(70):
        for index in range(-1, 8):
            assert back.is_acked(entry, index) == c.is_acked(entry, index)


def test_ack_set_merges_and_ranges_stay_compact():
    c = Cursor()
    for e in range(10, 1010):
        c.ack(e)
    assert len(c.serialize()) < 100  # one range, not a thousand ids
    part = AckSet(4)
    part.set_range(0, 2)
    assert c.ack_set(5, part) and not c.ack_set(5, part)
    rest = AckSet(4)
    rest.set_range(2, 4)
    c.ack_set(5, rest)
    assert c.is_acked(5) and 5 in c.acked


@given(
    st.lists(
        st.tuples(st.sampled_from(["ack", "batch", "cumulative"]), st.integers(0, 60)),
        max_size=120,
    )
)
def test_ranges_follow_a_model_of_acknowledged_entries(steps):
    """Against a plain set of whole-entry acks: mark-delete is the end of the prefix, the
    ranges are the rest as maximal runs, and the record written from them reads back the
    same."""
    c, model = Cursor(), set()
    for op, entry in steps:
        if op == "ack":
            c.ack(entry)
            model.add(entry)
        elif op == "batch":
            for index in range(3):  # an entry of 3 acknowledged index by index
                c.ack(entry, index, 3)
            model.add(entry)
        else:
            c.ack_cumulative(entry)
            model.update(range(entry + 1))
        mark = -1
        while mark + 1 in model:
            mark += 1
        rest = sorted(e for e in model if e > mark)
        assert c.mark_delete == mark and c.acked == set(rest)
        runs = []
        for e in rest:
            if runs and runs[-1][1] == e:
                runs[-1][1] = e + 1
            else:
                runs.append([e, e + 1])
        assert sorted(c._starts.items()) == [tuple(r) for r in runs]
        assert c._ends == {b: a for a, b in c._starts.items()}
    back = Cursor.deserialize(c.serialize())
    assert back.mark_delete == c.mark_delete and back.acked == c.acked
    assert back._starts == c._starts and back._ends == c._ends


def _size(entry_id: int) -> int:
    return 2 + entry_id % 5  # one batch size per entry, as a ledger has


def _random_cursor(rng):
    cursor = Cursor(rng.randint(-1, 5))
    for _ in range(rng.randint(0, 40)):
        e = rng.randint(0, 60)
        kind = rng.random()
        if kind < 0.5:
            cursor.ack(e)
        elif kind < 0.8:
            size = _size(e)
            cursor.ack(e, rng.randrange(size), size)
        elif kind < 0.9:
            cursor.ack_cumulative(rng.randint(0, 30))
        else:
            size = _size(e)
            cursor.ack_cumulative(e, rng.randrange(size), size)
    return cursor


def _random_pending(rng):
    entries = []
    for _ in range(rng.randint(0, 6)):
        e = rng.randint(0, 70)
        if rng.random() < 0.6:
            entries.append((1, e, None))
        else:
            size = _size(e)
            acks = AckSet(size)
            for i in rng.sample(range(size), rng.randint(1, size)):
                acks.set(i)
            entries.append((1, e, acks))
    cumulative = None
    if rng.random() < 0.6:
        e = rng.randint(0, 70)
        if rng.random() < 0.5:
            cumulative = (e, -1, 0)
        else:
            size = _size(e)
            cumulative = (e, rng.randrange(size), size)
    return entries, cumulative


@pytest.mark.parametrize("seed", range(40))
def test_a_record_with_pending_acks_is_the_record_once_they_are_applied(seed):
    """serialize(pending) gives the record the cursor will have once a commit (or several)
    has applied its acks, as the commit applies them, and changes nothing meanwhile."""
    rng = random.Random(seed)
    for _ in range(25):
        cursor = _random_cursor(rng)
        pending = [_random_pending(rng) for _ in range(rng.randint(1, 3))]
        before = cursor.serialize()
        got = cursor.serialize(pending)
        assert cursor.serialize() == before
        applied = Cursor.deserialize(before)
        for entries, cumulative in pending:
            for _, entry_id, acks in entries:
                if acks is None:
                    applied.ack(entry_id)
                else:
                    applied.ack_set(entry_id, acks)
            if cumulative is not None:
                applied.ack_cumulative(*cumulative)
        assert got == applied.serialize()
