"""Failure kinds shared by every component.

An :class:`InfrastructureError` is a failure of something around the model (the retriever, the
generation server): the item it hit is recorded as failed and run again when the run is resumed.
Everything the model itself does (no answer, a context overflow) is a result, never an error.
"""

from __future__ import annotations

import asyncio


class InfrastructureError(RuntimeError):
    """A component around the model failed for good (after any retries of its own)."""

    kind = "infrastructure"


def error_kind(e: BaseException) -> str:
    """``retrieval``, ``backend``, ``timeout`` (the retriable kinds) or ``other``."""
    if isinstance(e, InfrastructureError):
        return e.kind
    if isinstance(e, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    return "other"
