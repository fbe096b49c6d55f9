"""Weight sync: after each update, push the policy's weights into the rollout backend.

The training side gathers the full weights (``training.engine.full_state_dict``) and hands them
to the backend as a :class:`~harness.backends.base.WeightUpdate`; each backend owns its
receiving side (``update_weights``): ``hf`` loads them into its in-process model between
batches, ``sglang`` writes a model directory under ``scratch`` and posts
``/update_weights_from_disk`` then ``/flush_cache``, ``scripted`` only moves its version. A
backend that cannot take weights (``openai``) says so with ``NotImplementedError``.

Every backend ends tagged with the policy version (the number of optimizer steps taken), and
the trainer records that version on every trajectory generated afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.backends.base import WeightUpdate


def sync_weights(
    backend: Any,
    state_dict: dict[str, Any],
    version: int,
    scratch: Path | None = None,
    tokenizer: Any = None,
    model_config: Any = None,
) -> None:
    """Push ``state_dict`` (full weights) into ``backend`` as policy version ``version``."""
    backend.update_weights(WeightUpdate(state_dict, version, model_config, tokenizer, scratch))
