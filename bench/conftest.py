from __future__ import annotations

import pytest

from pulsartxn._native import load


@pytest.fixture(params=["native", "reference"])
def impl(request):
    return load(request.param)
