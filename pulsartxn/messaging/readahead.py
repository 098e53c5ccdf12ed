"""The read-ahead: entries decoded from a partition's ledger into the messages a subscription
may deliver. Bounded, so that a ledger of large entries is not decoded all at once."""

from __future__ import annotations

import numpy as np

from .._native import TxnID, buffer_messages

# Up to 64 entries, fewer when they hold more than 1000 messages (Pulsar's receiverQueueSize)
# or 8 MiB (one entry at least).
READ_AHEAD_ENTRIES = 64
READ_AHEAD_MESSAGES = 1000
READ_AHEAD_BYTES = 8 << 20


def buffer_entries(decoded, cursor, aborted_mask, buffer_append, filter_out) -> int:
    """The deliverable messages of decoded entries, as read-ahead items, to buffer_append;
    markers and aborted entries go to filter_out(entry_id, count) instead (the subscription
    acknowledges them internally). How many were added."""
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
        added += buffer_messages(
            buffer_append,
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
    return added


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
