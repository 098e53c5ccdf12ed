"""The read-ahead: entries decoded from a partition's ledger into the messages a subscription
may deliver. Bounded, so that a ledger of large entries is not decoded all at once."""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from .._native import TxnID, buffer_messages

# Up to 64 entries, fewer when they hold more than 1000 messages (Pulsar's receiverQueueSize)
# or 8 MiB (one entry at least).
READ_AHEAD_ENTRIES = 64
READ_AHEAD_MESSAGES = 1000
READ_AHEAD_BYTES = 8 << 20


class ReadAhead:
    """What a subscription has read from its partition's ledger and not yet delivered, and the
    entry a redelivery read last. Used under the subscription's lock."""

    def __init__(self, partition, cursor, filter_out) -> None:
        """`filter_out(entry_id, count)`: a marker or an aborted transaction's entry, never
        delivered (the subscription acknowledges it internally)."""
        self.partition = partition
        self.cursor = cursor
        self._filter_out = filter_out
        self.position = cursor.mark_delete + 1  # the next entry to read
        self.rewinds = 0  # times it dropped what it read (what others took from it is stale)
        # ((entry, batch_index), payload), payload as buffer_messages makes it:
        # (data, properties or None, key, publish_time, batch_size, txn_id).
        self.buffer: deque = deque()
        # The entry a redelivery read last: (entry id, batch_index -> payload not yet taken).
        self._reread: tuple[int, dict] | None = None
        # delay(key, deliver_at): where a message read before its delivery time goes
        # (a Shared subscription's DelayedDelivery); None delivers every message at once.
        self.delay = None

    def fill(self, read_committed: bool) -> bool:
        """Read the next entries after `position` into the buffer; False when none."""
        partition = self.partition
        end = partition.dispatch_end(read_committed)
        while self.position < end:
            start = max(self.position, partition.first_entry_id)
            n = partition.entries_holding(start, end, READ_AHEAD_MESSAGES)
            limit = max(1, min(n, READ_AHEAD_ENTRIES))
            decoded = partition.read(start, end, limit, READ_AHEAD_BYTES)
            if decoded.num_entries == 0:
                self.position = end
                return False
            self.position = int(decoded.entry_id[-1]) + 1
            if self._decode(decoded, self.buffer.append, self.delay):
                return True
        return bool(self.buffer)

    def rewind(self, position: int) -> None:
        """Read again from `position`: what was read ahead is dropped."""
        self.position = position
        self.buffer.clear()
        self.rewinds += 1

    def rewind_to(self, entry_id: int) -> None:
        """Read again from `entry_id` if that is behind what was read (and not delivered)."""
        if self.buffer:
            entry_id = min(entry_id, self.buffer[0][0][0])
        if entry_id < self.position:
            self.rewind(entry_id)

    def reread(self, key: tuple[int, int]):
        """The payload of the message at `key`, from its entry in the ledger (kept for the
        next redelivery of the same entry); None if the entry no longer delivers it."""
        entry_id, batch_index = key
        cached = self._reread
        # Not in the entry read last: taken from it since (and given back), or another entry.
        if cached is None or cached[0] != entry_id or batch_index not in cached[1]:
            items: list = []
            decoded = self.partition.read(entry_id, entry_id + 1, 1)
            if decoded.num_entries and int(decoded.entry_id[0]) == entry_id:
                self._decode(decoded, items.append)
            cached = self._reread = (entry_id, {k[1]: payload for k, payload in items})
        return cached[1].get(batch_index)

    def delivered(self, key: tuple[int, int]) -> None:
        """The reread payload of `key` went out: a later redelivery reads its entry again."""
        del self._reread[1][key[1]]

    def forget_reread(self) -> None:
        self._reread = None

    def _decode(self, decoded, append, delay=None) -> int:
        aborted_mask = self.partition.buffer.aborted_mask
        return buffer_entries(decoded, self.cursor, aborted_mask, append, self._filter_out, delay)


