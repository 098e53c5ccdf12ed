"""Key_Shared dispatch (Pulsar's PersistentStickyKeyDispatcherMultipleConsumers): a
subscription's messages spread over its consumers by key, every message of a key to one
consumer, in order. Keys hash onto a ring of points per consumer (Pulsar's consistent hashing
selector, auto-split); a key whose consumer changed waits until its earlier messages, still
pending at the consumer it had, are acknowledged or given back (Pulsar's draining hashes)."""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from operator import itemgetter

from .._native import Pending, crc32c
from .message import Message, MessageId

NONE_KEY = b"NONE_KEY"  # the one key of messages that have none, as Pulsar's
POINTS = 100  # points per consumer on the ring (Pulsar's keySharedConsistentHashingReplicaPoints)
LOOKAHEAD = 10_000  # messages of other consumers' keys queued before a take stops reading on
HASHES = 65_536  # keys whose hash is kept (then forgotten all at once)
_POSITION = itemgetter(0)  # of a read-ahead item (position, payload)


def sticky_key(payload) -> bytes:
    """The key a read-ahead payload is dispatched by: its ordering key if it has one, else
    its partition key (None: NONE_KEY), as Pulsar's."""
    key = _key_of(payload)
    if key is None:
        return NONE_KEY
    return key.encode() if isinstance(key, str) else bytes(key)


def _key_of(payload):
    """A payload's ordering key (its 7th item: event time, ordering key) or partition key."""
    if len(payload) > 6 and payload[6][1] is not None:
        return payload[6][1]
    return payload[2]


def key_hash(key: bytes) -> int:
    """A key's place on the ring: CRC32C, then MurmurHash3's finalizer (CRC alone is linear:
    keys and points that differ a little would crowd together)."""
    h = crc32c(key)
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


class KeySelector:
    """The ring: each consumer's POINTS points; a hash goes to the first point at or after it.
    A consumer joining or leaving moves only the hashes next to its points."""

    def __init__(self) -> None:
        self._points: list[tuple[int, int]] = []  # (hash, order joined), sorted
        self._owner: dict[tuple[int, int], object] = {}
        self._joined = 0

    def add(self, consumer, name: str) -> None:
        self._joined += 1
        for i in range(POINTS):
            point = (key_hash(f"{name}{i}".encode()), self._joined)
            bisect.insort(self._points, point)
            self._owner[point] = consumer

    def remove(self, consumer) -> None:
        self._points = [p for p in self._points if self._owner[p] is not consumer]
        self._owner = {p: c for p, c in self._owner.items() if c is not consumer}

    def select(self, h: int):
        points = self._points
        if not points:
            return None
        i = bisect.bisect_left(points, (h, 0))
        return self._owner[points[i if i < len(points) else 0]]


