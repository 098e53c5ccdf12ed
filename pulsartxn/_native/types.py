"""Plain Python types shared by the native modules and their twins."""

from __future__ import annotations

import enum


class MarkerType(enum.IntEnum):
    """What an entry is: data, or a transaction marker (numbers as Pulsar's MarkerType)."""

    NONE = 0
    TXN_COMMIT = 21
    TXN_ABORT = 22
