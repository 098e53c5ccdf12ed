"""``subscribe(..., message_listener=fn)``: ``fn(consumer, message)`` called per message on a
listener thread, as pulsar-client's; the consumer's receive() is then refused. Readers'
``reader_listener=fn`` (``fn(reader, message)``) runs on the same kind of thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import AlreadyClosed, InvalidConfiguration, PulsarTxnError, Timeout, excerpt

log = logging.getLogger("pulsartxn.listener")

POLL_MS = 100  # how soon a listener thread notices its consumer closed


def check_listener(message_listener: object) -> None:
    """TypeError unless `message_listener` is None or callable (checked before subscribing)."""
    if message_listener is not None and not callable(message_listener):
        raise TypeError(
            f"message_listener must be callable(consumer, message), not {excerpt(message_listener)}"
        )


class MessageListener:
    """The thread that receives for a consumer (or reader) with a listener and hands each
    message on; an exception of the listener is logged and the next message delivered."""

    def __init__(
        self,
        consumer: Any,
        listener: Callable[[Any, Any], None],
        receive: Callable[[int], Any] | None = None,
        name: str | None = None,
        param: str = "message_listener",
    ) -> None:
        """`receive(timeout_ms)`: how it takes a message (default: consumer.receive); `name`:
        what its thread and its log lines call it (default: the consumer's name); `param`:
        the argument that set it, as errors name it."""
        self._param = param
        self._consumer = consumer
        self._listener = listener
        self._receive = consumer.receive if receive is None else receive
        self._name = consumer.consumer_name() if name is None else name
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"pulsartxn-listener-{self._name}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def refuse(self, what: str) -> None:
        """InvalidConfiguration for a receive by anyone but the listener thread."""
        if threading.current_thread() is not self.thread:
            raise InvalidConfiguration(f"cannot {what}() with a {self._param} (it receives them)")

    def _run(self) -> None:
        consumer = self._consumer
        while not self._stop.is_set():
            try:
                msg = self._receive(POLL_MS)
            except Timeout:
                continue
            except AlreadyClosed:
                return
            except PulsarTxnError:
                if self._stop.is_set():
                    return
                log.exception("listener of %s: receive failed", self._name)
                time.sleep(POLL_MS / 1000.0)
                continue
            try:
                self._listener(consumer, msg)
            except Exception:  # noqa: BLE001 - logged; the listener goes on, as pulsar-client's
                log.exception("listener of %s raised", self._name)

    def stop(self, timeout: float | None = None) -> None:
        """Stop delivering; waits for a call under way (at most `timeout` seconds) unless made
        from the listener itself."""
        self._stop.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)


def start_listener(consumer: Any, listener: Callable[[Any, Any], None]) -> None:
    """Hand `consumer`'s messages to `listener` from now on (its close stops it)."""
    consumer._listener = MessageListener(consumer, listener)
    consumer._listener.start()
