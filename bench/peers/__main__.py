"""The same exactly-once consume-process-produce workload on pulsartxn and on its peers.

    python -m bench.peers [--messages 20000] [--size 100] [--batch 100]

Each system reads a batch of B input messages, writes one result per input and acknowledges
(removes) the inputs, atomically, N messages of S bytes in all, every commit durable:
- pulsartxn: embedded broker, sync=True, an Exclusive subscription: batch_receive, then either
  the results with send_async(txn=) (they ride in the commit: one fsync per transaction) and
  one acknowledge_cumulative(last, txn=) (the inputs are taken in order, as Pulsar's
  exactly-once examples do), or send_batch(txn=) (it rides in the commit too) and an
  acknowledge(txn=) per input; then commit. The better of the two is compared. A third row
  logs each begin before new_transaction() returns (durable_begin=True: one more fsync per
  transaction), for scale: the peers' BEGIN and MULTI write nothing either;
- Redis Streams: XREADGROUP, then XADD of the results and XACK of the inputs in MULTI/EXEC,
  `appendonly yes` with `appendfsync always`;
- PostgreSQL: SELECT ... FOR UPDATE SKIP LOCKED, INSERT of the results and DELETE of the
  inputs in one transaction, synchronous_commit=on.
Servers are started on 127.0.0.1 by this script (redis-server and postgresql installed with
apt-get when missing) and stopped afterwards. One table: msgs/s, commit latency p50/p99, and
the pulsartxn/peer ratios, all from the same run. Not part of the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure(binary: str, package: str) -> str:
    found = shutil.which(binary) or (
        f"/usr/lib/postgresql/15/bin/{binary}"
        if os.path.exists(f"/usr/lib/postgresql/15/bin/{binary}")
        else None
    )
    if found:
        return found
    subprocess.run(
        ["apt-get", "install", "-y", "-q", package], check=True, stdout=subprocess.DEVNULL
    )
    found = shutil.which(binary) or f"/usr/lib/postgresql/15/bin/{binary}"
    return found


def _pip(module: str, requirement: str) -> None:
    try:
        __import__(module)
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement], check=True)


def _pct(values, q):
    s = sorted(values)
    return s[min(int(len(s) * q), len(s) - 1)] * 1000.0 if s else float("nan")


# -- pulsartxn ---------------------------------------------------------------------------


def run_pulsartxn(
    tmp: str, n: int, size: int, batch: int, style: str, durable_begin: bool = False
) -> tuple[float, list]:
    import pulsartxn

    payloads = [os.urandom(size) for _ in range(n)]
    path = os.path.join(tmp, f"pulsartxn-{style}-{durable_begin}")
    with pulsartxn.Broker(path, sync=True, durable_begin=durable_begin) as broker:
        client = broker.client()
        client.create_producer("in").send_batch(payloads)
        consumer = client.subscribe("in", "fn", initial_position=pulsartxn.InitialPosition.Earliest)
        out = client.create_producer("out")
        lat, done = [], 0
        start = time.perf_counter()
        while done < n:
            msgs = consumer.batch_receive(batch, 1000)
            t = time.perf_counter()
            txn = client.new_transaction()
            if style == "send_batch":
                out.send_batch([m.data()[::-1] for m in msgs], txn=txn)
                for m in msgs:
                    consumer.acknowledge(m, txn=txn)
            else:
                for m in msgs:
                    out.send_async(m.data()[::-1], txn=txn)
                consumer.acknowledge_cumulative(msgs[-1], txn=txn)
            txn.commit()
            lat.append(time.perf_counter() - t)
            done += len(msgs)
        elapsed = time.perf_counter() - start
        assert broker.admin.topic_stats("out")["messages"] == n
    return n / elapsed, lat


# -- Redis Streams -------------------------------------------------------------------------


def run_redis(tmp: str, n: int, size: int, batch: int) -> tuple[float, list]:
    _pip("redis", "redis>=5")
    import redis

    server = _ensure("redis-server", "redis-server")
    port = _free_port()
    data = os.path.join(tmp, "redis")
    os.makedirs(data)
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            data,
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        r = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        pipe = r.pipeline(transaction=False)
        for i in range(n):
            pipe.xadd("in", {"v": os.urandom(size)})
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        r.xgroup_create("in", "fn", id="0")
        lat, done = [], 0
        start = time.perf_counter()
        while done < n:
            got = r.xreadgroup("fn", "c1", {"in": ">"}, count=batch)
            entries = got[0][1]
            t = time.perf_counter()
            tx = r.pipeline(transaction=True)  # MULTI ... EXEC
            for _, fields in entries:
                tx.xadd("out", {"v": fields[b"v"][::-1]})
            tx.xack("in", "fn", *[eid for eid, _ in entries])
            tx.execute()
            lat.append(time.perf_counter() - t)
            done += len(entries)
        elapsed = time.perf_counter() - start
        assert r.xlen("out") == n
        return n / elapsed, lat
    finally:
        proc.terminate()
        proc.wait()


# -- PostgreSQL ----------------------------------------------------------------------------


def run_postgres(tmp: str, n: int, size: int, batch: int) -> tuple[float, list]:
    _pip("psycopg", "psycopg[binary]>=3")
    import psycopg

    initdb = _ensure("initdb", "postgresql")
    pg_ctl = _ensure("pg_ctl", "postgresql")
    data = os.path.join(tmp, "pg")
    port = _free_port()
    user = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: a user of its own
        subprocess.run(["useradd", "-M", "pgbench-peer"], stderr=subprocess.DEVNULL)
        os.chmod(tmp, 0o777)
        user = ["runuser", "-u", "pgbench-peer", "--"]
    subprocess.run(
        user + [initdb, "-D", data, "-A", "trust", "-U", "bench"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        user
        + [
            pg_ctl,
            "-D",
            data,
            "-w",
            "-l",
            os.path.join(tmp, "pg.log"),
            "-o",
            f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c synchronous_commit=on "
            "-c fsync=on",
            "start",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        conn = psycopg.connect(f"host=127.0.0.1 port={port} user=bench dbname=postgres")
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE queue (id bigserial PRIMARY KEY, v bytea)")
            cur.execute("CREATE TABLE results (id bigserial PRIMARY KEY, v bytea)")
            cur.executemany(
                "INSERT INTO queue (v) VALUES (%s)", [(os.urandom(size),) for _ in range(n)]
            )
        conn.commit()
        lat, done = [], 0
        start = time.perf_counter()
        while done < n:
            t = time.perf_counter()
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT id, v FROM queue ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED", (batch,)
                )
                rows = cur.fetchall()
                cur.executemany(
                    "INSERT INTO results (v) VALUES (%s)", [(v[::-1],) for _, v in rows]
                )
                cur.execute("DELETE FROM queue WHERE id = ANY(%s)", ([i for i, _ in rows],))
            conn.commit()
            lat.append(time.perf_counter() - t)
            done += len(rows)
        elapsed = time.perf_counter() - start
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM results")
            assert cur.fetchone()[0] == n
        conn.close()
        return n / elapsed, lat
    finally:
        subprocess.run(
            user + [pg_ctl, "-D", data, "-m", "fast", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100, help="messages per transaction")
    parser.add_argument("--only", nargs="*", default=["redis", "postgres"])
    parser.add_argument("--json", metavar="FILE", help="write the table as JSON to FILE too")
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="pulsartxn-peers-")
    try:
        results = {
            f"pulsartxn ({label})": run_pulsartxn(
                tmp, args.messages, args.size, args.batch, style, durable_begin
            )
            for style, durable_begin, label in (
                ("send_async", False, "send_async, cumulative ack"),
                ("send_batch", False, "send_batch, ack each"),
                ("send_async", True, "send_async, cumulative ack, durable_begin=True"),
            )
        }
        if "redis" in args.only:
            results["Redis Streams"] = run_redis(tmp, args.messages, args.size, args.batch)
        if "postgres" in args.only:
            results["PostgreSQL"] = run_postgres(tmp, args.messages, args.size, args.batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ours = max(
        rate
        for name, (rate, _) in results.items()
        if name.startswith("pulsartxn") and "durable_begin" not in name
    )
    targets = {"Redis Streams": 2.0, "PostgreSQL": 5.0}
    print(
        f"exactly-once consume-process-produce: {args.messages} msgs x {args.size} B, "
        f"{args.batch} per transaction, every commit fsynced"
    )
    print()
    print("| system | msgs/s | commit p50 ms | commit p99 ms | pulsartxn / system | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (rate, lat) in results.items():
        ratio = "" if name.startswith("pulsartxn") else f"{ours / rate:.2f}x"
        target = targets.get(name)
        mark = "" if target is None else (" ✓" if ours / rate >= target else " ✗")
        print(
            f"| {name} | {rate:,.0f} | {_pct(lat, 0.5):.2f} | {_pct(lat, 0.99):.2f} | "
            f"{ratio}{mark} | {f'≥ {target:g}x' if target else ''} |"
        )
    print()
    print(
        "pulsartxn / system: the better of the first two pulsartxn rows over that system, same run."
    )
    if args.json:
        _write_json(args, results, ours, targets)
    return 0


def _write_json(args, results, ours, targets) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "workload": {"messages": args.messages, "size": args.size, "batch": args.batch},
        "commit": commit,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "systems": [
            {
                "system": name,
                "msgs_per_s": rate,
                "commit_p50_ms": _pct(lat, 0.5),
                "commit_p99_ms": _pct(lat, 0.99),
                "ratio": None if name.startswith("pulsartxn") else ours / rate,
                "target": targets.get(name),
            }
            for name, (rate, lat) in results.items()
        ],
    }
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
