"""LoRA through ``peft``: adapters on the policy (and the critic's body), the reference as the
base with adapters disabled, and what weight sync pushes.

- Policy: :func:`apply_lora` wraps the LM in a ``peft`` model; only adapter weights train (the
  DeepSpeed optimizer sees only parameters with ``requires_grad``).
- Reference (KL): the SAME model under ``disable_adapter()``, so it costs no second copy.
- Critic (PPO): :func:`lora_critic` injects adapters into the value model's body in place; its
  scalar head trains fully (it starts random).
- Checkpoints hold the adapters: the policy's state dict is the peft model's (base + ``lora_``
  keys), and ``final/`` is peft's adapter directory (``adapter_config.json`` naming the base),
  which ``transformers`` loads on top of the base when ``peft`` is installed.
- Weight sync, ``model.lora.sync``:
  - ``merged`` (default): :func:`merged_state_dict` computes W + ΔW for every adapted layer
    without touching the training weights, under the base model's own key names, and pushes full
    weights (the hf backend loads the state dict, SGLang reads a model directory from disk);
  - ``adapter``: the adapter is saved and loaded into SGLang with ``/load_lora_adapter`` (the
    server must run with ``--enable-lora --max-lora-rank R --lora-target-modules ...``; its CPU
    build cannot) and rollouts name it in ``/generate``'s ``lora_path``; or into vLLM with
    ``/v1/load_lora_adapter`` and rollouts name it as their ``model``
    (:mod:`harness.backends.vllm_sync`). Only backends with ``update_lora_adapter``.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from harness.fsutil import atomic_dir
from training.config import LoraConfig
from training.engine import _gathered, unwrap

if TYPE_CHECKING:  # deferred at run time: optional extra (harness[train])
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel

    from training.engine import ValueHead

logger = logging.getLogger(__name__)


def peft_config(cfg: LoraConfig) -> PeftLoraConfig:
    # deferred: optional extra (harness[train])
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules), bias="none"
    )


def apply_lora(model: torch.nn.Module, cfg: LoraConfig) -> PeftModel:
    """The policy LM with LoRA adapters (a ``peft`` model); base weights frozen."""
    # deferred: optional extra (harness[train])
    from peft import get_peft_model

    c = peft_config(cfg)
    c.task_type = "CAUSAL_LM"
    peft_model = get_peft_model(model, c)
    n_train = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in peft_model.parameters())
    logger.info("LoRA r=%d alpha=%d: %d of %d parameters train", cfg.r, cfg.alpha, n_train, n_all)
    return peft_model


def lora_critic(critic: ValueHead, cfg: LoraConfig) -> ValueHead:
    """Inject adapters into a :class:`~training.engine.ValueHead`'s body; body frozen, head trains."""
    # deferred: optional extra (harness[train])
    from peft import inject_adapter_in_model

    inject_adapter_in_model(peft_config(cfg), critic.body)
    for name, p in critic.named_parameters():
        p.requires_grad_("lora_" in name or name.startswith("head."))
    return critic


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(unwrap(model), "disable_adapter") and hasattr(unwrap(model), "get_base_model")


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The plain transformers model inside a peft model (adapter layers still in it)."""
    m = unwrap(model)
    return m.get_base_model() if hasattr(m, "get_base_model") else m


def adapters_disabled(model: torch.nn.Module) -> AbstractContextManager[object]:
    """Context in which the policy computes as its base (the KL reference); a no-op without LoRA."""
    return unwrap(model).disable_adapter() if is_lora(model) else contextlib.nullcontext()


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full weights W + ΔW under the base model's key names, computed beside the training weights
    (nothing is merged in place, so no unmerge rounding creeps into the adapters or the base)."""
    # deferred: optional extra (harness[train])
    from peft.tuners.lora import LoraLayer

    base = base_model(model)
    with _gathered(model, None):
        deltas: dict[str, torch.Tensor] = {}
        for name, mod in base.named_modules():
            if isinstance(mod, LoraLayer) and not mod.disable_adapters:
                for a in mod.active_adapters:
                    if a in mod.lora_A:
                        d = mod.get_delta_weight(a)
                        deltas[name] = deltas[name] + d if name in deltas else d
        out: dict[str, torch.Tensor] = {}
        for k, v in base.state_dict().items():
            if "lora_" in k:
                continue
            out[k.replace(".base_layer.", ".")] = v.detach().clone()
        for name, d in deltas.items():
            w = out[f"{name}.weight"]
            out[f"{name}.weight"] = (w.float() + d.float()).to(w.dtype)
    return out


def save_adapter(model: torch.nn.Module, out: Path) -> Path:
    """peft's adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``), written
    atomically and marked as a harness model folder (a run's cleanup may then remove it)."""
    with atomic_dir(out, kind="model") as tmp:
        unwrap(model).save_pretrained(str(tmp), safe_serialization=True)
    return Path(out)
