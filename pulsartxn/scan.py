"""The embedded client's scan: entry bounds of a partition and its columnar read as Arrow."""

from __future__ import annotations

import numpy as np

from .errors import excerpt
from .messaging.message import MessageId

SCAN_ENTRIES = 1024


def _entry_bound(bound, part, default: int) -> int:
    if bound is None:
        return default
    if isinstance(bound, MessageId):
        if bound.partition() not in (part.index, -1):
            return default
        return bound.entry_id()
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
        raise ValueError(
            f"scan bound must be a non-negative entry id or MessageId, not {excerpt(bound)}"
        )
    return bound


def _scan(bounds):
    for part, lo, hi in bounds:
        pos = max(lo, part.first_entry_id)
        while pos < hi:
            decoded = part.read(pos, hi, SCAN_ENTRIES)
            if decoded.num_entries == 0:
                break
            pos = int(decoded.entry_id[-1]) + 1
            mask = None
            if decoded.marker_type.any() or decoded.txn_msb.any() or decoded.txn_lsb.any():
                # Markers never show; entries of aborted transactions are filtered in bulk.
                keep = decoded.marker_type == 0
                keep &= ~part.buffer.aborted_mask(decoded.txn_msb, decoded.txn_lsb)
                mask = np.repeat(keep, decoded.message_count.astype(np.int64))
            yield decoded.to_arrow(
                topic=part.topic, partition=part.index, ledger_id=part.ledger_id, mask=mask
            )
