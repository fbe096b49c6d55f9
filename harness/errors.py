"""Failure kinds shared by every component.

An :class:`InfrastructureError` is a failure of something around the model (the retriever, the
generation server): the item it hit is recorded as failed and run again when the run is resumed.
Everything the model itself does (no answer, a context overflow) is a result, never an error.
"""

from __future__ import annotations

import asyncio
import re

# user:password@ in a URL (http://alice:s3cret@host:8000): never echoed in a message or a log
_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact_urls(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``
    (``http://alice:s3cret@host/x`` -> ``http://***@host/x``)."""
    return _CREDENTIALS.sub(r"\g<scheme>***@", text)


class InfrastructureError(RuntimeError):
    """A component around the model failed for good (after any retries of its own). Its message
    never carries the credentials of a server URL (:func:`redact_urls`): it is printed, logged and
    stored on the failed item's trajectory."""

    kind = "infrastructure"

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact_urls(a) if isinstance(a, str) else a for a in args))


def error_kind(e: BaseException) -> str:
    """``retrieval``, ``backend``, ``timeout`` (the retriable kinds) or ``other``."""
    if isinstance(e, InfrastructureError):
        return e.kind
    if isinstance(e, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    return "other"
