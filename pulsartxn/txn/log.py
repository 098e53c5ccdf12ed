"""The transaction log: record formats and where they live in LMDB.

Each coordinator has its own database ``txnlog/<id>``. A transaction's operations are records
keyed by ``sequence (14 bytes, big-endian) + record index (u16, big-endian)``, so a
transaction's records are adjacent and replay in order; the coordinator keeps the number of
records of each live transaction in memory and deletes them all once the transaction is
COMMITTED or ABORTED, so the log holds only live transactions.

A decision that ends several transactions at once (``commit_all``, ``commit_group``,
``abort_group``) is one record in the shared database ``txndecisions`` naming every
transaction it commits or aborts; it is deleted once all of them are finished. Since every
coordinator's log lives in one LMDB environment, one write transaction makes a decision
atomic even across coordinators.

Every record starts with the CRC-32C of the rest, so a damaged log is reported, not replayed.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

from .._native import TxnID, crc32c
from ..errors import CorruptEntry

NEW, PARTITIONS, SUBSCRIPTIONS, END, DECISION = 1, 2, 3, 4, 5
SEQ_BYTES = 14
KEY = struct.Struct(">H")  # record index after the 14 sequence bytes
_NEW = struct.Struct("<QQ")  # timeout ms, open time (ms since the epoch)
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_END = struct.Struct("<BB")  # commit (1) or abort (0), EndReason
_DECISION = struct.Struct("<QIIB")  # decision id, commits, aborts, EndReason
MAX_NAME_BYTES = 0xFFFF

DECISIONS_DB = b"txndecisions"
GROUP_KEYS_DB = b"txngroupkeys"
# How each transaction that wrote anything ended, kept after its records go for the last
# OUTCOMES_KEPT sequences of its coordinator: an end re-sent after a restart (its answer lost
# with the connection) is answered by what happened, not TransactionNotFound.
OUTCOMES_DB = b"txnoutcomes"
OUTCOMES_KEPT = 1 << 16
_COORDINATOR = struct.Struct(">I")  # an outcome's key: this, then the sequence's 14 bytes
_OUTCOME = struct.Struct("<BBQ")  # committed (1) or aborted (0), EndReason, timeout ms


def log_db_name(coordinator_id: int) -> bytes:
    return b"txnlog/%d" % coordinator_id


def hwm_key(coordinator_id: int) -> bytes:
    """meta key of a coordinator's reserved sequence high-water mark."""
    return b"txn/hwm/%d" % coordinator_id


COORDINATORS_KEY = b"txn/coordinators"


def seq_prefix(sequence: int) -> bytes:
    return sequence.to_bytes(SEQ_BYTES, "big")


def record_key(sequence: int, index: int) -> bytes:
    return sequence.to_bytes(SEQ_BYTES, "big") + KEY.pack(index)


def split_key(key: bytes) -> tuple[int, int]:
    if len(key) != SEQ_BYTES + 2:
        raise CorruptEntry(f"transaction log key of {len(key)} bytes")
    return int.from_bytes(key[:SEQ_BYTES], "big"), KEY.unpack_from(key, SEQ_BYTES)[0]


def _seal(body: bytes) -> bytes:
    return _U32.pack(crc32c(body)) + body


def _open(record) -> memoryview:
    data = memoryview(bytes(record))
    if len(data) < 5:
        raise CorruptEntry(f"transaction log record of {len(data)} bytes")
    if _U32.unpack_from(data)[0] != crc32c(data[4:]):
        raise CorruptEntry("transaction log record fails its checksum")
    return data[4:]


def _pack_str(out: list, text: str) -> None:
    raw = text.encode()
    if len(raw) > MAX_NAME_BYTES:
        raise ValueError(f"name of {len(raw)} bytes (at most {MAX_NAME_BYTES})")
    out.append(_U16.pack(len(raw)))
    out.append(raw)


def _read_str(data: memoryview, pos: int) -> tuple[str, int]:
    if pos + 2 > len(data):
        raise CorruptEntry("transaction log record truncated")
    (n,) = _U16.unpack_from(data, pos)
    pos += 2
    if pos + n > len(data):
        raise CorruptEntry("transaction log record truncated")
    try:
        return bytes(data[pos : pos + n]).decode(), pos + n
    except UnicodeDecodeError:
        raise CorruptEntry("transaction log record holds a name that is not UTF-8") from None


# Who may end a transaction besides its decisions and its timeout (the NEW record's last
# field): its in-process client (IN_PROCESS), or a network session (its id). Records written
# before owners were kept have none (None): such a transaction is left to its timeout.
IN_PROCESS = ""
_IN_PROCESS, _SESSION = 2, 3


def encode_new(timeout_ms: int, open_ms: int, group: str | None, owner: str | None) -> bytes:
    parts = [bytes([NEW]), _NEW.pack(timeout_ms, open_ms)]
    if group is not None:
        parts.append(b"\x01")
        _pack_str(parts, group)
    else:
        parts.append(b"\x00")
    if owner == IN_PROCESS:
        parts.append(bytes([_IN_PROCESS]))
    elif owner is not None:
        parts.append(bytes([_SESSION]))
        _pack_str(parts, owner)
    return _seal(b"".join(parts))


class StagedNew:
    """A transaction's NEW record while it rides with the transaction's first write
    (Coordinator.new): keyed and encoded only when a write puts it, since most in-process
    transactions end in one write that needs none. Unpacks as ``(key, value)``."""

    __slots__ = ("_seq", "_fields", "_key", "_value")

    def __init__(self, seq: int, timeout_ms: int, open_ms: int, group, owner) -> None:
        self._seq = seq
        self._fields = (timeout_ms, open_ms, group, owner)
        self._key: bytes | None = None
        self._value: bytes | None = None

    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = record_key(self._seq, 0)
        return self._key

    @property
    def value(self) -> bytes:
        if self._value is None:
            self._value = encode_new(*self._fields)
        return self._value

    def __iter__(self):
        yield self.key
        yield self.value


