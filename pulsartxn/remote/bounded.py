"""Flight calls bounded by the operation timeout though they cannot be cancelled: a worker
thread makes them and the caller waits on it. A stream read within the timeout between its
chunks, however long the whole stream takes (a scan: a DoGet waits for the server's first
answer); a stream written one call at a time (a batch stream: a write waits while the
server's window is full)."""

from __future__ import annotations

import queue
import threading
import weakref
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


class Worker:
    """One thread running a stream's calls in order, each waited for at most its limit. A
    call that outlasts it keeps the thread (a Flight write cannot be cancelled: it ends when
    the server reads again or the connection fails); the worker then runs only what
    ``stop(last)`` hands it after that call, and ends."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.stuck = False
        threading.Thread(target=_serve, args=(self._jobs,), name=name, daemon=True).start()
        weakref.finalize(self, self._jobs.put, None)  # dropped unstopped: its thread ends

    def call(self, fn: Callable[[], Any], limit_s: float, timed_out: Callable[[], BaseException]):
        """fn() on the worker, waited for at most `limit_s` (then timed_out() is raised)."""
        if self.stuck:
            raise RuntimeError("a worker whose call outlasted its limit takes no more calls")
        done = threading.Event()
        out: list = []
        self._jobs.put((fn, done, out))
        if not done.wait(limit_s):
            self.stuck = True
            raise timed_out()
        ok, value = out[0]
        if not ok:
            raise value
        return value

    def stop(self, last: Callable[[], Any] | None = None) -> None:
        """End the worker once its calls are done, after running `last` (errors ignored)."""
        if last is not None:
            self._jobs.put((last, None, None))
        self._jobs.put(None)


def _serve(jobs: queue.SimpleQueue) -> None:
    # Holds the queue alone, not the Worker, so that a Worker dropped without stop() is
    # collected (and its finalizer ends this loop).
    while (job := jobs.get()) is not None:
        fn, done, out = job
        try:
            value = fn()
            if out is not None:
                out.append((True, value))
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            if out is not None:
                out.append((False, exc))
        finally:
            if done is not None:
                done.set()
