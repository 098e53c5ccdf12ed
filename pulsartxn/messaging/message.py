"""MessageId and Message, as the Pulsar Python client shapes them: native
(``_native/message.pyx``), their twins in ``_native/reference/message.py``."""

from __future__ import annotations

from .._native import Message, MessageId

__all__ = ["Message", "MessageId"]
