"""The subscription's dispatch loops: native vs twin, in one run."""

from __future__ import annotations

from pulsartxn._native import load

from ..benchmarks.native._dispatch import MESSAGES, buffer_entry, columns, take_all
from ._harness import Row, best_time


def measure(quick: bool = False) -> list[Row]:
    native, twin = load("native"), load("reference")
    cols = columns()
    items = list(buffer_entry(native, cols))
    loops = (
        (f"buffer_messages, one entry of {MESSAGES} msgs into the read-ahead", buffer_entry, cols),
        (f"take_buffered, {MESSAGES} msgs from the read-ahead into Messages", take_all, items),
    )
    return [
        Row(
            figure,
            MESSAGES,
            "msgs",
            best_time(lambda: run(native, arg)),
            best_time(lambda: run(twin, arg), repeat=3),
            "twin",
            None,
        )
        for figure, run, arg in loops
    ]
