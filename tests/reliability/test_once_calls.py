"""Admin calls made again after a crash take effect once (messaging/once.py): a child process
skips on a partitioned topic, call after call, and is killed -9 at a moment of the test's
choosing, possibly between two partitions of one call; the same calls made again after the
restart skip what each did not, and nothing twice."""

from __future__ import annotations

import signal
import textwrap

import pytest

import pulsartxn
from pulsartxn.messaging import once
from pulsartxn.messaging.once import OnceCall
from tests.helpers import python_child

PARTITIONS, PER_PARTITION, CALLS, N = 6, 10, 8, 7  # 8 skips of 7 over 6 x 10 messages

CHILD = textwrap.dedent(
    f"""
    import sys
    import pulsartxn
    from pulsartxn.messaging.once import OnceCall

    with pulsartxn.Broker(sys.argv[1], sync=True) as broker:
        print("ready", flush=True)
        for call in range({CALLS}):
            once = OnceCall(broker.storage, "owner", call)
            print(broker.admin._skip("pt", "s", {N}, once=once), flush=True)
        sys.stdin.readline()
    """
)


def _prepare(data: str) -> None:
    with pulsartxn.Broker(data, sync=True) as broker:
        client = broker.client()
        client.create_topic("pt", PARTITIONS)
        broker.admin.create_subscription("pt", "s", "earliest")
        for p in range(PARTITIONS):
            producer = client.create_producer(f"pt-partition-{p}", batching_enabled=False)
            for i in range(PER_PARTITION):
                producer.send(b"%d-%d" % (p, i))
            producer.close()


@pytest.mark.parametrize("kill_after", [0, 2, 5])
def test_skips_made_again_after_a_kill_skip_each_message_once(tmp_path, kill_after):
    data = str(tmp_path / "d")
    _prepare(data)
    proc = python_child(tmp_path, CHILD, data)
    try:
        assert proc.stdout.readline().strip() == "ready"
        answered = [int(proc.stdout.readline()) for _ in range(kill_after)]
    finally:
        proc.send_signal(signal.SIGKILL)  # within call `kill_after`, or just after it
        proc.wait()
    assert answered == [N] * kill_after
    with pulsartxn.Broker(data, sync=True) as broker:
        again = [
            broker.admin._skip("pt", "s", N, once=OnceCall(broker.storage, "owner", call))
            for call in range(CALLS)
        ]
        assert again == [N] * CALLS  # the answered ones as they were, the rest done now
        backlog = broker.admin.topic_stats("pt")["subscriptions"]["s"]["backlog"]
        assert backlog == PARTITIONS * PER_PARTITION - CALLS * N
        # A new call is new: it skips again.
        assert broker.admin._skip("pt", "s", 2, once=OnceCall(broker.storage, "owner", 99)) == 2
        assert broker.admin.skip("pt", "s", 100) == backlog - 2


def test_a_call_saying_what_its_owner_has_drops_the_older_rows(tmp_path):
    """The rows are per owner (no owner's name a prefix of another's); a call's `below`
    drops that owner's rows of calls under it, `forget` every row of the owners named."""
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        broker.client().create_producer("t").close()  # an empty topic: each skip skips 0
        broker.admin.create_subscription("t", "s", "earliest")
        storage = broker.storage
        owners = ["a", "a\0b", "\u00e9t\u00e9"]
        for owner in owners:
            for call in range(3):
                broker.admin._skip("t", "s", 1, once=OnceCall(storage, owner, call))
        assert once.owners(storage) == set(owners)
        assert [
            OnceCall(storage, "a", call).done("persistent://public/default/t") for call in range(3)
        ] == [(True, 0)] * 3
        broker.admin._skip("t", "s", 1, once=OnceCall(storage, "a", 3, below=2))
        done = [
            OnceCall(storage, "a", call).done("persistent://public/default/t")[0]
            for call in range(4)
        ]
        assert done == [False, False, True, True]
        assert OnceCall(storage, "a\0b", 0).done("persistent://public/default/t")[0]
        once.forget(storage, ["a"])
        assert once.owners(storage) == {"a\0b", "\u00e9t\u00e9"}
        assert not OnceCall(storage, "a", 3).done("persistent://public/default/t")[0]
        assert OnceCall(storage, "a\0b", 2).done("persistent://public/default/t")[0]
