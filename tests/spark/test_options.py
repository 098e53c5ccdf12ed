"""The data source refuses an option it does not know, naming the nearest valid one: a typo
such as ``service.url`` must not fall back to the embedded default broker. Checked where the
source reads its options, before any broker or Spark job is involved (no session needed)."""

from __future__ import annotations

import pytest

from pulsartxn.spark.datasource import PulsarTxnDataSource


class _Source(PulsarTxnDataSource):
    default_service_url = "pulsartxn://127.0.0.1:1"  # as register() sets it: never reached


@pytest.mark.parametrize("make", ["reader", "writer", "streamReader", "streamWriter"])
def test_unknown_options_are_refused_with_the_nearest(make):
    for typo, right in (
        ("service.url", "service_url"),
        ("Servce_URL", "service_url"),
        ("topics", "topic"),
        ("rows_per_splits", "rows_per_split"),
    ):
        source = _Source(options={"topic": "t", typo: "pulsartxn://elsewhere:6650"})
        with pytest.raises(ValueError, match=rf"unknown option '{typo}'.*did you mean '{right}'"):
            getattr(source, make)(None, False) if "riter" in make else getattr(source, make)(None)
    with pytest.raises(ValueError, match="starting_position must be 'earliest' or 'latest'"):
        _Source(options={"topic": "t", "starting_position": "earlist"}).streamReader(None)


@pytest.mark.parametrize("make", ["reader", "writer", "streamReader", "streamWriter"])
def test_numbers_that_are_no_numbers_are_refused_on_the_driver(make):
    """rows_per_split, min_splits and txn_timeout_ms are checked where the options are read
    (a txn_timeout_ms of 0 used to fail every attempt of every task, in the executors)."""
    for name, bad, error in (
        ("txn_timeout_ms", "0", "out of range 1.."),
        ("txn_timeout_ms", "soon", "txn_timeout_ms must be an int"),
        ("txn_timeout_ms", str(1 << 41), "out of range 1.."),
        ("rows_per_split", "0", "rows_per_split must be at least 1"),
        ("Min_Splits", "1.5", "min_splits must be an int"),
    ):
        source = _Source(options={"topic": "t", name: bad})
        with pytest.raises(ValueError, match=error):
            getattr(source, make)(None, False) if "riter" in make else getattr(source, make)(None)


def test_options_are_case_insensitive():
    source = _Source(options={"TOPIC": "t", "Service_Url": "pulsartxn://h:1", "path": "x"})
    assert source._opts()["service_url"] == "pulsartxn://h:1"
