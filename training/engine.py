"""The DeepSpeed engine: the policy, an optional critic (PPO) and an optional frozen reference (KL).

Runs as one process on CPU (``DS_ACCELERATOR=cpu``, gloo) and under the ``deepspeed`` or
``torchrun`` launchers (their RANK/WORLD_SIZE/... win over our single-process defaults). On CPU,
DeepSpeed's first ``initialize`` compiles a shared-memory communication op for minutes;
:func:`setup_distributed_env` replaces that builder with a no-op (the op only speeds up
intra-node all-reduce) and we pass a ``torch.optim.AdamW`` ourselves (DeepSpeed's own CPU Adam
also compiles). No optimizer offload (another 5-minute compile). REFERENCE §6.

What the engine owns: ZeRO stage 0–3, bf16 or fp32, gradient accumulation (DeepSpeed counts
micro-batches and steps the optimizer on the boundary), gradient clipping, AdamW (``optim.betas``,
``optim.weight_decay``, fused or not: ``optim.fused``) and the learning-rate schedule
(``optim.schedule``, :data:`LR_SCHEDULES`) after a linear warmup, counted in training or optimizer
steps (``optim.schedule_unit``).
Helpers gather full weights under ZeRO-3 (for weight sync and export) and load them back (resume).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import importlib
import importlib.util
import logging
import math
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from harness.models import resolve_model
from harness.ports import free_port
from harness.registry import Registry
from training.config import ModelConfig, OptimConfig

if TYPE_CHECKING:  # deferred at run time: optional extras, ~1 s of imports
    from deepspeed import DeepSpeedEngine
    from transformers import PreTrainedModel

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
        os.environ["MASTER_PORT"] = str(free_port())
    importlib.import_module("deepspeed.comm.torch")
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        # The shm all-reduce op is an optimisation; building it costs ~2 minutes of compiling.
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    if os.environ["WORLD_SIZE"] == "1" and not torch.distributed.is_initialized():
        # A world of one needs no rendezvous: an in-memory store instead of the TCPStore that
        # env:// opens (torch binds its server on every interface, not MASTER_ADDR). DeepSpeed
        # finds the group initialised and uses it.
        torch.distributed.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo", store=torch.distributed.HashStore(), rank=0, world_size=1
        )


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


def _end_single_process_group() -> None:
    """The exit hook :func:`initialize` registers: a single-process run keeps its process group for
    the next training in the same process (the demo trains SFT then RL), and at interpreter exit
    gloo's threads would still be running, which can abort a run that finished well ("terminate
    called without an active exception", exit 134) as :func:`end_distributed` describes for
    launched ranks. A launched rank ends its group itself (no barrier here: a failed rank's peers
    may be gone)."""
    if rank_and_world()[1] == 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def build_model(cfg: ModelConfig, vocab_size: int | None = None) -> PreTrainedModel:
    """The policy LM: a tiny random Llama from a config (tests, offline) or weights (safetensors only)."""
    # deferred: transformers costs ~0.8 s at import
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, cfg.dtype)
    attn = check_attn_implementation(cfg.attn_implementation)
    if cfg.tiny is not None:
        config = LlamaConfig(vocab_size=vocab_size, **{**TINY_DEFAULTS, **cfg.tiny})
        config._attn_implementation = attn
        model = LlamaForCausalLM(config).to(dtype)
    else:
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


def engine_device(engine: torch.nn.Module) -> torch.device:
    """The device a DeepSpeed engine (or a plain module) computes on."""
    dev = getattr(engine, "device", None)
    if dev is not None:
        return torch.device(dev)
    return next(unwrap(engine).parameters()).device


def autocast(device: torch.device, bf16: bool) -> AbstractContextManager[object]:
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


def ds_config(cfg: OptimConfig, batch_size: int, lr: float) -> dict[str, object]:
    """The DeepSpeed config for one optimisation step over ``batch_size`` rows (all ranks together):
    the trainer passes one MINI-batch (``algo.ppo_mini_batch_size``), so DeepSpeed's accumulation
    boundary falls at the end of each mini-batch's micro-batches."""
    _, world = rank_and_world()
    config: dict[str, object] = {
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
    model: torch.nn.Module,
    cfg: OptimConfig,
    lr: float,
    batch_size: int,
    warmup_steps: int | None = None,
    updates_per_step: int = 1,
    max_steps: int | None = None,
) -> DeepSpeedEngine:
    """Wrap ``model`` in a DeepSpeed engine with our own AdamW (see the module docstring).

    The LR follows ``cfg.schedule`` after ``warmup_steps`` (default ``cfg.warmup_steps``) over a
    run of ``max_steps`` training steps, each of which makes ``updates_per_step`` optimizer steps
    (RL: ppo_epochs × mini-batches; SFT, PRM: 1); see :func:`lr_schedule`."""
    # deferred: optional extra (harness[train])
    import deepspeed

    setup_distributed_env()
    atexit.unregister(_end_single_process_group)  # registered once (this drops an earlier registration)
    atexit.register(_end_single_process_group)
    params = [p for p in model.parameters() if p.requires_grad]
    # DeepSpeed wraps the optimizer for bf16 and ZeRO, and those wrappers skip a non-finite step;
    # the plain fp32 stage-0 case steps ours directly, so ours must skip it (training.divergence).
    plain = cfg.zero_stage == 0 and not cfg.bf16
    opt = (FiniteAdamW if plain else torch.optim.AdamW)(
        params, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, **adamw_kernel(cfg.fused)
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=opt,
        config=ds_config(cfg, batch_size, lr),
        lr_scheduler=lr_schedule(cfg, warmup_steps, updates_per_step, max_steps),
    )
    return engine


