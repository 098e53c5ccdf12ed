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
