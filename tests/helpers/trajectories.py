"""A trajectory for tests that care about a few of its fields: the identity fields a test does not
set get neutral defaults (question "q", method "m")."""

from __future__ import annotations

from typing import Any

from harness.types import Trajectory


def trajectory(answers: list[str], **fields: Any) -> Trajectory:
    """A :class:`Trajectory` answering ``answers``, with ``fields`` over the defaults."""
    return Trajectory(**{"example_id": "q", "question": "q", "method": "m", "answers": answers, **fields})