def adamw_kernel(fused: bool) -> dict[str, bool]:
    """AdamW's implementation for ``optim.fused``: torch's fused kernel (one pass over every
    parameter; the same update, summed in another order) or its per-parameter loop (the CPU's
    default). On this project's 2-core CPU an optimizer step of SmolLM2-135M took 0.41 s fused
    against 5.4 s in the loop (scripts/perf/adamw_step.py, one thread)."""
    return {"fused": True} if fused else {"foreach": False}


class FiniteAdamW(torch.optim.AdamW):
    """AdamW that skips a step whose gradients are not all finite, as DeepSpeed's own optimizer
    wrappers do: the gradients are dropped, no weight or moment changes, and ``overflow`` is set,
    which the DeepSpeed engine reads to leave the LR schedule where it is and count the step in
    ``skipped_steps`` (``engine.was_step_applied()`` is then False)."""

    overflow = False

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        self.overflow = bool(grads) and not bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))
        if self.overflow:
            self.zero_grad(set_to_none=True)
            return None
        return super().step(closure)


# ---- LR schedules -----------------------------------------------------------------------------
# Every schedule is ``fn(progress, min_ratio) -> factor``: the LR multiplier after the warmup, at
# ``progress`` = (step − warmup) / (total − warmup) in [0, 1], ``min_ratio`` its floor.
ScheduleFn = Callable[[float, float], float]
LR_SCHEDULES: Registry[ScheduleFn] = Registry("LR schedule")


@LR_SCHEDULES.register("constant")
def constant_lr(progress: float, min_ratio: float) -> float:
    """1: the full LR (verl's ``get_constant_schedule_with_warmup``, HF's ``constant_with_warmup``)."""
    return 1.0


@LR_SCHEDULES.register("linear")
def linear_lr(progress: float, min_ratio: float) -> float:
    """A straight line from 1 to ``min_ratio``; with 0 it is HF's ``get_linear_schedule_with_warmup``
    (the ``linear`` default of TrainingArguments): (total − step) / (total − warmup)."""
    return min_ratio + (1.0 - min_ratio) * (1.0 - progress)


