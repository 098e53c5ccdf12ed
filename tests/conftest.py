from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from pulsartxn._native import load

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

NATIVE = load("native")
REFERENCE = load("reference")


@pytest.fixture(params=["native", "reference"])
def impl(request):
    """Each implementation of the native core in turn: the compiled one and its twin."""
    return NATIVE if request.param == "native" else REFERENCE


def pytest_collection_modifyitems(config, items):
    """The longest tests (marked ``slow``) start before the others, so that none of them is
    left to run alone at the end of a run over several workers."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


def pytest_xdist_make_scheduler(config, log):
    """xdist's load scheduling, except that the Spark tests are one unit of work, run by one
    worker: one JVM for the shared session rather than one a worker, and its executors not
    competing with another's. (xdist's own ``loadgroup`` names groups by rewriting node ids,
    which pytest 9 no longer reads.) The largest unit is handed out first."""
    from xdist.scheduler import LoadScopeScheduling

    class SparkTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/spark" if nodeid.startswith("tests/spark/") else nodeid

    return SparkTogether(config, log)
