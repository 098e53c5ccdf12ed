"""Spare transactions: a remote client running transactions in a loop (each begun soon after
the last one ended) has the broker begin the next one in the same call as the last one's end,
so that its new_transaction() makes no call of its own, as Kafka's beginTransaction makes none.

A spare is handed out only within SPARE_WITHIN_S of the end that began it (its timeout runs
from that begin, so it starts at most that much early) and only for a new_transaction of the
same kind (timeout and coordinator asked for). One gone stale is aborted by the next begin
(named in that call; a cluster client aborts it at its coordinator); one never handed out is
aborted with its session, when the client closes or its session expires; one of a session
opened again (a restarted broker) is forgotten, as that broker forgot it. One begun with an
end whose answer never came (the end timed out) is aborted by the next begin, which names
that end (the broker remembers the spare of each end)."""

from __future__ import annotations

import threading
import time

from ..server.protocol import MAX_CANCELS

# How soon after an end a new_transaction takes its spare; also how soon after an end a
# new_transaction has to come for the next end to ask for one.
SPARE_WITHIN_S = 0.05


class Spares:
    """The spare transactions of one remote client (thread-safe). A kind is what a
    new_transaction asked for: (timeout_ms, coordinator_id); group transactions have none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[tuple] = []  # (kind, txn, capability, generation, begun at)
        self._loop: tuple | None = None  # the kind of a new_transaction made soon after an end
        self._ended_at = float("-inf")
        self._lost: list[str] = []  # ends that asked for a spare and got no answer
        self._drop: list[str] = []  # stale spares a begin took out and did not name

    def take(self, kind: tuple, generation: int) -> tuple[tuple[str, str] | None, list[str]]:
        """A fresh spare of `kind` as (txn, capability), or None; and the stale spares for the
        begin to abort (their TxnID strings; a begin that makes no call, or whose call fails,
        hands them back with ``unsent``)."""
        now = time.monotonic()
        found = None
        with self._lock:
            stale, self._drop = self._drop, []
            self._loop = kind if now - self._ended_at < SPARE_WITHIN_S else None
            keep = []
            for held in self._held:
                held_kind, txn, capability, held_generation, at = held
                if held_generation != generation:
                    continue  # the broker that began it restarted and forgot it
                if now - at >= SPARE_WITHIN_S:
                    stale.append(txn)
                elif found is None and held_kind == kind:
                    found = (txn, capability)
                else:
                    keep.append(held)
            self._held = keep
        return found, stale[-MAX_CANCELS:]  # more (never seen) end with the session

    def dropped(self) -> list[str]:
        """The stale spares earlier begins left to name (for a begin that takes no spare: a
        group's), taken out here."""
        with self._lock:
            out, self._drop = self._drop, []
        return out

    def wanted(self) -> tuple | None:
        """The kind of spare an end is to ask for: that of the loop this client runs, while it
        holds no spare of it."""
        with self._lock:
            if self._loop is None or any(h[0] == self._loop for h in self._held):
                return None
            return self._loop

    def ended(
        self, kind: tuple | None, answer: dict | None, generation: int, txn: str, answered: bool
    ) -> None:
        """The end of `txn` returned (`answered`) or failed, with the spare the broker began
        for it (`answer`), if any; `kind`: the spare it asked for."""
        now = time.monotonic()
        with self._lock:
            self._ended_at = now
            if kind is not None and answer is not None:
                self._held.append((kind, answer["txn"], answer["capability"], generation, now))
            if answered:
                if txn in self._lost:
                    self._lost.remove(txn)  # sent again and answered: the spare is in it
            elif kind is not None and txn not in self._lost:
                self._lost.append(txn)  # the broker may have begun one: the next begin says
                del self._lost[:-MAX_CANCELS]

    def lost(self) -> list[str]:
        """The ends whose spare the client never had, for a begin to name (taken out here)."""
        with self._lock:
            out, self._lost = self._lost, []
        return out

    def unsent(self, drop: list[str], lost: list[str]) -> None:
        """What a begin took to name and did not send (it took a fresh spare, or its call
        failed): the next begin names it. At most MAX_CANCELS of each, the newest (those left
        out end with their timeout or the session)."""
        if not drop and not lost:
            return
        with self._lock:
            self._drop = (drop + self._drop)[-MAX_CANCELS:]
            self._lost = [e for e in lost if e not in self._lost] + self._lost
            del self._lost[:-MAX_CANCELS]
