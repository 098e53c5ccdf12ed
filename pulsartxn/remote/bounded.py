"""A Flight stream read within the operation timeout between its chunks, however long the
whole stream takes (a scan): a DoGet waits for the server's first answer and cannot be
cancelled before it, so a worker thread reads the stream and the caller waits on it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

_END = object()


def bounded_chunks(
    open_reader: Callable[[], Any], limit_s: float, timed_out: Callable[[], BaseException]
) -> Iterator[Any]:
    """The chunks of the stream `open_reader()` opens (on the worker); timed_out() is raised
    when none comes within `limit_s`. The stream is cancelled when the caller stops reading."""
    chunks: queue.Queue = queue.Queue(maxsize=4)
    opened: list = []
    abandoned = threading.Event()

    def put(item) -> bool:
        while not abandoned.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            reader = open_reader()
            opened.append(reader)
            if abandoned.is_set():  # the caller gave up while the server was silent
                reader.cancel()
                return
            for chunk in reader:
                if not put(chunk):
                    return
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            put(exc)

    threading.Thread(target=work, name="pulsartxn-stream", daemon=True).start()
    try:
        while True:
            try:
                item = chunks.get(timeout=limit_s)
            except queue.Empty:
                raise timed_out() from None
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        # Either this side or the worker sees the other's step: the reader is cancelled once.
        abandoned.set()
        if opened:
            opened[0].cancel()


def bounded_call(fn: Callable[[], Any], limit_s: float, timed_out: Callable[[], BaseException]):
    """fn() on a worker thread, waited for at most `limit_s` (then timed_out() is raised and
    the worker ends with the call: when the server answers, or the client closes)."""
    done = threading.Event()
    out: list = []

    def work() -> None:
        try:
            out.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            out.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=work, name="pulsartxn-call", daemon=True).start()
    if not done.wait(limit_s):
        raise timed_out()
    ok, value = out[0]
    if not ok:
        raise value
    return value
