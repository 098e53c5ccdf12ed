"""gRPC's poller: importing the network layer asks gRPC for its older poller (a Flight call's
CPU about halved, bench/RESULTS.md) unless the user set GRPC_EXPERIMENTS; the gRPC that
pyarrow bundles knows both experiments, so neither a broker nor a client logs about them."""

from __future__ import annotations

import os
import subprocess
import sys

from pulsartxn.server.protocol import GRPC_EXPERIMENTS

SHOW = "import os, pulsartxn.remote; print(repr(os.environ.get('GRPC_EXPERIMENTS')))"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    return {**env, **extra}


def test_the_network_layer_sets_the_poller_before_grpc_starts():
    out = subprocess.run([sys.executable, "-c", SHOW], env=_env(), capture_output=True, text=True)
    assert out.stdout.strip() == repr(GRPC_EXPERIMENTS)


def test_a_value_the_user_set_is_kept():
    for mine in ("", "tcp_rcv_lowat"):
        out = subprocess.run(
            [sys.executable, "-c", SHOW],
            env=_env(GRPC_EXPERIMENTS=mine),
            capture_output=True,
            text=True,
        )
        assert out.stdout.strip() == repr(mine)


CLIENT = """
import sys, pulsartxn
with pulsartxn.Client(sys.argv[1]) as c:
    p = c.create_producer("t")
    t = c.new_transaction()
    p.send(b"x", txn=t)
    t.commit()
    print(len(c.create_reader("t", pulsartxn.MessageId.earliest).read_next(5000).value()))
"""


def test_a_broker_and_a_client_run_with_it_and_log_nothing_about_it(server):
    s = server()
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, s.url], env=_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    for log in (out.stderr, s.log()):
        assert "experiment" not in log.lower(), log
