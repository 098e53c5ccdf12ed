"""Helpers shared by the test modules: reading back what a topic or subscription holds.
Import them as ``from tests.helpers import drain``."""

from __future__ import annotations

from pulsartxn.errors import Timeout


def drain(consumer, timeout_ms: int = 200) -> list:
    """Every message `consumer` receives until none comes for `timeout_ms` (in order)."""
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_ms))
        except Timeout:
            return out


def scanned(client, topic: str, *, sort: bool = False) -> list[bytes]:
    """The values stored in `topic` (every partition), read by a scan: in scan order, or
    sorted."""
    values = [v for b in client.scan(topic) for v in b.column("value").to_pylist()]
    return sorted(values) if sort else values
