"""Transaction states and why a transaction ended."""

from __future__ import annotations

import enum


class TxnState(enum.Enum):
    """A transaction's state as a client sees it (Pulsar's TxnStatus plus the client's TIMEOUT)."""

    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    TIMEOUT = "TIMEOUT"  # aborted by its coordinator at its deadline
    ERROR = "ERROR"  # its coordinator could not recover it


class CoordinatorStatus(enum.Enum):
    """A transaction coordinator's state (Pulsar's TransactionMetadataStoreState)."""

    RECOVERING = "RECOVERING"  # replaying its log
    READY = "READY"
    ERROR = "ERROR"  # its log cannot be read: it serves nothing
    ELSEWHERE = "ELSEWHERE"  # another broker of the cluster owns it (its log is empty here)


class EndReason(enum.IntEnum):
    """Why a transaction ends (stored with the COMMITTING/ABORTING record)."""

    CLIENT = 1  # commit() or abort()
    TIMEOUT = 2  # its deadline passed while OPEN
    GROUP = 3  # a commit_all / commit_group / abort_group decision
    ORPHANED = 4  # its client is gone: its process ended, or its network session expired


FINAL = (TxnState.COMMITTED, TxnState.ABORTED, TxnState.TIMEOUT)
