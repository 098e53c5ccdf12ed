"""Crash torture: SIGKILL a broker in the middle of transactional work, reopen, check invariants.

Each iteration starts a child process that runs a transactional consume-process-produce
workload with ``sync=True``, kills it with SIGKILL at a random moment (start-up and recovery
included), reopens the data directory and checks it against the child's fsynced journal
(docs/reliability.md lists the invariants). Run it long (the data directory is kept on
failure, the seed reproduces a run)::

    python -m pulsartxn.torture --iterations 200 --seed 1

``tests/reliability/test_torture.py`` runs a short version.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import pulsartxn
from pulsartxn import TxnID

IN, OUT, OUT2 = "in", "out", "out2"
PARTITIONS = {IN: 2, OUT: 3, OUT2: 2}
SUB = "proc"
COORDINATORS = 2
WORKERS = 2
INPUTS_PER_ROUND = 80


class TortureFailure(AssertionError):
    """An invariant does not hold after a crash."""


# -- the child: the workload ---------------------------------------------------------------


class Journal:
    """Append-only lines, each fsynced before the call returns (what the child knows): ``B``
    after a transaction began, ``K`` before commit() is called (with what it produced and
    acknowledged), ``C`` after commit() returned, ``X`` after abort() returned, ``P`` after a
    plain send returned."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.lock = threading.Lock()

    def write(self, line: str) -> None:
        with self.lock:
            os.write(self.fd, (line + "\n").encode())
            os.fsync(self.fd)