class KeyShared:
    """A Key_Shared subscription's dispatch state; used under the subscription's lock.

    What the read-ahead reads is routed to a queue per consumer, by its key's place on the
    ring, in order: a take looks at its own consumer's messages only, never again at another's
    (reading past another's 10,000 messages at every take cost a take 6 ms and made two
    consumers a quarter as fast as Shared). The queues hold at most LOOKAHEAD messages of
    consumers other than the one taking. A ring change puts them back into the read-ahead in
    position order, to be routed again; a read-ahead that reads again drops them with what it
    read (they are read again)."""

    def __init__(self) -> None:
        self.selector = KeySelector()
        self._hash_of: dict[tuple[int, int], int] = {}  # delivered message -> its key's hash
        # hash -> consumer -> messages of that hash delivered to it (some acknowledged since)
        self._sent: dict[int, dict[object, set]] = {}
        self._tracked = 0
        self._hashes: dict = {}  # key as the payload holds it -> its hash
        self._owners: dict[int, object] = {}  # hash -> its consumer on the ring as it is
        self._queues: dict[object, deque] = {}  # consumer -> its read-ahead items, in order
        self._queued = 0  # items in all the queues
        # The last position routed in read order: what comes from the read-ahead before it
        # is a due delayed message put back in front (None: nothing routed since a reset).
        self._routed_upto = None
        self._rewinds = 0  # the read-ahead's rewinds the queues are of
        # A take passed over a key draining elsewhere since the last `unblocked()`: the next
        # ack, nack or transactional hold here rouses every parked consumer.
        self.blocked = False
        # A take stopped at LOOKAHEAD since: the next take that delivers rouses them (an ack
        # does not: only a take moves the messages it stopped behind).
        self.held_back = False

    def _hash(self, payload) -> int:
        key = _key_of(payload)
        h = self._hashes.get(key)
        if h is None:
            if len(self._hashes) >= HASHES:
                self._hashes.clear()
            h = self._hashes[key] = key_hash(sticky_key(payload))
        return h

    def _owner(self, h: int):
        owner = self._owners.get(h)
        if owner is None:
            if len(self._owners) >= HASHES:
                self._owners.clear()
            owner = self._owners[h] = self.selector.select(h)
        return owner

    def unblocked(self, by_take: bool = False) -> bool:
        """Whether the consumers parked should look again (lock held): a message just left
        its consumer, and a take was blocked by a key draining since the last call; or a take
        delivered (`by_take`), and one stopped at LOOKAHEAD since."""
        was = self.blocked or (by_take and self.held_back)
        self.blocked = False
        if by_take:
            self.held_back = False
        return was

    def queued(self) -> bool:
        """Whether messages wait in the consumers' queues (lock held)."""
        return self._queued > 0

    def joined(self, consumer, read_ahead) -> None:
        self._requeue(read_ahead)
        self.selector.add(consumer, consumer.consumer_name())

    def left(self, consumer, read_ahead) -> None:
        self._requeue(read_ahead)
        self.selector.remove(consumer)
        for by in self._sent.values():
            by.pop(consumer, None)

    def _requeue(self, read_ahead) -> None:
        """The ring changes: every queued item goes back to the read-ahead, in position order,
        to be routed again."""
        self._owners.clear()
        queues, self._queues, self._queued = self._queues, {}, 0
        self._routed_upto = None
        if read_ahead.rewinds != self._rewinds:
            self._rewinds = read_ahead.rewinds  # they were dropped with what it read
            return
        items = [q for q in queues.values() if q]
        if items:
            merged = list(heapq.merge(*items, read_ahead.buffer, key=_POSITION))
            read_ahead.buffer.clear()
            read_ahead.buffer.extend(merged)

    def _queue_of(self, consumer, read_ahead) -> deque:
        """`consumer`'s queue, once the queues are of what the read-ahead holds now."""
        if read_ahead.rewinds != self._rewinds:
            self._rewinds = read_ahead.rewinds
            self._queues, self._queued, self._routed_upto = {}, 0, None
        buf, upto = read_ahead.buffer, self._routed_upto
        while buf and upto is not None and buf[0][0] < upto:
            self._place(buf.popleft())  # due delayed ones: to their places before a take
        return self._queue(consumer)

    def _queue(self, consumer) -> deque:
        queue = self._queues.get(consumer)
        if queue is None:
            queue = self._queues[consumer] = deque()
        return queue

    def _place(self, item) -> None:
        """Route one read-ahead item to its consumer's queue: at the end in read order; a due
        delayed message (before what was routed) at its place by position, as Pulsar
        replays the messages it holds back, in position order."""
        target = self._queue(self._owner(self._hash(item[1])))
        upto = self._routed_upto
        if upto is not None and item[0] < upto:
            target.insert(bisect.bisect_left(target, item[0], key=_POSITION), item)
        else:
            target.append(item)
            self._routed_upto = item[0]
        self._queued += 1

    def _route(self, sub, consumer, queue) -> bool:
        """Route what the read-ahead holds (reading on) to the queues until `consumer`'s gets
        one more item; False when there is none to read, or when LOOKAHEAD messages of other
        consumers are queued (then a take of theirs frees the way)."""
        ra = sub.read_ahead
        buf = ra.buffer
        before = len(queue)
        while len(queue) == before:
            if not buf:
                if self._queued - len(queue) >= LOOKAHEAD:
                    # As far as a take reads ahead: the next take of another consumer (which
                    # takes some of these) rouses this one, or it would wait for a publish.
                    self.held_back = True
                    return False
                if not ra.fill(sub.read_committed):
                    return False
                continue
            self._place(buf.popleft())
        return True

    def _may_take(self, pending: dict, consumer, h: int) -> bool:
        """Whether `consumer` may have a message of hash h now: the key is its, and no
        earlier message of it is pending at another consumer."""
        if self._owner(h) is not consumer:
            return False
        return self._free(pending, consumer, h)

    def _free(self, pending: dict, consumer, h: int) -> bool:
        """No earlier message of hash h is pending at a consumer other than `consumer` (a
        key whose consumer changed waits until those are acknowledged or given back)."""
        by = self._sent.get(h)
        if by:
            for other, keys in list(by.items()):
                if other is consumer:
                    continue
                for k in [k for k in keys if _holder(pending, k) is not other]:
                    keys.discard(k)
                if keys:
                    self.blocked = True
                    return False
                del by[other]
        return True

    def _delivered(self, pending: dict, consumer, key, h: int) -> None:
        self._hash_of[key] = h
        self._sent.setdefault(h, {}).setdefault(consumer, set()).add(key)
        self._tracked += 1
        if self._tracked > 2 * len(pending) + 1000:
            self._compact(pending)

    def _compact(self, pending: dict) -> None:
        """Forget the messages no longer pending (amortized over the deliveries)."""
        sent: dict[int, dict[object, set]] = {}
        n = 0
        for h, by in self._sent.items():
            for c, keys in by.items():
                live = {k for k in keys if _holder(pending, k) is c}
                if live:
                    sent.setdefault(h, {})[c] = live
                    n += len(live)
        self._sent, self._tracked = sent, n
        self._hash_of = {k: h for k, h in self._hash_of.items() if k in pending}

    def has_available(self, sub, consumer) -> bool:
        """Whether a take by `consumer` would find a message now (lock held): routes what is
        read ahead, as a take does, up to LOOKAHEAD messages of other consumers' keys."""
        pending, cursor, held = sub._pending, sub.cursor, sub.pending_ack.holds
        for key in sub._redeliver:
            if key in pending or cursor.is_acked(*key) or held(*key):
                continue
            h = self._hash_of.get(key)
            if h is None:
                payload = sub._reread(key)
                if payload is None:
                    continue
                h = self._hash(payload)
            if self._may_take(pending, consumer, h):
                return True
        queue = self._queue_of(consumer, sub.read_ahead)
        seen = 0
        while True:
            for i in range(seen, len(queue)):
                key, payload = queue[i]
                if key in pending or cursor.is_acked(*key) or held(*key):
                    continue
                if self._free(pending, consumer, self._hash(payload)):
                    return True
            seen = len(queue)
            if not self._route(sub, consumer, queue):
                return False

    def take(self, sub, consumer, out: list, n: int, max_bytes: int) -> tuple[int, bool]:
        """As Subscription.take_many (lock held), only messages of `consumer`'s keys, each
        key's in position order: a key passed over once in a take waits for the next."""
        passed: set[int] = set()
        nbytes, full = self._take_redelivered(sub, consumer, out, n, max_bytes, passed)
        if full or len(out) >= n:
            return nbytes, full
        taken, full = self._take_queued(sub, consumer, out, n, max_bytes - nbytes, passed)
        return nbytes + taken, full

    def _take_redelivered(self, sub, consumer, out, n, max_bytes, passed) -> tuple[int, bool]:
        heap = sub._redeliver
        if not heap:
            return 0, False
        pending, counts = sub._pending, sub._redelivery_counts
        held, cursor = sub.pending_ack.holds, sub.cursor
        keep, nbytes, full = [], 0, False
        for key in sorted(heap):
            if full or len(out) >= n:
                keep.append(key)
                continue
            if key in pending or held(*key):
                continue
            if cursor.is_acked(*key):
                counts.pop(key, None)
                continue
            h = self._hash_of.get(key)
            payload = None
            if h is None:
                payload = sub._reread(key)
                if payload is None:
                    continue
                h = self._hash(payload)
            if h in passed or not self._may_take(pending, consumer, h):
                passed.add(h)
                keep.append(key)
                continue
            if payload is None:
                payload = sub._reread(key)
                if payload is None:
                    continue
            if out and nbytes + len(payload[0]) > max_bytes:
                full = True
                keep.append(key)
                continue
            sub.read_ahead.delivered(key)
            count = counts.get(key, 0) + 1
            counts[key] = count
            out.append(sub._deliver(consumer, key, payload, count))
            nbytes += len(payload[0])
            self._delivered(pending, consumer, key, h)
        heapq.heapify(keep)
        sub._redeliver[:] = keep
        if not keep:
            sub.read_ahead.forget_reread()
        return nbytes, full

    def _take_queued(self, sub, consumer, out, n, max_bytes, passed) -> tuple[int, bool]:
        """`consumer`'s queued messages, in order (routing more to the queues as it goes);
        those of a key draining elsewhere stay, in order, for a later take."""
        p = sub.partition
        queue = self._queue_of(consumer, sub.read_ahead)
        pending, counts, cursor = sub._pending, sub._redelivery_counts, sub.cursor
        holds, is_aborted = sub.pending_ack.holds, p.buffer.is_aborted
        kept: list = []
        nbytes = delivered = 0
        full = False
        while len(out) < n:
            if not queue and not self._route(sub, consumer, queue):
                break
            item = queue.popleft()
            self._queued -= 1
            key, payload = item
            if key in pending or cursor.is_acked(*key) or holds(*key):
                continue
            if payload[5] is not None and is_aborted(payload[5]):
                sub._ack_internally(key[0])  # read uncommitted, aborted since
                continue
            h = self._hash(payload)
            if h in passed or not self._free(pending, consumer, h):
                passed.add(h)
                kept.append(item)
                continue
            data, properties, pkey, publish_time, batch_size, _ = payload[:6]
            meta = payload[6] if len(payload) > 6 else (0, None)  # event time, ordering key
            if out and nbytes + len(data) > max_bytes:
                kept.append(item)
                full = True
                break
            count = counts.get(key, 0) if counts else 0
            pending[key] = Pending(consumer, count)
            mid = MessageId(p.ledger_id, key[0], p.index, key[1], batch_size)
            out.append(
                Message(data, properties, pkey, mid, p.topic, publish_time, count, None, *meta)
            )
            self._delivered(pending, consumer, key, h)
            delivered += 1
            nbytes += len(data)
        if kept:
            queue.extendleft(reversed(kept))
            self._queued += len(kept)
        sub.msg_out += delivered
        sub.bytes_out += nbytes
        p.msg_out += delivered
        p.bytes_out += nbytes
        return nbytes, full


def _holder(pending: dict, key):
    """The consumer `key` is pending at, or None."""
    p = pending.get(key)
    return None if p is None else p.consumer