@LR_SCHEDULES.register("cosine")
def cosine_lr(progress: float, min_ratio: float) -> float:
    """Half a cosine from 1 to ``min_ratio``: verl's ``get_cosine_schedule_with_warmup(min_lr_ratio)``
    and HF's ``cosine_with_min_lr`` (``min_lr_rate``; OpenRLHF passes min_lr = 0.1 × lr)."""
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_factor(schedule: str, step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """The LR multiplier at ``step`` (0-based): ``step / warmup_steps`` during the warmup (the first
    step runs at LR 0, as in verl and HF), then the registered ``schedule`` at progress
    (step − warmup) / max(1, total − warmup), held at its end value past ``total_steps``."""
    if step < warmup_steps:
        return step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return LR_SCHEDULES.get(schedule)(progress, min_ratio)


def lr_schedule(
    cfg: OptimConfig, warmup_steps: int | None = None, updates_per_step: int = 1, max_steps: int | None = None
) -> Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LambdaLR] | None:
    """DeepSpeed's ``lr_scheduler`` factory for ``cfg.schedule`` after ``warmup_steps`` (default
    ``cfg.warmup_steps``), or None when the LR never moves (constant, no warmup).

    DeepSpeed steps it after every optimizer step, and one training step makes ``updates_per_step``
    of them (RL: ppo_epochs × mini-batches; SFT, PRM: 1). In ``schedule_unit: training_step`` the
    factor reads the training step as ``optimizer steps // updates_per_step``, so it moves once
    per training step as verl's does; in ``optimizer_step`` it reads every optimizer step, as HF's
    Trainer and OpenRLHF do. The decay spans ``cfg.schedule_steps``, else the run: ``max_steps``
    training steps (× ``updates_per_step`` in optimizer steps). Checkpoints carry its state."""
    warmup = cfg.warmup_steps if warmup_steps is None else warmup_steps
    if updates_per_step < 1:
        raise ValueError(f"updates_per_step must be >= 1, got {updates_per_step}")
    if cfg.schedule == "constant" and warmup <= 0:
        return None
    by_training_step = cfg.schedule_unit == "training_step"
    total = cfg.schedule_steps
    if total is None:
        if max_steps is None and cfg.schedule != "constant":
            raise ValueError(
                f"optim.schedule={cfg.schedule} decays over the run: give its max_steps or optim.schedule_steps"
            )
        total = (max_steps or 1) * (1 if by_training_step else updates_per_step)
    per = updates_per_step if by_training_step else 1
    name, floor = cfg.schedule, cfg.min_lr_ratio
    LR_SCHEDULES.get(name)  # an unknown name fails here, not at the first optimizer step

    def factory(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(name, s // per, warmup, total, floor))

    return factory


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen reference model for KL (a deep copy taken before any update; no grad, eval mode)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def unwrap(engine: torch.nn.Module) -> torch.nn.Module:
    """The ``nn.Module`` inside a DeepSpeed engine (or the module itself)."""
    return engine.module if hasattr(engine, "module") else engine


def _gathered(engine: torch.nn.Module, modifier_rank: int | None) -> AbstractContextManager[object]:
    """Under ZeRO-3 parameters are partitioned: gather them for the duration of the block."""
    if getattr(engine, "zero_optimization_stage", lambda: 0)() == 3:
        # deferred: optional extra (harness[train])
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(unwrap(engine).parameters()), modifier_rank=modifier_rank)
    return contextlib.nullcontext()


def full_state_dict(engine: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full (gathered, detached, cloned) weights, for weight sync, checkpoints and export."""
    with _gathered(engine, None):
        return {k: v.detach().clone() for k, v in unwrap(engine).state_dict().items()}


def load_full_state_dict(engine: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
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


def optimizer_step(engine: DeepSpeedEngine) -> float | None:
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
