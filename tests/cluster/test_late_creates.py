"""A create the client gave up on (not answered within operation_timeout_seconds) that its
broker finishes later: a subscribe held up on ZooKeeper (paused with SIGSTOP) makes its
Exclusive consumer once ZooKeeper resumes. The client cancels that create with its next
calls, so the broker closes what it made and the subscribe tried again gets the
subscription: before, it got ConsumerBusy for as long as the session lived."""

from __future__ import annotations

import signal
import time

import pulsartxn
from pulsartxn import errors
from pulsartxn.remote import RemoteClient


def test_a_subscribe_made_after_its_client_gave_up_holds_nothing(zookeeper, local_cluster):
    cluster = local_cluster(1)
    client = RemoteClient(f"pulsartxn://{cluster.addresses[0]}", operation_timeout_seconds=1)
    try:
        zookeeper.proc.send_signal(signal.SIGSTOP)
        try:
            start = time.monotonic()
            try:
                client.subscribe("late", "excl")  # a new topic: the broker asks ZooKeeper
                raise AssertionError("the subscribe was answered with ZooKeeper paused")
            except errors.Timeout:
                assert time.monotonic() - start < 4.0
        finally:
            zookeeper.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 15
        while True:  # the broker finishes the subscribe it was held up in, then this one
            try:
                consumer = client.subscribe(
                    "late", "excl", initial_position=pulsartxn.InitialPosition.Earliest
                )
                break
            except errors.Timeout:
                assert time.monotonic() < deadline
        client.create_producer("late").send(b"x")
        assert consumer.receive(5000).data() == b"x"
        assert client.admin.topic_stats("late")["subscriptions"]["excl"]["consumers"] == 1
    finally:
        client.close()
