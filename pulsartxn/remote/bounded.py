"""A Flight stream read within the operation timeout between its chunks, however long the
whole stream takes (a scan): a DoGet waits for the server's first answer and cannot be
cancelled before it, so a worker thread reads the stream and the caller waits on it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

_END = object()


def handed_over(
    produce: Callable[[Callable[[Any], bool], Callable[[], bool]], None],
    *,
    maxsize: int,
    name: str,
    limit_s: float | None = None,
    timed_out: Callable[[], BaseException] | None = None,
    join: bool = False,
) -> Iterator[Any]:
    """What `produce(put, stopped)` puts from a worker thread, yielded here in order (what
    it raises, raised here). put(item) is False and stopped() True once the caller stopped
    reading. `limit_s`: timed_out() is raised when nothing comes within it; `join`: stopping
    waits for the worker to end (else it ends with its last call)."""
    items: queue.Queue = queue.Queue(maxsize=maxsize)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            produce(put, stop.is_set)
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            put(exc)

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = items.get(timeout=limit_s)
            except queue.Empty:
                raise timed_out() from None
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        if join:
            thread.join()


def bounded_chunks(
    open_reader: Callable[[], Any], limit_s: float, timed_out: Callable[[], BaseException]
) -> Iterator[Any]:
    """The chunks of the stream `open_reader()` opens (on the worker); timed_out() is raised
    when none comes within `limit_s`. The stream is cancelled when the caller stops reading."""
    opened: list = []

    def produce(put, stopped) -> None:
        reader = open_reader()
        opened.append(reader)
        if stopped():  # the caller gave up while the server was silent
            reader.cancel()
            return
        for chunk in reader:
            if not put(chunk):
                return

    try:
        yield from handed_over(
            produce, maxsize=4, name="pulsartxn-stream", limit_s=limit_s, timed_out=timed_out
        )
    finally:
        # The worker's stopped() or this side's `opened` sees the other's step: the reader is
        # cancelled by one of them at least.
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
