"""The subscription's dispatch loops: native vs twin, in one run."""

from __future__ import annotations

from pulsartxn._native import load

from ..benchmarks.native._dispatch import MESSAGES, buffer_entry, columns, take_all
from ._harness import Row, best_time


def measure(quick: bool = False) -> list[Row]:
    native, twin = load("native"), load("reference")
    cols = columns()
    rows = [
        Row(
            f"buffer_messages, one entry of {MESSAGES} msgs into the read-ahead",
            MESSAGES,
            "msgs",
            best_time(lambda: buffer_entry(native, cols)),
            best_time(lambda: buffer_entry(twin, cols), repeat=3),
            "twin",
            None,
        )
    ]
    items = list(buffer_entry(native, cols))
    rows.append(
        Row(
            f"take_buffered, {MESSAGES} msgs from the read-ahead into Messages",
            MESSAGES,
            "msgs",
            best_time(lambda: take_all(native, items)),
            best_time(lambda: take_all(twin, items), repeat=3),
            "twin",
            None,
        )
    )
    return rows
