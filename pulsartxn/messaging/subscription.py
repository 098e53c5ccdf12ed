"""Subscriptions (Exclusive, Failover, Shared, Key_Shared): a durable cursor and the
pull-based dispatch of a partition's messages, redeliveries first. What one consumer makes
the broker hold is bounded: a take by its count and byte budget, the read-ahead by
READ_AHEAD_*, a delivered and unacknowledged message by its position only.
See docs/API.md, "Consuming"."""

from __future__ import annotations

import heapq
import threading
from typing import TYPE_CHECKING

from .._native import Pending, take_buffered
from ..errors import (
    AlreadyClosed,
    ConsumerBusy,
    CorruptEntry,
    InvalidConfiguration,
    TransactionConflict,
)
from ..txn.pending_ack import PendingAck
from .ack_timeout import AckTimeouts
from .cursor import Cursor
from .cursor_writes import CursorWrites
from .delayed import DelayedDelivery
from .key_shared import KeyShared
from .message import Message, MessageId
from .parked import Parked
from .partition import Partition
from .readahead import ReadAhead
from .redelivery import Redelivery

if TYPE_CHECKING:
    from .consumer import Consumer

EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
TYPE_NAMES = {
    EXCLUSIVE: "Exclusive",
    SHARED: "Shared",
    FAILOVER: "Failover",
    KEY_SHARED: "Key_Shared",
}
MULTI = (SHARED, KEY_SHARED)  # every consumer receives
_FULL = -2  # take_buffered's answer when the byte budget stopped it


