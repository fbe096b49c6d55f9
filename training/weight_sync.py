"""Weight sync: after each update, push the policy's weights into the rollout backend.

This is the one module that knows both the training side (a state dict of full weights,
gathered from DeepSpeed by the trainer) and the receiving side of each backend:

- ``hf`` (in-process): ``backend.update_weights(state_dict, version)`` loads the weights into
  the backend's own model copy between generation batches.
- ``sglang``: save the policy as a safetensors model directory, then
  ``POST /update_weights_from_disk {model_path, weight_version, flush_cache}`` on every server,
  then ``POST /flush_cache`` so no KV computed by the old weights is reused (the update's own
  ``flush_cache`` flag does the same; the explicit call also covers servers that ignore it).
- ``scripted``: nothing to load (its text does not depend on weights); only the version moves.

Every backend ends tagged with the policy version (the number of optimizer steps taken), and
the trainer records that version on every trajectory generated afterwards.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


def sync_weights(
    backend: Any,
    state_dict: dict[str, torch.Tensor],
    version: int,
    scratch: Path | None = None,
    tokenizer: Any = None,
    model_config: Any = None,
) -> None:
    """Push ``state_dict`` (full weights) into ``backend`` as policy version ``version``."""
    if backend.name == "hf":
        backend.update_weights(state_dict, version=version)
    elif backend.name == "sglang":
        if scratch is None or model_config is None:
            raise ValueError("sglang weight sync needs a scratch directory and the model config")
        path = save_for_engine(state_dict, scratch / f"weights-v{version}", tokenizer, model_config)
        sync_sglang(backend, path, version)
        for old in scratch.glob("weights-v*"):  # keep only the copy the servers now serve
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
    elif backend.name == "scripted":
        backend.weight_version = str(version)
    else:
        raise NotImplementedError(f"weight sync into a {backend.name!r} backend is not implemented")


def sync_sglang(backend: Any, model_path: Path, version: int) -> None:
    """``/update_weights_from_disk`` then ``/flush_cache`` on every SGLang server of ``backend``."""
    import httpx

    from harness.backends.base import BackendError, run_sync

    run_sync(backend.update_weights_from_disk(str(model_path), str(version), flush_cache=True))
    for url in backend.urls:
        r = httpx.post(url.rstrip("/") + "/flush_cache", timeout=60.0)
        if r.status_code != 200:
            raise BackendError(f"{url}/flush_cache failed ({r.status_code}): {r.text[:200]}")
    backend.weight_version = str(version)


def save_for_engine(state_dict: dict[str, torch.Tensor], out: Path, tokenizer: Any, model_config: Any) -> Path:
    """A model directory an inference engine can load: config + tokenizer + safetensors weights,
    written to a temporary directory and renamed, so a server never reads a half-written model."""
    from safetensors.torch import save_file

    from training.checkpoint import untie

    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model_config.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    save_file(untie({k: v.detach().contiguous() for k, v in state_dict.items()}), str(tmp / "model.safetensors"))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
