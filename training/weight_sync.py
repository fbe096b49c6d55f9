"""Weight sync: after each update, push the policy's weights into the rollout backend.

The training side gathers the full weights (``training.engine.full_state_dict``) and hands them
to the backend as a :class:`~harness.backends.base.WeightUpdate`; each backend owns its
receiving side (``update_weights``): ``hf`` loads them into its in-process model between
batches, ``sglang`` writes a model directory under ``scratch`` and posts
``/update_weights_from_disk`` then ``/flush_cache`` (to every worker behind an sglang-router),
``openai`` on vLLM writes one and reloads it through vLLM's dev-mode ``/collective_rpc``
(:mod:`harness.backends.vllm_sync`), ``scripted`` only moves its version. A backend that cannot
take weights says so with ``NotImplementedError``.

Every backend ends tagged with the policy version (the number of optimizer steps taken), and
the trainer records that version on every trajectory generated afterwards.

With several ranks (:func:`rank_safe_sync`): an in-process backend (hf, scripted) is each
rank's own copy, so every rank loads its weights. A server (SGLang, vLLM: anything with
``urls``) is shared, so only rank 0 exports and posts the update (one model directory, one
``/update_weights_from_disk`` per step); the others wait at a barrier and then tag their client
with the new version. Under ZeRO-3 every rank takes part in gathering the weights (a collective)
but only rank 0 uses them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from harness.backends.base import Backend, BackendBase, WeightUpdate

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


def sync_weights(
    backend: BackendBase,
    state_dict: dict[str, torch.Tensor],
    version: int,
    scratch: Path | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_config: PretrainedConfig | None = None,
    in_flight: str = "drain",
) -> None:
    """Push ``state_dict`` (full weights) into ``backend`` as policy version ``version``;
    ``in_flight``: see :class:`harness.backends.base.WeightUpdate`."""
    backend.update_weights(WeightUpdate(state_dict, version, model_config, tokenizer, scratch, in_flight))


def is_shared(backend: Backend) -> bool:
    """A server every rank talks to (HTTP backends list their ``urls``), not a per-rank copy."""
    return getattr(backend, "urls", None) is not None


def barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def rank_safe_sync(
    backend: Backend,
    push: Callable[[], None],
    version: int,
    rank: int,
    world: int,
    gather: Callable[[], object] | None = None,
    adapter: bool = False,
) -> None:
    """Run ``push`` (export the weights and post them) once for a shared server, on rank 0 behind
    a barrier; on every rank for a per-rank in-process backend. ``gather``, when given, is a
    collective every rank must enter first (ZeRO-3's parameter gather) and ``push`` reads its result.
    ``adapter``: the update was a LoRA adapter (SGLang ``/load_lora_adapter``), which the other
    ranks' clients must then name in their requests.
    """
    if world <= 1 or not is_shared(backend):
        push()
        return
    if gather is not None:
        gather()
    if rank == 0:
        push()
    barrier()  # no rank rolls out before the server holds the new weights
    if rank != 0:  # this rank's client object: tag it as rank 0's was
        backend.weight_version = str(version)
        if adapter:
            backend.lora_name = f"policy-v{version}"
