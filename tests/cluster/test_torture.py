"""The cluster's crash torture (pulsartxn/torture_cluster.py), short: kill -9 brokers and the
pipeline's process under an exactly-once pipeline over 3 brokers; and proof that its checker
catches a loss and a duplicate. The long version:
``python -m pulsartxn.torture_cluster --iterations 20 --seed 1``."""

from __future__ import annotations

import pytest

from pulsartxn import torture_cluster


@pytest.mark.slow
def test_kill_brokers_and_the_pipeline_exactly_once(tmp_path):
    rounds: list[str] = []
    summary = torture_cluster.run(4, 7, str(tmp_path), inputs=600, log=rounds.append)
    assert summary["inputs"] == summary["outputs"] == 1800
    assert summary["kills"]["child"] == 4 and summary["kills"]["broker"] >= 1
    assert len(rounds) == 4


def test_the_checker_catches_a_loss_a_duplicate_and_a_stray():
    sent = [b"a", b"b", b"c"]
    torture_cluster.check(sent, [b"c", b"a", b"b"], {b"a"})
    with pytest.raises(torture_cluster.TortureFailure, match="twice"):
        torture_cluster.check(sent, [b"a", b"b", b"c", b"b"], set())
    with pytest.raises(torture_cluster.TortureFailure, match="never produced"):
        torture_cluster.check(sent, [b"a", b"b"], set())
    with pytest.raises(torture_cluster.TortureFailure, match="no input"):
        torture_cluster.check(sent, [b"a", b"b", b"c", b"z"], set())