def _worker(broker, journal: Journal, w: int, seed: int) -> None:
    rng = random.Random(seed * 1000 + w)
    client = broker.client()
    consumer = client.subscribe(
        IN,
        SUB,
        subscription_type=pulsartxn.ConsumerType.Shared,
        consumer_name=f"w{w}",
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    producers = {t: client.create_producer(t) for t in (OUT, OUT2)}
    n = 0
    while True:
        n += 1
        key = f"k{rng.randrange(1000)}"
        if rng.random() < 0.1:
            payload = f"P|{seed}|{w}|{n}"
            producers[rng.choice((OUT, OUT2))].send(payload.encode(), partition_key=key)
            journal.write(f"P {payload}")
            continue
        abandon = rng.random() < 0.05
        # Some transactions end by a group decision, with a loser that must never show.
        group = f"g{seed}-{w}-{n}" if not abandon and rng.random() < 0.15 else None
        # Abandoned: to a short timeout, or orphaned (a timeout far beyond the run).
        timeout_ms = (200 if rng.random() < 0.5 else 600_000) if abandon else 60_000
        txn = client.new_transaction(timeout_ms=timeout_ms, group=group)
        journal.write(f"B {txn.id}")
        loser = None
        if group is not None:
            loser = client.new_transaction(group=group)
            journal.write(f"B {loser.id}")
            producers[OUT].send(f"T|{loser.id}|0|1".encode(), partition_key=key, txn=loser)
        if rng.random() < 0.3:
            msgs = []  # produce only: its end is one write with its partitions' markers
        else:
            msgs = consumer.batch_receive(max_num_messages=rng.randint(1, 4), timeout_millis=20)
        k = rng.randint(1, 4)
        for i in range(k):
            producer = producers[rng.choice((OUT, OUT2))]
            payload = f"T|{txn.id}|{i}|{k}".encode()
            if rng.random() < 0.5 and group is None:
                producer.send_async(payload, partition_key=f"k{rng.randrange(1000)}", txn=txn)
            else:
                producer.send(payload, partition_key=f"k{rng.randrange(1000)}", txn=txn)
        for m in msgs:
            consumer.acknowledge(m, txn=txn)
        acked = ",".join(m.data().decode() for m in msgs) or "-"
        if abandon:
            continue  # left to its timeout (or orphaned), never committed
        if group is not None:
            if rng.random() < 0.7:
                journal.write(f"K {txn.id} {k} {acked}")
                client.commit_group(group, [txn])
                journal.write(f"C {txn.id}")
            else:
                client.abort_group(group)
                journal.write(f"X {txn.id}")
            journal.write(f"X {loser.id}")
        elif rng.random() < 0.7:
            journal.write(f"K {txn.id} {k} {acked}")
            txn.commit()
            journal.write(f"C {txn.id}")
        else:
            txn.abort()
            journal.write(f"X {txn.id}")


def child(data: str, journal_path: str, seed: int) -> None:
    """The workload: runs until it is killed; any unexpected error exits with status 3."""
    journal = Journal(journal_path)
    broker = pulsartxn.Broker(
        data,
        num_coordinators=COORDINATORS,
        sync=True,
        txn_timeout_tick_ms=20,
        txn_snapshot_every_txns=3,
        txn_snapshot_every_ms=50.0,
    )

    def run(w: int) -> None:
        try:
            _worker(broker, journal, w, seed)
        except BaseException:  # noqa: BLE001 - any error is a finding; report and stop
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(3)

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- the parent: kill, reopen, check -------------------------------------------------------


@dataclass
class History:
    began: list = field(default_factory=list)  # TxnID strings, in journal order
    intents: dict = field(default_factory=dict)  # txn -> (messages, acked inputs)
    committed: set = field(default_factory=set)
    aborted: set = field(default_factory=set)
    plain: list = field(default_factory=list)
    inputs: set = field(default_factory=set)
    outcomes: Counter = field(default_factory=Counter)


def read_journal(path: str, history: History) -> None:
    """Add the child's journal to the history (a torn last line is ignored) and empty it."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    lines = text.split("\n")
    for line in lines[:-1]:  # the part after the last newline, if any, is torn
        kind, _, rest = line.partition(" ")
        if kind == "B":
            history.began.append(rest)
        elif kind == "K":
            tid, k, acked = rest.split(" ")
            history.intents[tid] = (int(k), [] if acked == "-" else acked.split(","))
        elif kind == "C":
            history.committed.add(rest)
        elif kind == "X":
            history.aborted.add(rest)
        elif kind == "P":
            history.plain.append(rest)
        else:
            raise TortureFailure(f"unexpected journal line {line!r}")


def _wait_finalized(broker, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = [broker.admin.coordinator_stats(c) for c in range(COORDINATORS)]
        if all(s["committing"] == 0 and s["aborting"] == 0 for s in stats):
            return
        if time.monotonic() > deadline:
            raise TortureFailure(f"transactions still finalizing after {timeout_s} s: {stats}")
        time.sleep(0.01)


def _open(data: str):
    return pulsartxn.Broker(data, num_coordinators=COORDINATORS, sync=True)


def setup(data: str) -> None:
    with _open(data) as broker:
        for topic, n in PARTITIONS.items():
            broker.create_topic(topic, partitions=n)


def add_inputs(broker, history: History, round_: int) -> None:
    producer = broker.client().create_producer(IN)
    for j in range(INPUTS_PER_ROUND):
        payload = f"I|{round_}|{j}"
        producer.send_async(payload.encode(), partition_key=f"i{j}")
        history.inputs.add(payload)
    producer.flush()
    producer.close()


def _drain(consumer) -> list[str]:
    out: list[str] = []
    while True:
        msgs = consumer.batch_receive(max_num_messages=1000, timeout_millis=100)
        if not msgs:
            try:
                msgs = [consumer.receive(timeout_millis=300)]
            except pulsartxn.Timeout:
                return out
        out.extend(m.data().decode() for m in msgs)


def check(data: str, history: History, round_: int) -> dict:
    """Reopen the data directory and check every invariant (raises TortureFailure)."""

    def fail(msg: str):
        raise TortureFailure(f"round {round_}: {msg}")

    with _open(data) as broker:
        client = broker.client()
        _wait_finalized(broker)
        # The child is gone: recovery aborted what it left open (nobody else could end it),
        # so nothing holds a partition's readers back past what was committed.
        left = broker.admin.slow_transactions(0)
        if left:
            fail(f"transactions of the dead child still live after recovery: {left[:3]}")

        # TxnIDs: never handed out twice, new ones above all earlier ones.
        seen = Counter(history.began)
        dup = [t for t, n in seen.items() if n > 1]
        if dup:
            fail(f"TxnIDs handed out twice: {dup[:5]}")
        highest: dict[int, int] = {}
        for t in history.began:
            tid = TxnID.parse(t)
            highest[tid.coordinator_id] = max(highest.get(tid.coordinator_id, 0), tid.sequence)
        for c in range(COORDINATORS):
            fresh = client.new_transaction(coordinator_id=c)
            if fresh.id.sequence <= highest.get(c, 0):
                fail(f"new TxnID {fresh.id} not above {c}:{highest.get(c)} handed out before")
            fresh.abort()

        # What is visible, read committed: a scan, and a fresh subscription must agree.
        visible: list[str] = []
        for topic in (OUT, OUT2):
            scanned = [
                v.decode() if isinstance(v, bytes) else v
                for batch in client.scan(topic)
                for v in batch.column("value").to_pylist()
            ]
            consumer = client.subscribe(
                topic, f"verify-{round_}", initial_position=pulsartxn.InitialPosition.Earliest
            )
            dispatched = _drain(consumer)
            consumer.unsubscribe()
            if sorted(scanned) != sorted(dispatched):
                fail(
                    f"{topic}: scan and dispatch differ: "
                    f"{sorted(set(scanned) ^ set(dispatched))[:10]}"
                )
            visible.extend(scanned)
        twice = [p for p, n in Counter(visible).items() if n > 1]
        if twice:
            fail(f"visible more than once: {twice[:10]}")
        visible_set = set(visible)
        missing_plain = [p for p in history.plain if p not in visible_set]
        if missing_plain:
            fail(f"plain sends that returned are lost: {missing_plain[:10]}")

        # Transactions: all or nothing, committed ones all there, never-committed ones absent.
        parts: dict[str, set] = {}
        for p in visible:
            if p.startswith("T|"):
                _, tid, i, k = p.split("|")
                parts.setdefault(tid, set()).add((int(i), int(k)))
        for tid, got in parts.items():
            k = next(iter(got))[1]
            if got != {(i, k) for i in range(k)}:
                fail(f"transaction {tid} is partly visible: {sorted(got)} of {k}")
            if tid not in history.intents:
                fail(f"transaction {tid} is visible but its commit was never attempted")
            if tid in history.aborted:
                fail(f"transaction {tid} is visible but was aborted")
        for tid in history.committed:
            if tid not in parts:
                fail(f"committed transaction {tid} is lost ({history.intents.get(tid)})")
            if len(parts[tid]) != history.intents[tid][0]:
                fail(f"committed transaction {tid} has {len(parts[tid])} messages")

        # Acknowledgements: applied iff the transaction is visible, once per message.
        acks = Counter(m for tid in parts for m in history.intents[tid][1])
        twice = [m for m, n in acks.items() if n > 1]
        if twice:
            fail(f"inputs acknowledged by two committed transactions: {twice[:10]}")
        consumer = client.subscribe(
            IN,
            SUB,
            subscription_type=pulsartxn.ConsumerType.Shared,
            initial_position=pulsartxn.InitialPosition.Earliest,
        )
        redelivered = _drain(consumer)
        consumer.close()
        again = Counter(redelivered)
        if any(n > 1 for n in again.values()):
            fail(f"inputs delivered twice in one drain: {[m for m, n in again.items() if n > 1]}")
        for m in history.inputs:
            if (m in again) == (m in acks):
                state = "acknowledged by a committed transaction" if m in acks else "not acked"
                seen_ = "delivered again" if m in again else "not delivered"
                fail(f"input {m} is {state} but {seen_}")
        unknown = set(history.intents) - history.committed
        history.outcomes = Counter(
            committed=len(history.committed),
            aborted=len(history.aborted),
            abandoned_or_killed=len(set(history.began) - history.committed - history.aborted),
            unknown_then_visible=len(unknown & set(parts)),
            unknown_then_invisible=len(unknown - set(parts)),
        )
        add_inputs(broker, history, round_ + 1)
    return {
        "round": round_,
        "began": len(history.began),
        "committed": len(history.committed),
        "aborted": len(history.aborted),
        "unknown": len(unknown),
        "visible_txns": len(parts),
        "redelivered": len(again),
    }


def run(
    iterations: int,
    seed: int,
    data: str | None = None,
    max_kill_s: float = 2.0,
    log=None,
) -> dict:
    """Run the torture; returns a summary. Raises TortureFailure with the data directory."""
    rng = random.Random(seed)
    own = data is None
    root = tempfile.mkdtemp(prefix="pulsartxn-torture-") if own else data
    os.makedirs(root, exist_ok=True)
    data_dir = os.path.join(root, "data")
    journal = os.path.join(root, "journal")
    history = History()
    setup(data_dir)
    with _open(data_dir) as broker:
        add_inputs(broker, history, 0)
    summary: dict = {}
    try:
        for round_ in range(iterations):
            cmd = [sys.executable, "-m", "pulsartxn.torture", "--child", data_dir, journal]
            cmd.append(str(seed * 100_000 + round_))
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # A random moment: start-up and recovery included.
            deadline = time.monotonic() + rng.uniform(0.1, max_kill_s)
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            _, stderr = proc.communicate()
            if proc.returncode != -signal.SIGKILL:
                raise TortureFailure(
                    f"round {round_}: child exited with {proc.returncode}:\n{stderr.decode()}"
                )
            read_journal(journal, history)
            summary = check(data_dir, history, round_)
            if log is not None:
                log(summary)
    except TortureFailure as exc:
        raise TortureFailure(f"{exc} (seed {seed}, data kept in {root})") from None
    summary["outcomes"] = dict(history.outcomes)
    if own:
        shutil.rmtree(root, ignore_errors=True)
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pulsartxn.torture", description=__doc__)
    parser.add_argument("--iterations", type=int, default=20, help="kill/reopen rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="directory to keep (default: temporary)")
    parser.add_argument("--max-kill-s", type=float, default=2.0, help="latest kill moment")
    parser.add_argument(
        "--child", nargs=3, metavar=("DATA", "JOURNAL", "SEED"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    start = time.monotonic()
    try:
        summary = run(
            args.iterations,
            args.seed,
            args.data,
            args.max_kill_s,
            log=lambda s: print(s, flush=True),
        )
    except TortureFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {args.iterations} iterations in {time.monotonic() - start:.1f} s: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
