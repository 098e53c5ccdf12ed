"""Load on a real `pulsartxn serve` process (127.0.0.1): hundreds of parked receives whose
client dies, and batch_receive asked for everything there is. Every wait has a deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pulsartxn

# A client process that parks `sessions` x `per` receives on one Shared subscription.
PARKER = r"""
import sys, threading, pulsartxn
url, sessions, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
clients = [pulsartxn.Client(url) for _ in range(sessions)]
shared = pulsartxn.ConsumerType.Shared
consumers = []
for c in clients:
    consumers += [c.subscribe("idle", "s", subscription_type=shared) for _ in range(per)]
for consumer in consumers:
    threading.Thread(target=consumer.receive, daemon=True).start()
print("parked", flush=True)
sys.stdin.read()
"""


def _until(check, seconds: float, what: str, every: float = 0.01):
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(every)


def _cpu_s(pid: int) -> float:
    """User plus system CPU time the process has used, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_anon(pid: int) -> int:
    """Anonymous resident memory in bytes: what the process holds, not LMDB's mapped pages."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def _sub(admin, topic: str, name: str = "s") -> dict:
    return admin.admin.topic_stats(topic)["subscriptions"].get(name, {})


def test_500_parked_receives_of_a_killed_client_close_in_under_a_second(server):
    s = server("--session-timeout-s", "2")
    admin = pulsartxn.Client(s.url)
    parker = subprocess.Popen(
        [sys.executable, "-c", PARKER, s.url, "5", "100"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parker.stdout.readline().strip() == "parked"
        _until(lambda: _sub(admin, "idle").get("waiting") == 500, 60, "500 receives parked")
        cpu = _cpu_s(s.proc.pid)
        parker.kill()
        parker.wait(30)
        killed = time.monotonic()
        # The sessions expire 2 to 2.5 s after their last keepalive; then closing their 500
        # consumers, each waking only its own parked receive, takes well under a second.
        _until(lambda: _sub(admin, "idle").get("consumers") == 0, 30, "consumers closed")
        gone = time.monotonic() - killed
        used = _cpu_s(s.proc.pid) - cpu
    finally:
        parker.kill()
        parker.wait(30)
    assert gone < 2.5 + 1.0, f"the parked consumers were closed {gone:.2f} s after the kill"
    assert used < 1.0, f"the server used {used:.2f} s of CPU to close 500 parked receives"
    # The server goes on serving, and a new consumer gets what is sent.
    consumer = admin.subscribe(
        "idle",
        "s",
        subscription_type=pulsartxn.ConsumerType.Shared,
        initial_position=pulsartxn.InitialPosition.Earliest,
    )
    admin.create_producer("idle").send(b"after")
    assert consumer.receive(10_000).data() == b"after"
    admin.close()


def test_a_batch_receive_for_everything_keeps_the_server_small(server):
    s = server()
    client = pulsartxn.Client(s.url)
    producer = client.create_producer("big")
    payload = os.urandom(1 << 20)
    count = 600  # 600 MiB stored, as in the report that took the server from 0.5 to 2.8 GB
    for i in range(count):
        producer.send(payload, properties={"i": str(i)})
    consumer = client.subscribe("big", "s", initial_position=pulsartxn.InitialPosition.Earliest)
    base = _rss_anon(s.proc.pid)
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss_anon(s.proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        seen: list[int] = []
        for _ in range(2):  # once, then again after the unacked messages are redelivered
            got: set[int] = set()
            while len(got) < count:
                batch = consumer.batch_receive(10**9, 2_000)
                assert batch, f"{count - len(got)} messages never came"
                assert sum(len(m.data()) for m in batch) <= 64 << 20  # the per-call byte cap
                got.update(int(m.properties()["i"]) for m in batch)
            seen.append(len(got))
            consumer.close()  # nothing acked: the subscription keeps positions to redeliver
            consumer = client.subscribe(
                "big", "s", initial_position=pulsartxn.InitialPosition.Earliest
            )
        assert seen == [count, count]
    finally:
        done.set()
        sampler.join(10)
    grew = (peak[0] - base) >> 20
    # Per call at most 64 MiB leaves the server, streamed in batches of about 4 MiB.
    assert grew < 300, f"the server grew {grew} MiB while 2 x 600 MiB were received"
    client.close()
