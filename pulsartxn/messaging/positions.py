"""Where a cursor is put by a seek or a reader's start (a MessageId, MessageId.earliest or
.latest, or a publish time), and a partition's last readable message. See docs/API.md,
"Consuming" and "Reading"."""

from __future__ import annotations

import contextlib

from .._native import decode_header
from ..errors import InvalidMessageId, excerpt
from .message import MessageId
from .partition import Partition

# (mark_delete, partial): the cursor's mark-delete position, and a cumulative ack inside the
# next entry ((entry id, batch index, batch size) as Cursor.ack_cumulative takes it) or None.
Start = tuple[int, "tuple[int, int, int] | None"]


def check_position(position: object) -> None:
    """TypeError unless `position` is a MessageId or a publish time (ms since the epoch)."""
    if isinstance(position, MessageId):
        return
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(
            f"expected a MessageId or a timestamp in ms, not {excerpt(position)} "
            f"({type(position).__name__})"
        )
    if position < 0:
        raise ValueError(f"a timestamp must be non-negative, not {position}")


def is_earliest(mid: MessageId) -> bool:
    return mid.ledger_id() == -1 and mid.entry_id() == -1


def is_latest(mid: MessageId) -> bool:
    latest = MessageId.latest
    return mid.ledger_id() == latest.ledger_id() and mid.entry_id() == latest.entry_id()


def is_everywhere(position: object) -> bool:
    """Whether `position` applies to every partition (earliest, latest, a timestamp)."""
    return not isinstance(position, MessageId) or is_earliest(position) or is_latest(position)


def partition_of(position: MessageId, partitions: list[Partition], topic: str) -> Partition:
    """The partition a MessageId names (InvalidMessageId if none of `partitions`)."""
    for part in partitions:
        if part.index == position.partition():
            return part
    raise InvalidMessageId(f"{position!r} is not from {topic}")


def start_of(part: Partition, position, inclusive: bool = True) -> Start:
    """Where a cursor on `part` must be for the next message delivered to be the one at
    `position` (inclusive) or the first after it; a position past the end is the end."""
    first, end = part.first_entry_id, part.latest_entry_id + 1  # claimed ids included
    if not isinstance(position, MessageId):
        return first_published_at(part, position) - 1, None
    if is_earliest(position):
        return first - 1, None
    if is_latest(position):
        return end - 1, None
    if position.ledger_id() != part.ledger_id:
        raise InvalidMessageId(f"{position!r} is not from {part.topic} (ledger {part.ledger_id})")
    entry_id, bi = position.entry_id(), position.batch_index()
    if entry_id >= end:
        return end - 1, None
    if entry_id < first:
        return first - 1, None
    n = part.message_count(entry_id)
    if n > 1 and bi >= 0:
        if bi >= n:
            raise InvalidMessageId(
                f"no batch index {bi} in entry {entry_id} on {part.topic}, which holds {n}"
            )
        upto = bi - 1 if inclusive else bi
        if upto < 0:
            return entry_id - 1, None
        if upto == n - 1:
            return entry_id, None
        return entry_id - 1, (entry_id, upto, n)
    return (entry_id - 1 if inclusive else entry_id), None


def reset(subs: list, starts: list[Start]) -> None:
    """Seek each subscription of `subs` to its start, durably (a restart finds the reset
    cursors); every one's check comes before any reset: a refused seek changes nothing."""
    with contextlib.ExitStack() as locks:
        for sub in subs:
            locks.enter_context(sub.lock)
        for sub in subs:
            sub.check_seek()
        for sub, (mark, partial) in zip(subs, starts):
            sub.reset(mark, partial)
    for sub in subs:
        sub.wait_persisted()
        sub.notify()


def _publish_time(part: Partition, entry_id: int) -> int:
    with part.storage.read() as lmdb_txn:
        _, bufs = part.log.scan(lmdb_txn, entry_id, entry_id + 1)
        return decode_header(bufs[0], verify=False).publish_time if bufs else -1


def first_published_at(part: Partition, timestamp: int) -> int:
    """The first entry published at or after `timestamp` (the end when none), by a binary
    search over the entry headers' publish times (which never go back in one partition)."""
    lo, hi = part.first_entry_id, part.next_entry_id
    while lo < hi:
        mid = (lo + hi) // 2
        if _publish_time(part, mid) >= timestamp:
            hi = mid
        else:
            lo = mid + 1
    return lo


def last_message(part: Partition, read_committed: bool = True) -> tuple[MessageId, int]:
    """(id, publish time) of the last message a reader of `part` may read: below the max
    read position when read committed, never a marker or an aborted transaction's, so that
    a reader never waits for one that will not come (Pulsar #11877, #22610). Nothing yet:
    entry -1 and publish time -1."""
    last = part.last_readable_entry(read_committed)
    if last < 0:
        return MessageId(part.ledger_id, -1, part.index), -1
    n = part.message_count(last)
    mid = MessageId(part.ledger_id, last, part.index, n - 1 if n > 1 else -1, n if n > 1 else 0)
    return mid, _publish_time(part, last)


def last_of(lasts: list[tuple[MessageId, int]]) -> MessageId:
    """Of partitions' last messages, the one published last (the highest partition on a
    tie); MessageId.earliest when none holds one. One partition: its own, as it is."""
    if len(lasts) == 1:
        return lasts[0][0]
    found = [(t, mid.partition(), mid) for mid, t in lasts if mid.entry_id() >= 0]
    if not found:
        return MessageId.earliest
    return max(found, key=lambda f: f[:2])[2]
