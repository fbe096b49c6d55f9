"""The DeepSpeed engine: the policy, an optional critic (PPO) and an optional frozen reference (KL).

Runs as one process on CPU (``DS_ACCELERATOR=cpu``, gloo) and under the ``deepspeed`` or
``torchrun`` launchers (their RANK/WORLD_SIZE/... win over our single-process defaults). On CPU,
DeepSpeed's first ``initialize`` compiles a shared-memory communication op for minutes;
:func:`setup_distributed_env` replaces that builder with a no-op (the op only speeds up
intra-node all-reduce) and we pass a ``torch.optim.AdamW`` ourselves (DeepSpeed's own CPU Adam
also compiles). No optimizer offload (another 5-minute compile). REFERENCE §6.

What the engine owns: ZeRO stage 0–3, bf16 or fp32, gradient accumulation (DeepSpeed counts
micro-batches and steps the optimizer on the boundary), gradient clipping, AdamW (``optim.betas``,
``optim.weight_decay``) and verl's linear-warmup learning-rate schedule over training steps.
Helpers gather full weights under ZeRO-3 (for weight sync and export) and load them back (resume).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import logging
import os
import socket
import sys
from typing import Any

import torch

from training.config import ModelConfig, OptimConfig

logger = logging.getLogger(__name__)

TINY_DEFAULTS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


def setup_distributed_env() -> None:
    """Single-process defaults for the env DeepSpeed reads; launchers' values win."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        # A free port, not a fixed one: several single-process runs (and tests) share a machine.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    importlib.import_module("deepspeed.comm.torch")
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        # The shm all-reduce op is an optimisation; building it costs ~2 minutes of compiling.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None