def encode_names(kind: int, names) -> bytes:
    """PARTITIONS: partition names; SUBSCRIPTIONS: (partition, subscription) pairs."""
    return _encode_names(kind, tuple(names))


@functools.lru_cache(maxsize=4096)
def _encode_names(kind: int, names: tuple) -> bytes:
    # Cached: a pipeline registers the same few partitions and subscriptions in every
    # transaction.
    parts = [bytes([kind]), _U32.pack(len(names))]
    for name in names:
        if kind == SUBSCRIPTIONS:
            _pack_str(parts, name[0])
            _pack_str(parts, name[1])
        else:
            _pack_str(parts, name)
    return _seal(b"".join(parts))


@functools.lru_cache(maxsize=64)
def encode_end(commit: bool, reason: int) -> bytes:
    return _seal(bytes([END]) + _END.pack(1 if commit else 0, reason))


def outcome_key(coordinator_id: int, sequence: int) -> bytes:
    return _COORDINATOR.pack(coordinator_id) + seq_prefix(sequence)


def encode_outcome(commit: bool, reason: int, timeout_ms: int) -> bytes:
    return _seal(_OUTCOME.pack(1 if commit else 0, reason, timeout_ms))


def decode_outcome(record) -> tuple[bool, int, int]:
    """(committed, EndReason, timeout ms) of an outcome record."""
    data = _open(record)
    if len(data) != _OUTCOME.size:
        raise CorruptEntry(f"transaction outcome record of {len(data)} bytes")
    commit, reason, timeout_ms = _OUTCOME.unpack(data)
    return commit == 1, reason, timeout_ms


@dataclass
class Record:
    kind: int
    timeout_ms: int = 0
    open_ms: int = 0
    group: str | None = None
    owner: str | None = None
    names: list = field(default_factory=list)
    commit: bool = False
    reason: int = 0


def decode(record) -> Record:
    data = _open(record)
    kind = data[0]
    if kind == NEW:
        if len(data) < 1 + _NEW.size + 1:
            raise CorruptEntry("transaction log NEW record truncated")
        timeout_ms, open_ms = _NEW.unpack_from(data, 1)
        group = None
        pos = 1 + _NEW.size
        if data[pos] == 1:
            group, pos = _read_str(data, pos + 1)
        elif data[pos] != 0:
            raise CorruptEntry("transaction log NEW record has a bad group flag")
        else:
            pos += 1
        owner = None
        if pos < len(data) and data[pos] == _IN_PROCESS:
            owner, pos = IN_PROCESS, pos + 1
        elif pos < len(data) and data[pos] == _SESSION:
            owner, pos = _read_str(data, pos + 1)
        _expect_end(data, pos)
        return Record(NEW, timeout_ms=timeout_ms, open_ms=open_ms, group=group, owner=owner)
    if kind in (PARTITIONS, SUBSCRIPTIONS):
        if len(data) < 5:
            raise CorruptEntry("transaction log record truncated")
        (count,) = _U32.unpack_from(data, 1)
        pos = 5
        names = []
        for _ in range(count):
            a, pos = _read_str(data, pos)
            if kind == SUBSCRIPTIONS:
                b, pos = _read_str(data, pos)
                names.append((a, b))
            else:
                names.append(a)
        _expect_end(data, pos)
        return Record(kind, names=names)
    if kind == END:
        if len(data) != 1 + _END.size:
            raise CorruptEntry("transaction log END record has the wrong size")
        commit, reason = _END.unpack_from(data, 1)
        if commit not in (0, 1):
            raise CorruptEntry("transaction log END record has a bad outcome")
        return Record(END, commit=bool(commit), reason=reason)
    raise CorruptEntry(f"transaction log record of unknown kind {kind}")


def _expect_end(data: memoryview, pos: int) -> None:
    if pos != len(data):
        raise CorruptEntry("transaction log record has trailing bytes")


@dataclass
class Decision:
    decision_id: int
    commits: list  # TxnIDs
    aborts: list
    reason: int
    group: str | None = None


def encode_decision(d: Decision) -> bytes:
    parts = [
        bytes([DECISION]),
        _DECISION.pack(d.decision_id, len(d.commits), len(d.aborts), d.reason),
    ]
    parts.extend(t.pack() for t in d.commits)
    parts.extend(t.pack() for t in d.aborts)
    if d.group is not None:
        parts.append(b"\x01")
        _pack_str(parts, d.group)
    else:
        parts.append(b"\x00")
    return _seal(b"".join(parts))


def decode_decision(record) -> Decision:
    data = _open(record)
    if data[0] != DECISION or len(data) < 1 + _DECISION.size:
        raise CorruptEntry("transaction decision record malformed")
    decision_id, nc, na, reason = _DECISION.unpack_from(data, 1)
    pos = 1 + _DECISION.size
    if pos + 16 * (nc + na) + 1 > len(data):
        raise CorruptEntry("transaction decision record truncated")
    ids = [TxnID.unpack(bytes(data[pos + 16 * i : pos + 16 * (i + 1)])) for i in range(nc + na)]
    pos += 16 * (nc + na)
    group = None
    if data[pos] == 1:
        group, pos = _read_str(data, pos + 1)
    else:
        pos += 1
    _expect_end(data, pos)
    return Decision(decision_id, ids[:nc], ids[nc:], reason, group)


DECISION_KEY = struct.Struct(">Q")
