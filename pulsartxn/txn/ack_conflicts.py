"""Which transactional acks conflict with the acks other transactions hold on a subscription
(seeds: "transactional acknowledgement"): each check raises TransactionConflict and changes
nothing. `index` is the subscription's PendingAckIndex, `cumulative` its TxnID -> (entry,
batch index, batch size) of cumulative holds."""

from __future__ import annotations

from .._native import TxnID
from ..errors import TransactionConflict


def check_cumulative(index, cumulative: dict, txn_id: TxnID, entry_id: int, name: str) -> None:
    """A cumulative ack by txn_id up to entry_id: no other transaction may hold a cumulative
    ack, nor any entry at or below entry_id."""
    for other, (e, _, _) in cumulative.items():
        if other != txn_id:
            raise TransactionConflict(
                f"transaction {other} holds a cumulative acknowledgement up to entry {e} on {name}"
            )
    for other in index.transactions():
        if other == txn_id:
            continue
        for _, e, _ in index.entries_of(other):
            if e <= entry_id:
                raise TransactionConflict(
                    f"transaction {other} holds entry {e}, at or below the cumulative "
                    f"acknowledgement of entry {entry_id}"
                )


def check_individual(cumulative: dict, txn_id: TxnID, entry_id: int, batch_index: int) -> None:
    """An individual ack by txn_id: no other transaction's cumulative ack may cover it (the
    index itself refuses an entry another transaction holds)."""
    for other, (e, bi, _size) in cumulative.items():
        if other != txn_id and (entry_id < e or (entry_id == e and (bi < 0 or batch_index <= bi))):
            raise TransactionConflict(
                f"entry {entry_id} is held by transaction {other}'s cumulative acknowledgement"
            )


def check_plain_cumulative(index, cumulative: dict, entry_id: int) -> None:
    """A plain cumulative ack up to entry_id may not cover an entry a transaction holds."""
    entries = [e for t in index.transactions() for _, e, _ in index.entries_of(t)]
    entries += [e for e, _, _ in cumulative.values()]
    lowest = min(entries) if entries else None
    if lowest is not None and lowest <= entry_id:
        raise TransactionConflict(
            f"cumulative acknowledgement up to entry {entry_id} covers entry {lowest}, held by "
            "a transaction"
        )