class Subscription(CursorWrites, Redelivery):
    def __init__(self, partition: Partition, name: str, cursor: Cursor) -> None:
        self.partition = partition
        self.name = name
        self.cursor = cursor
        self.lock = threading.RLock()
        # In the order they attached, each with its (ack timeout s, DeadLetter) or None.
        self.consumers: dict[Consumer, tuple | None] = {}
        self.active: Consumer | None = None  # the first: who receives unless Shared
        self.type: int | None = None
        self.parked = Parked(self, partition.awaited)
        self.read_ahead = ReadAhead(partition, cursor, self._filter_out)
        self.delayed = DelayedDelivery()  # messages read before their delivery time
        # Past the read-ahead only positions are held: a message delivered and not yet
        # acknowledged (entry, batch_index) -> Pending, and the heaps of those to redeliver.
        self._pending: dict[tuple[int, int], Pending] = {}
        self._redeliver: list = []  # heap of (entry, batch_index)
        self._nacked: list = []  # heap of (due, (entry, batch_index))
        self._redelivery_counts: dict[tuple[int, int], int] = {}
        self.timeouts = AckTimeouts()  # deliveries to consumers with an ack timeout
        self.key_shared: KeyShared | None = None  # while Key_Shared
        self._persist_queued = False
        self._persist_requested = 0.0
        self._last_persist = None
        self.key = partition.topic.encode() + b"\0" + name.encode()  # in the cursors db
        # Transactions whose commits are being written with this cursor's record in the same
        # write (pending_ack.end_op): TxnID -> (held entries, cumulative ack). Their acks
        # reach the cursor once that write has landed; until then every cursor record
        # written includes them, so that no record written after theirs drops them.
        self.committing: dict = {}
        self.riders: list = []  # writes made with the next cursor record (CursorWrites.ride)
        self.msg_out = 0
        self.bytes_out = 0
        self.read_committed = True
        self.filtered = 0  # messages of aborted transactions acknowledged internally
        # Set under the lock by an unsubscribe that found no transaction holding acks: acks
        # are refused and cursor writes skipped from then on (its records are being deleted).
        self.unsubscribed = False
        self.durable = True  # a reader's is not: its cursor is never written
        self.pending_ack = PendingAck(self)
        self.error: CorruptEntry | None = None
        try:
            self.pending_ack.replay()
        except CorruptEntry as exc:
            # Its pending acks are unknown: this subscription may neither deliver nor finalize
            # (consumers and commits get this error); the partition and its other
            # subscriptions go on, as other coordinators do beside one with a damaged log.
            self.error = CorruptEntry(
                f"subscription {name!r} on {partition.topic} cannot be used: {exc}"
            )

    # -- consumers -------------------------------------------------------------------------

    def attach(
        self,
        consumer: Consumer,
        sub_type: int,
        read_committed: bool = True,
        ack_timeout_s: float = 0.0,
        dead_letter=None,
    ) -> None:
        """`ack_timeout_s` (0: none) and `dead_letter` (a dead_letter.DeadLetter or None)
        apply to what `consumer` takes."""
        if self.error is not None:
            raise self.error
        with self.lock:
            if self.consumers:
                if sub_type != self.type:
                    raise ConsumerBusy(
                        f"subscription {self.name} on {self.partition.topic} is "
                        f"{TYPE_NAMES[self.type]}, not {TYPE_NAMES[sub_type]}"
                    )
                if sub_type == EXCLUSIVE:
                    raise ConsumerBusy(
                        f"exclusive subscription {self.name} on {self.partition.topic} "
                        "already has a consumer"
                    )
            self.type = sub_type
            self.consumers[consumer] = (
                (ack_timeout_s, dead_letter) if ack_timeout_s or dead_letter else None
            )
            if sub_type == KEY_SHARED:
                if self.key_shared is None:
                    self.key_shared = KeyShared()
                self.key_shared.joined(consumer, self.read_ahead)
            if self.active is None:
                self.active = consumer
            if read_committed != self.read_committed:
                self.read_committed = read_committed
                self.read_ahead.rewind(self.cursor.mark_delete + 1)
            self.delayed.use(self.read_ahead, self.cursor, sub_type in (SHARED, KEY_SHARED))

    def detach(self, consumer: Consumer) -> None:
        """`consumer` leaves: what it held goes to the others, and only as many of them are
        woken as that can feed (Failover: the one taking over)."""
        with self.lock:
            self.consumers.pop(consumer, None)
            released = self._release(consumer)
            took_over = self.active is consumer
            self.active = next(iter(self.consumers), None)
            if self.key_shared is not None:
                self.key_shared.left(consumer, self.read_ahead)
            if not self.consumers:
                self.type = self.key_shared = None
            shared = self.type in MULTI
        self.parked.discard(consumer)
        if shared:
            if released:
                self.notify(released)
        elif took_over:
            self.notify()

    def _release(self, consumer) -> int:
        """Every message pending on `consumer` goes back to be delivered again (lock held);
        returns how many."""
        keys = [k for k, p in self._pending.items() if p.consumer is consumer]
        for key in keys:
            del self._pending[key]
            heapq.heappush(self._redeliver, key)
        return len(keys)

    def check_unsubscribe(self, consumer) -> None:
        """Refuse to unsubscribe `consumer` while others are attached or open transactions
        hold acks here, pending or being committed (``ack_holders``; lock held)."""
        if any(c is not consumer for c in self.consumers):
            raise ConsumerBusy(
                f"subscription {self.name} on {self.partition.topic} has other consumers"
            )
        holders = sorted(self.ack_holders())
        if holders:
            named = ", ".join(str(t) for t in holders[:5])
            more = f" and {len(holders) - 5} more" if len(holders) > 5 else ""
            raise TransactionConflict(
                f"cannot unsubscribe {self.name!r} on {self.partition.topic}: open "
                f"transactions {named}{more} hold acknowledgements on it; commit or abort "
                "them first"
            )

    def may_receive(self, consumer) -> bool:
        if self.type in MULTI:
            return consumer in self.consumers
        return consumer is self.active and consumer is not None

    def park(self, consumer) -> None:
        """`consumer` is about to wait for a message (it polls once more after this)."""
        self.parked.add(consumer)

    def notify(self, k: int | None = None) -> None:
        """Rouse consumers parked in a receive: k of them (Shared), every one (k None), or
        the one that receives here (Exclusive, Failover). Roused ones no longer wait here."""
        if self.type not in MULTI:
            active = self.active
            if active is not None:
                active._wake_parked()
        elif self.parked:
            self.parked.rouse(None if self.type == KEY_SHARED else k)  # whose keys: unknown

    def pass_on(self) -> None:
        """Rouse a parked consumer if there may be more to take (a wake-up is handed on)."""
        if self.parked and self.type in MULTI:
            with self.lock:
                more = self._more_to_take()
            if more:
                self.notify(1)

    def _more_to_take(self) -> bool:
        """Whether a take may find more now (lock held): True when unsure, never False when
        there is."""
        return bool(
            self._redeliver
            or self.read_ahead.buffer
            or (self.key_shared is not None and self.key_shared.queued())
            or self.read_ahead.position < self.partition.dispatch_end(self.read_committed)
        )

    # -- dispatch --------------------------------------------------------------------------

    def take(self, consumer) -> Message | None:
        out: list[Message] = []
        self.take_many(consumer, out, 1, 0)
        return out[0] if out else None

    def take_many(self, consumer, out: list, n: int, max_bytes: int) -> tuple[int, bool]:
        """Messages for `consumer` into `out` until it holds n: redeliveries first, then
        read-ahead entries (one lock acquisition for all of them). A message whose data would
        bring the bytes taken past max_bytes stays, unless `out` is empty (it goes alone).
        Returns (bytes taken, whether max_bytes stopped it)."""
        start = len(out)
        moved = dead_letter = None
        drained = False
        with self.lock:
            if not self.may_receive(consumer):
                return 0, False
            if self._nacked or self.timeouts:
                self._due_nacks()
            if self.delayed:
                self.delayed.release_due(self.read_ahead)
            nbytes, full = 0, False
            if self.key_shared is not None:
                nbytes, full = self.key_shared.take(self, consumer, out, n, max_bytes)
                drained = len(out) > start and self.key_shared.unblocked(by_take=True)
            else:
                if self._redeliver:
                    nbytes, full = self._take_redelivered(consumer, out, n, max_bytes)
                if not full and len(out) < n:
                    taken, full = self._take_buffered(consumer, out, n, max_bytes - nbytes)
                    nbytes += taken
            opts = self.consumers.get(consumer) if len(out) > start else None
            if opts is not None:
                # Past the consumer's dead letter policy they are diverted, to be moved; the
                # rest are under its ack timeout, if any.
                timeout_s, dead_letter = opts
                if dead_letter is not None:
                    moved = dead_letter.divert(self, out, start)
                if timeout_s:
                    self.timeouts.delivered(self._pending, consumer, out[start:], timeout_s)
            woke, self.delayed.woke = self.delayed.woke, False
        if moved:
            dead_letter.move(self, moved)
        if woke:
            self.notify()  # a delayed message due before what parked receives wait for
        elif drained:
            self.notify()  # what this take took may let a blocked consumer's take on
        return nbytes, full

    def _take_buffered(self, consumer, out: list, n: int, max_bytes: int) -> tuple[int, bool]:
        """Deliver read-ahead messages into `out` until it holds n (lock held), as take_many:
        the path every message takes once, walked by the native loop (``take_buffered``)."""
        cursor = self.cursor
        pending_ack = self.pending_ack
        holds = pending_ack.holds if pending_ack.cumulative or len(pending_ack.index) else None
        p = self.partition
        is_aborted = p.buffer.is_aborted
        buffer = self.read_ahead.buffer
        delivered = nbytes = 0
        full = False
        while len(out) < n:
            if not buffer and not self.read_ahead.fill(self.read_committed):
                break
            # The cursor may move between fills (an internal ack of a filtered entry).
            d, b, stop = take_buffered(
                buffer,
                n,
                max_bytes - nbytes,
                out,
                consumer,
                self._pending,
                self._redelivery_counts,
                cursor.mark_delete,
                cursor.acked,
                cursor.batch_acks,
                holds,
                is_aborted,
                p.ledger_id,
                p.index,
                p.topic,
                Pending,
                Message,
                None,  # each Message makes its MessageId when first asked
            )
            delivered += d
            nbytes += b
            if stop == _FULL:
                full = True
                break
            if stop >= 0:
                # Read uncommitted, aborted since it was read: never delivered.
                self._ack_internally(stop)
        self.msg_out += delivered
        self.bytes_out += nbytes
        p.msg_out += delivered
        p.bytes_out += nbytes
        return nbytes, full

    def _deliver(self, consumer, key, payload, count) -> Message:
        """One redelivered message (the read-ahead path is _take_buffered)."""
        self._pending[key] = Pending(consumer, count)
        data, properties, pkey, publish_time, batch_size, _ = payload[:6]
        entry_id, batch_index = key
        p = self.partition
        self.msg_out += 1
        self.bytes_out += len(data)
        p.msg_out += 1
        p.bytes_out += len(data)
        mid = MessageId(p.ledger_id, entry_id, p.index, batch_index, batch_size)
        meta = payload[6] if len(payload) > 6 else (0, None)  # event time, ordering key
        return Message(data, properties, pkey, mid, p.topic, publish_time, count, None, *meta)

    def _filter_out(self, entry_id: int, count: int) -> None:
        """A marker or an aborted transaction's entry: never delivered, acknowledged
        internally so that it does not hold back the cursor (lock held)."""
        self.filtered += count
        self._ack_internally(entry_id)

    def _ack_internally(self, entry_id: int) -> None:
        if self.cursor.ack(entry_id):
            self._persist()
        if self._redelivery_counts:
            self.forget_acked(None, ((None, entry_id, None),))

    def has_available(self, consumer) -> bool:
        with self.lock:
            self._due_nacks()
            if self.delayed:
                self.delayed.release_due(self.read_ahead)
            if self.key_shared is not None:
                return self.key_shared.has_available(self, consumer)
            if any(
                not self.cursor.is_acked(*k)
                and k not in self._pending
                and not self.pending_ack.holds(*k)
                for k in self._redeliver
            ):
                return True
            while True:
                for key, _ in self.read_ahead.buffer:
                    if (
                        key not in self._pending
                        and not self.cursor.is_acked(*key)
                        and not self.pending_ack.holds(*key)
                    ):
                        return True
                self.read_ahead.buffer.clear()
                if not self.read_ahead.fill(self.read_committed):
                    return False

    # -- acknowledgement -------------------------------------------------------------------

    def acknowledge(self, mid: MessageId, cumulative: bool = False) -> None:
        p = self.partition
        entry_id, bi, size = p.position_of(mid)
        with self.lock:
            if self.unsubscribed:
                raise AlreadyClosed(f"subscription {self.name!r} on {p.topic} was unsubscribed")
            self.pending_ack.check_plain_ack(entry_id, bi, cumulative)
            if cumulative:
                if self.type in MULTI:
                    raise InvalidConfiguration(
                        "cumulative acknowledgement is not allowed on "
                        f"{TYPE_NAMES[self.type]} subscription {self.name}"
                    )
                changed = self.cursor.ack_cumulative(entry_id, bi, size)
                self.forget_acked((entry_id, bi, size))
            else:
                changed = self.cursor.ack(entry_id, bi, size)
                self._pending.pop((entry_id, bi), None)
                if self._redelivery_counts:
                    self._redelivery_counts.pop((entry_id, bi), None)
            if changed:
                self._persist()
            drained = self.key_shared is not None and self.key_shared.unblocked()
        if drained:
            self.notify()  # a key draining here may be free for its new consumer now

    def redeliver_unacknowledged(self, consumer) -> None:
        with self.lock:
            released = self._release(consumer)
        if released:
            self.notify(released if self.type in MULTI else None)

    def ack_holders(self) -> set:
        """The open transactions holding acknowledgements here: pending, or being committed."""
        # (A dead letter move's token is no transaction: the move is one write, not held.)
        committing = {t for t in list(self.committing) if not isinstance(t, tuple)}
        return self.pending_ack.transactions() | committing

    def check_seek(self) -> None:
        """Refuse a seek while transactions hold acknowledgements here (lock held)."""
        holders = sorted(self.ack_holders())
        if holders:
            named = ", ".join(str(t) for t in holders[:5])
            raise TransactionConflict(
                f"cannot seek {self.name!r} on {self.partition.topic}: open transactions "
                f"{named} hold acknowledgements on it; commit or abort them first"
            )

    def reset(self, mark_delete: int, partial: tuple[int, int, int] | None = None) -> None:
        """Seek (lock held, check_seek passed): the cursor is put at mark_delete (and
        `partial`, a cumulative ack inside the next entry); what was delivered and not
        acknowledged, or is to be redelivered, is forgotten, as Pulsar's cursor reset."""
        self.cursor.reset(mark_delete)
        if partial is not None:
            self.cursor.ack_cumulative(*partial)
        self._pending.clear()
        self._redeliver.clear()
        self._nacked.clear()
        self._redelivery_counts.clear()
        self.delayed.clear()  # read again from the new position: those still early held again
        self.read_ahead.rewind(self.cursor.mark_delete + 1)
        self.read_ahead.forget_reread()
        self._persist()

    # -- stats -----------------------------------------------------------------------------

    def backlog(self) -> int:
        with self.lock:
            p, c = self.partition, self.cursor
            total = p.messages_between(c.mark_delete + 1, p.next_entry_id)
            total -= sum(p.messages_between(a, b) for a, b in c.ranges())
            total -= sum(len(a) for a in c.batch_acks.values())
            return max(total, 0)

    def stats(self) -> dict:
        with self.lock:
            return {
                "type": TYPE_NAMES.get(self.type) if self.type is not None else None,
                "consumers": len(self.consumers),
                "waiting": sum(1 for c in self.consumers if c._parked),  # in a receive
                "backlog": self.backlog(),
                "unacked": len(self._pending),
                "mark_delete_position": self.cursor.mark_delete,
                "filtered_aborted": self.filtered,
                "delayed": len(self.delayed),  # held until their delivery time (msgDelayed)
                "msg_out": self.msg_out,
                "bytes_out": self.bytes_out,
            }
