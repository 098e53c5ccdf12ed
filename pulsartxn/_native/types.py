"""Plain Python types shared by the native modules and their twins."""

from __future__ import annotations

import enum


class MarkerType(enum.IntEnum):
    """What an entry is: data, or a transaction marker (numbers as Pulsar's MarkerType)."""

    NONE = 0
    TXN_COMMIT = 21
    TXN_ABORT = 22


# Producers' sequence ids: signed 64-bit, as de-duplication stores them.
MAX_SEQUENCE_ID = (1 << 63) - 1


def sequences_used_up(producer_name: str, topic: str) -> ValueError:
    """The error of a send whose assigned sequence id would pass MAX_SEQUENCE_ID."""
    return ValueError(
        f"producer {producer_name} has used every sequence id on {topic} (up to 2^63-1): "
        "send under another producer name"
    )