def rank_and_world() -> tuple[int, int]:
    """This process's data-parallel rank and the world size (1 outside a launcher)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def end_distributed() -> None:
    """Tear down the process groups of a rank whose training ended well: a barrier (every rank is
    past its last collective), then ``destroy_process_group``.

    Without it gloo's worker threads are still running when the interpreter exits, and a rank that
    finished can die of SIGABRT ("terminate called without an active exception",
    pytorch/pytorch#190489), so the launcher reports a failed run. Call it last: DeepSpeed keeps
    its groups cached, so the process cannot train again afterwards. Not on an error path: a rank
    that failed must not wait in the barrier for the others (the launcher stops them)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def build_model(cfg: ModelConfig, vocab_size: int | None = None) -> Any:
    """The policy LM: a tiny random Llama from a config (tests, offline) or weights (safetensors only)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, cfg.dtype)
    attn = check_attn_implementation(cfg.attn_implementation)
    if cfg.tiny is not None:
        config = LlamaConfig(vocab_size=vocab_size, **{**TINY_DEFAULTS, **cfg.tiny})
        config._attn_implementation = attn
        model = LlamaForCausalLM(config).to(dtype)
    else:
        from harness.models import resolve_model

        model = AutoModelForCausalLM.from_pretrained(
            resolve_model(cfg.path), dtype=dtype, use_safetensors=True, attn_implementation=attn
        )
    # from_pretrained returns the model in eval mode, and HF applies gradient checkpointing only
    # in training mode: without this the option would silently do nothing on real weights.
    model.train()
    if cfg.gradient_checkpointing:
        # Non-reentrant: works with frozen inputs (LoRA's frozen embeddings) and under no_grad.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x's name (the old one warns)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False  # a KV cache is useless in training and clashes with checkpointing
    return model


def check_attn_implementation(name: str) -> str:
    """``sdpa`` / ``eager`` anywhere; ``flash_attention_2`` only with flash-attn and CUDA (clear error)."""
    if name in ("sdpa", "eager"):
        return name
    if name == "flash_attention_2":
        if importlib.util.find_spec("flash_attn") is None:
            raise ValueError(
                "model.attn_implementation=flash_attention_2 needs the flash-attn package (pip install flash-attn)"
            )
        if not torch.cuda.is_available():
            raise ValueError("model.attn_implementation=flash_attention_2 needs a CUDA GPU; use sdpa on CPU")
        return name
    raise ValueError(f"unknown model.attn_implementation {name!r}; use sdpa, eager or flash_attention_2")


def engine_device(engine: Any) -> torch.device:
    """The device a DeepSpeed engine (or a plain module) computes on."""
    dev = getattr(engine, "device", None)
    if dev is not None:
        return torch.device(dev)
    return next(unwrap(engine).parameters()).device


def autocast(device: torch.device, bf16: bool) -> Any:
    """bf16 autocast for forwards DeepSpeed does not manage (the frozen reference) on CUDA; a no-op
    elsewhere (CPU runs stay fp32, the tested default)."""
    if bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class ValueHead(torch.nn.Module):
    """A scalar value on top of features: the project's one value head.

    ``ValueHead(lm)``: the PPO critic and the PRM: the same LM architecture's body with a linear
    scalar head instead of the vocabulary; ``forward(input_ids, attention_mask)`` [B, L] → [B, L].

    ``ValueHead(dim=H, hidden=N)``: no body; an MLP (Linear, Tanh, Linear) on features it is given,
    read detached: retriever RL's V(s_t) on the query tower's embedding of the retrieval state,
    where the value loss trains the head only and the tower moves by the policy gradient alone;
    ``forward(features)`` [N, H] → [N].
    """

    def __init__(self, lm: Any = None, *, dim: int | None = None, hidden: int = 256) -> None:
        super().__init__()
        if lm is not None:
            self.config = lm.config
            self.body = lm.model if hasattr(lm, "model") else lm
            self.head: torch.nn.Module = torch.nn.Linear(lm.config.hidden_size, 1)
            return
        if dim is None:
            raise ValueError("ValueHead needs an LM (its body) or the size `dim` of the features it reads")
        self.body = None
        self.head = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.body is None:  # input_ids are features [N, H]
            return self.head(input_ids.detach().float()).squeeze(-1)  # [N]
        h = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, L, H]
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1)  # [B, L]


def ds_config(cfg: OptimConfig, batch_size: int, lr: float) -> dict[str, Any]:
    """The DeepSpeed config for one optimisation step over ``batch_size`` rows (all ranks together):
    the trainer passes one MINI-batch (``algo.ppo_mini_batch_size``), so DeepSpeed's accumulation
    boundary falls at the end of each mini-batch's micro-batches."""
    _, world = rank_and_world()
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        # One optimizer step per mini-batch: its rows on this rank are split into micro-batches.
        "gradient_accumulation_steps": max(1, -(-batch_size // (cfg.micro_batch_size * world))),
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": cfg.bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    return config


def initialize(
    model: Any,
    cfg: OptimConfig,
    lr: float,
    batch_size: int,
    warmup_steps: int | None = None,
    updates_per_step: int = 1,
) -> Any:
    """Wrap ``model`` in a DeepSpeed engine with our own AdamW (see the module docstring).

    ``warmup_steps`` (default ``cfg.warmup_steps``) counts TRAINING steps, each of which makes
    ``updates_per_step`` optimizer steps (RL: ppo_epochs × mini-batches; SFT, PRM: 1); see
    :func:`warmup_schedule`."""
    import deepspeed

    setup_distributed_env()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=opt,
        config=ds_config(cfg, batch_size, lr),
        lr_scheduler=warmup_schedule(cfg.warmup_steps if warmup_steps is None else warmup_steps, updates_per_step),
    )
    return engine


def warmup_factor(step: int, warmup_steps: int) -> float:
    """verl's ``get_constant_schedule_with_warmup``: training step ``step`` (0-based) runs at
    ``lr · step / warmup_steps`` until ``warmup_steps``, then at ``lr``. The first step of a warmup
    thus runs at LR 0, as in verl (and HF's schedules)."""
    return step / warmup_steps if step < warmup_steps else 1.0


def warmup_schedule(warmup_steps: int, updates_per_step: int = 1) -> Any:
    """Linear warmup to the full LR over ``warmup_steps`` TRAINING steps, then constant; None
    without warmup. verl steps its scheduler once per training step (after ``update_actor``),
    however many mini-batch optimizer steps that made; DeepSpeed steps ours at every optimizer
    step, so the factor reads the training step as ``optimizer steps // updates_per_step`` and moves
    once per training step exactly as verl's. Checkpoints carry its state."""
    if warmup_steps <= 0:
        return None
    if updates_per_step < 1:
        raise ValueError(f"updates_per_step must be >= 1, got {updates_per_step}")

    def factory(optimizer: Any) -> Any:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: warmup_factor(s // updates_per_step, warmup_steps)
        )

    return factory


def frozen_copy(model: Any) -> Any:
    """A frozen reference model for KL (a deep copy taken before any update; no grad, eval mode)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def unwrap(engine: Any) -> Any:
    """The ``nn.Module`` inside a DeepSpeed engine (or the module itself)."""
    return engine.module if hasattr(engine, "module") else engine


def _gathered(engine: Any, modifier_rank: int | None) -> Any:
    """Under ZeRO-3 parameters are partitioned: gather them for the duration of the block."""
    if getattr(engine, "zero_optimization_stage", lambda: 0)() == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(unwrap(engine).parameters()), modifier_rank=modifier_rank)
    return contextlib.nullcontext()


def full_state_dict(engine: Any) -> dict[str, torch.Tensor]:
    """Full (gathered, detached, cloned) weights, for weight sync, checkpoints and export."""
    with _gathered(engine, None):
        return {k: v.detach().clone() for k, v in unwrap(engine).state_dict().items()}


def load_full_state_dict(engine: Any, state: dict[str, torch.Tensor]) -> None:
    """Load full weights into the engine's module (gathering and re-partitioning under ZeRO-3).

    Tied embeddings are saved once (safetensors refuses shared storage), hence ``strict=False``
    on ``lm_head`` and the re-tie after loading; any other missing key is an error.
    """
    module = unwrap(engine)
    with _gathered(engine, 0), torch.no_grad():
        missing, unexpected = module.load_state_dict(state, strict=False)
        if hasattr(module, "tie_weights"):
            module.tie_weights()
    real_missing = [k for k in missing if "lm_head" not in k]
    if real_missing or unexpected:
        raise RuntimeError(
            f"checkpoint does not fit the model: missing {real_missing[:5]}, unexpected {unexpected[:5]}"
        )


def optimizer_step(engine: Any) -> float | None:
    """``engine.step()``; returns the global gradient norm (before clipping) when this micro-step
    was an accumulation boundary (the optimizer stepped), else None.

    ZeRO stages report the norm they clipped with; stage 0 without bf16 does not, so it is
    computed here from the (already all-reduced) gradients before they are cleared.
    """
    boundary = engine.is_gradient_accumulation_boundary()
    manual = None
    if boundary and engine.zero_optimization_stage() == 0:
        norms = [p.grad.detach().float().norm() for p in unwrap(engine).parameters() if p.grad is not None]
        manual = float(torch.norm(torch.stack(norms))) if norms else 0.0
    engine.step()
    if not boundary:
        return None
    reported = engine.get_global_grad_norm()
    return float(reported) if reported is not None else manual