def buffer_entries(decoded, cursor, aborted_mask, buffer_append, filter_out, delay=None) -> int:
    """The deliverable messages of decoded entries, as read-ahead items, to buffer_append;
    markers and aborted entries go to filter_out(entry_id, count) instead (the subscription
    acknowledges them internally), and with `delay`, messages before their delivery time to
    delay(key, deliver_at). How many were added."""
    added = 0
    entry_ids = decoded.entry_id.tolist()
    counts = decoded.message_count.tolist()
    firsts = decoded.first_message.tolist()
    publish = decoded.publish_time.tolist()
    markers = decoded.marker_type.tolist()
    value_off = decoded.value_offsets
    value_data = decoded.value_data
    key_off = decoded.key_offsets
    key_data = decoded.key_data
    key_valid = decoded.key_valid.view(np.uint8)  # bool as bytes, for the native loop
    txn_msb = decoded.txn_msb
    txn_lsb = decoded.txn_lsb
    po = decoded.prop_offsets
    any_props = len(po) > 1 and int(po[-1]) != int(po[0])
    in_txn = (txn_msb != 0) | (txn_lsb != 0)
    aborted = None
    if in_txn.any():
        aborted = aborted_mask(txn_msb, txn_lsb).tolist()
        txn_of = in_txn.tolist()
    props_of = (lambda m: _properties(decoded, m)) if any_props else None
    mark, acked, partly = cursor.mark_delete, cursor.acked, cursor.batch_acks
    with_meta = decoded.event_time is not None
    for e, entry_id in enumerate(entry_ids):
        txn_id = None
        if markers[e] or (aborted is not None and aborted[e]):
            # Markers and aborted entries are never delivered: acknowledged internally, so
            # they do not hold back the cursor.
            if not cursor.is_acked(entry_id):
                filter_out(entry_id, counts[e])
                mark, acked, partly = cursor.mark_delete, cursor.acked, cursor.batch_acks
            continue
        if entry_id <= mark or entry_id in acked:
            continue
        if aborted is not None and txn_of[e]:
            txn_id = TxnID.from_halves(int(txn_msb[e]), int(txn_lsb[e]))
        n = counts[e]
        append = buffer_append
        if with_meta:
            items: list = []
            append = items.append
        added += buffer_messages(
            append,
            entry_id,
            n,
            firsts[e],
            publish[e],
            txn_id,
            partly.get(entry_id) if n > 1 else None,
            value_data,
            value_off,
            key_valid,
            key_off,
            key_data,
            props_of,
        )
        if with_meta:
            added -= _with_metadata(decoded, firsts[e], items, buffer_append, delay)
    return added


def _with_metadata(decoded, first: int, items: list, append, delay) -> int:
    """Items of one entry of a decode with metadata to `append`, each with its message's
    (event_timestamp, ordering_key); those before their time to delay(). How many were."""
    held = 0
    now = int(time.time() * 1000)
    for item in items:
        key, payload = item
        meta = decoded.metadata(first + max(key[1], 0))
        if meta is None:
            append(item)
            continue
        event_time, deliver_at, okey = meta
        if delay is not None and deliver_at > now:
            delay(key, deliver_at)
            held += 1
            continue
        okey = None if okey is None else okey.decode("utf-8", "surrogateescape")
        append((key, payload + ((event_time, okey),)))
    return held


def _properties(decoded, m: int) -> dict[str, str] | None:
    lo, hi = int(decoded.prop_offsets[m]), int(decoded.prop_offsets[m + 1])
    if lo == hi:
        return None
    ko, kd = decoded.prop_key_offsets, decoded.prop_key_data
    vo, vd = decoded.prop_value_offsets, decoded.prop_value_data
    return {
        kd[ko[j] : ko[j + 1]].tobytes().decode(): vd[vo[j] : vo[j + 1]].tobytes().decode()
        for j in range(lo, hi)
    }
