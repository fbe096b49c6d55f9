"""``harness train --plan``: per-rank GPU memory of a recipe, from its architecture alone.

Nothing is loaded: the model is built on the ``meta`` device from its config (a local folder's
``config.json``, the hub cache, or one of the architectures shipped in ``training/archs/`` when
the hub is unreachable), which gives the parameter count and the largest layer. The plan is:

- model states per rank by ZeRO stage, with DeepSpeed's own accounting for bf16 (the figures of
  ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_...``, tested against them; see
  :func:`model_states`). Without bf16: fp32 parameters and gradients, Adam m and v. LoRA: frozen
  base weights, states only for the adapters.
- activations of one micro-batch (``micro_batch_size`` rows × the longest sequence), per token
  and layer for a Llama/Qwen block under flash/SDPA attention: 20·h + 8·kv + 8·I bytes in bf16
  (the tensors autograd keeps: RMSNorm's fp32 input, q/k/v after RoPE, the attention output, the
  MLP's gate, up, SiLU and product); with gradient checkpointing only each layer's input
  (2·h bytes) plus one layer recomputed in full;
- the log-prob head: ``logits_chunk_tokens`` × vocab × (dtype + 8 B) with chunking
  (:mod:`training.logprobs`), tokens × vocab × (dtype + 12 B) for the full-logits path;
- the frozen reference model (KL, not LoRA): a full bf16 copy per rank (not partitioned);
- the PPO critic: a second engine of the body (no vocabulary head) with its own optimizer;
- the PRM (dual-granularity with ``step_scorer: prm`` and a path): bf16 weights on local rank 0
  of each node; with ``step_scorer_url`` it is served elsewhere (0 here).

It fits when the total is within the GPU's memory less a reserve (CUDA context, allocator
fragmentation: 2 GiB + 8 %); otherwise the plan names the knob to turn. The SGLang rollout
server is a separate process (its ``mem_fraction_static``) and is not counted.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import compose, load_yaml
from harness.models import EMBEDDED_ALIASES, cache_root
from training.config import TrainConfig
from training.stages import Stage, load_chain

logger = logging.getLogger(__name__)

GiB = 2**30
ARCH_DIR = Path(__file__).with_name("archs")
PROMPT_TOKENS = 512  # a rollout's prompt before its max_total_tokens (instruction + question)


# ---- architectures ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    """What the plan needs of a model: sizes from its config, counts from a meta-device build."""

    name: str
    source: str  # where the config came from
    hidden: int
    intermediate: int
    layers: int
    kv_dim: int  # key/value width: kv heads × head dim
    vocab: int
    params: int
    head_params: int  # the untied vocabulary head (0 when tied to the embeddings)
    largest_layer: int  # most parameters directly in one module (DeepSpeed's largest_layer_params)
    lora_per_r: int  # LoRA parameters per unit of rank over the default target modules


def shipped_archs() -> dict[str, Path]:
    """Hub id or short name → shipped config JSON."""
    out: dict[str, Path] = {}
    for f in sorted(ARCH_DIR.glob("*.json")):
        out[f.stem] = f
        for hub in json.loads(f.read_text()).get("_hub_ids", []):
            out[hub] = f
    return out


def _config_of(path: str) -> tuple[Any, str]:
    """A transformers config for ``path``: a local folder, the hub cache, a shipped file, the hub."""
    # deferred: transformers costs ~0.8 s at import
    from transformers import AutoConfig

    local = Path(path).expanduser()
    if path.endswith(".json") and local.is_file():
        return _from_json(local), str(local)
    if (local / "config.json").is_file():
        return AutoConfig.from_pretrained(str(local)), str(local / "config.json")
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True), f"hub cache ({path})"
    except (OSError, ValueError):
        pass
    shipped = shipped_archs().get(path)
    if shipped is not None:
        return _from_json(shipped), f"shipped {shipped.name}"
    try:
        return AutoConfig.from_pretrained(path), f"hub ({path})"
    except (OSError, ValueError) as e:
        known = ", ".join(sorted(k for k in shipped_archs() if "/" not in k))
        raise FileNotFoundError(
            f"no model config for {path!r} (not a folder, not in the hub cache, hub unreachable: "
            f"{type(e).__name__}); pass --arch with one of: {known}, or a config.json"
        ) from e


def _from_json(f: Path) -> Any:
    # deferred: transformers costs ~0.8 s at import
    from transformers import AutoConfig

    raw = {k: v for k, v in json.loads(f.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def arch_of(path: str, tiny: dict[str, Any] | None = None) -> Arch:
    """The :class:`Arch` of ``model.path`` (or of ``model.tiny``), built on the meta device."""
    # deferred: torch costs ~1.4 s at import
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if tiny is not None:
        # deferred: training.engine imports torch (~1.4 s)
        from training.engine import TINY_DEFAULTS

        config, source = LlamaConfig(vocab_size=260, **{**TINY_DEFAULTS, **tiny}), "model.tiny"
    else:
        config, source = _config_of(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    h, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    inter = config.intermediate_size
    q_out = heads * head_dim
    # LoRA A (in × r) + B (r × out) per target: q, k, v, o, gate, up, down.
    per_layer = (h + q_out) + 2 * (h + kv) + (q_out + h) + 2 * (h + inter) + (inter + h)
    return Arch(
        name=path if tiny is None else "tiny",
        source=source,
        hidden=h,
        intermediate=inter,
        layers=config.num_hidden_layers,
        kv_dim=kv,
        vocab=config.vocab_size,
        params=params,
        head_params=0 if tied or head is None else head.weight.numel(),
        largest_layer=largest,
        lora_per_r=per_layer * config.num_hidden_layers,
    )


# ---- the arithmetic ---------------------------------------------------------------------------
def model_states(
    params: int, trainable: int, largest_layer: int, zero_stage: int, gpus: int, bf16: bool
) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer states (see the module docstring).

    bf16 follows DeepSpeed's estimators term by term: stage 2 = 2·P + 18·P/N (bf16 grads, fp32
    grads, fp32 master, Adam m and v all partitioned), stage 3 = 4·largest + 18·P/N (bf16 params
    partitioned; the bf16 grads reduce-scatter into the fp32 partition). Stage 1 partitions the
    fp32 states only; stage 0 partitions nothing."""
    n = max(1, gpus)
    if bf16:
        p = 2 * params / n + 4 * largest_layer if zero_stage == 3 else 2 * params
        g = {0: 6 * trainable, 1: 2 * trainable + 4 * trainable / n, 2: 6 * trainable / n, 3: 4 * trainable / n}
        o = 12 * trainable / n if zero_stage >= 1 else 12 * trainable
        return {"parameters": p, "gradients": g[zero_stage], "optimizer states": o}
    p = 4 * params / n + 4 * largest_layer if zero_stage == 3 else 4 * params
    g = 4 * trainable / n if zero_stage >= 2 else 4 * trainable
    o = 8 * trainable / n if zero_stage >= 1 else 8 * trainable
    return {"parameters": p, "gradients": g, "optimizer states": o}


def activation_bytes(arch: Arch, tokens: int, dtype_bytes: int, checkpointing: bool) -> float:
    """Activations autograd keeps for one micro-batch of ``tokens`` tokens (see the module docstring)."""
    scale = dtype_bytes / 2  # the per-token counts are for bf16
    layer = scale * (20 * arch.hidden + 8 * arch.kv_dim + 8 * arch.intermediate) * tokens
    if checkpointing:
        return arch.layers * dtype_bytes * arch.hidden * tokens + layer
    return arch.layers * layer + dtype_bytes * arch.hidden * tokens  # + the final norm's output


def logits_bytes(arch: Arch, tokens: int, dtype_bytes: int, chunk: int) -> float:
    """The log-prob head's peak: one chunk (chunked) or every position (full logits)."""
    if chunk > 0:
        return min(chunk, tokens) * arch.vocab * (dtype_bytes + 8)
    return tokens * arch.vocab * (dtype_bytes + 12)


@dataclass
class Plan:
    """One recipe's per-rank plan (bytes), the step's tokens, and the verdict."""

    recipe: str
    arch: Arch
    gpus: int
    gpu_mem: float
    micro_batch: int
    seq_len: int
    tokens_per_step: int
    parts: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    max_micro_batch: int = 0  # the largest micro-batch that fits (0: none)
    knob: str = ""

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def usable(self) -> float:
        return usable_bytes(self.gpu_mem)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable


def usable_bytes(gpu_mem_gb: float) -> float:
    """What the plan may fill: the GPU's memory less 2 GiB and 8 % (context, fragmentation)."""
    return gpu_mem_gb * GiB * 0.92 - 2 * GiB


def _seq_len(cfg: TrainConfig) -> int:
    kind = cfg.algo.kind
    if kind == "prm":
        return cfg.prm.max_len or 4096
    if kind == "sft":
        return cfg.algo.max_len or 4096
    total = cfg.rollout.agent.max_total_tokens + PROMPT_TOKENS
    return min(total, cfg.algo.max_len) if cfg.algo.max_len else total


def _tokens_per_step(cfg: TrainConfig, seq: int) -> int:
    kind = cfg.algo.kind
    if kind == "sft":
        return cfg.sft.batch_size * seq
    if kind == "prm":
        return cfg.prm.batch_size * (2 if cfg.prm.loss == "pairwise" else 1) * seq
    return cfg.rollout.prompts_per_step * cfg.rollout.n_samples * seq


def _parts(cfg: TrainConfig, arch: Arch, prm: Arch | None, gpus: int, mb: int, seq: int) -> dict[str, float]:
    o, m, a = cfg.optim, cfg.model, cfg.algo
    bf16 = o.bf16 or m.dtype == "bfloat16"
    b = 2 if bf16 else 4
    lora = m.lora
    trainable = arch.lora_per_r * lora.r if lora is not None else arch.params
    ms = model_states(arch.params, trainable, arch.largest_layer, o.zero_stage, gpus, bf16)
    parts = {f"policy {k}": v for k, v in ms.items()}
    rows = mb * (2 if a.kind == "prm" and cfg.prm.loss == "pairwise" else 1)
    tokens = rows * seq
    parts["activations"] = activation_bytes(arch, tokens, b, m.gradient_checkpointing)
    if a.kind in ("rl", "sft"):
        parts["logits chunk"] = logits_bytes(arch, tokens, b, m.logits_chunk_tokens)
    if a.kind == "rl" and a.kl_coef > 0 and lora is None:
        parts["reference model"] = b * arch.params  # frozen_copy: a full copy per rank
    if a.kind == "rl" and a.advantage == "gae":
        body = arch.params - arch.head_params
        c_train = arch.lora_per_r * lora.r if lora is not None else body
        cs = model_states(body, c_train, arch.largest_layer, o.zero_stage, gpus, bf16)
        parts["critic model states"] = sum(cs.values())
    if prm is not None:
        parts["PRM (local rank 0)"] = 2 * prm.params  # bf16 on the policy's device
    return parts


def plan(cfg: TrainConfig, gpus: int = 8, gpu_mem_gb: float = 80.0, arch: str | None = None, recipe: str = "") -> Plan:
    """The per-rank plan of ``cfg`` on ``gpus`` GPUs of ``gpu_mem_gb`` GB (see the module docstring)."""
    a = cfg.algo
    arch_path = arch or resolve_model_path(cfg.model.path)
    model = arch_of(arch_path, cfg.model.tiny if arch is None else None)
    prm = None
    notes: list[str] = []
    if a.kind == "rl" and a.advantage == "dual_granularity" and a.step_scorer == "prm":
        if a.step_scorer_url:
            notes.append(f"PRM served at {a.step_scorer_url}: not on these GPUs")
        else:
            src = a.step_scorer_path
            prm = arch_of(src) if src and Path(src, "config.json").is_file() else model
            if prm is model:
                notes.append("PRM architecture taken as the policy's (ProRAG trains it from the SFT model)")
    if a.kind == "retriever":
        notes.append("retriever RL: the generator is frozen (inference only); the query tower is small")
    seq = _seq_len(cfg)
    mb = cfg.optim.micro_batch_size
    p = Plan(recipe, model, gpus, gpu_mem_gb, mb, seq, _tokens_per_step(cfg, seq), notes=notes)
    if a.kind == "retriever":
        p.parts = {"generator (inference, bf16)": 2 * model.params}
        p.max_micro_batch = mb
        return p
    p.parts = _parts(cfg, model, prm, gpus, mb, seq)
    usable = usable_bytes(gpu_mem_gb)
    p.max_micro_batch = max(
        (k for k in range(1, 257) if sum(_parts(cfg, model, prm, gpus, k, seq).values()) <= usable), default=0
    )
    p.knob = _knob(cfg, p, model, prm, gpus)
    return p


def _knob(cfg: TrainConfig, p: Plan, model: Arch, prm: Arch | None, gpus: int) -> str:
    """The settings that make it fit, turned in the order that costs least: a smaller
    micro-batch (gradient accumulation keeps the batch), gradient checkpointing, chunked
    logits, a higher ZeRO stage, each with the largest micro-batch that then fits."""
    if p.fits:
        return ""
    if p.max_micro_batch >= 1:
        return f"optim.micro_batch_size={p.max_micro_batch} (gradient accumulation keeps the batch)"
    usable, seq = usable_bytes(p.gpu_mem), p.seq_len
    steps: list[tuple[str, str, dict[str, Any]]] = []
    if not cfg.model.gradient_checkpointing:
        steps.append(("model.gradient_checkpointing=true", "model", {"gradient_checkpointing": True}))
    if cfg.model.logits_chunk_tokens == 0:
        steps.append(("model.logits_chunk_tokens=1024", "model", {"logits_chunk_tokens": 1024}))
    for stage in range(cfg.optim.zero_stage + 1, 4):
        steps.append((f"optim.zero_stage={stage}", "optim", {"zero_stage": stage}))
    turned: list[str] = []
    for text, section, change in steps:
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **change)})
        if text.startswith("optim.zero_stage") and turned and turned[-1].startswith("optim.zero_stage"):
            turned[-1] = text
        else:
            turned.append(text)
        best = max(
            (k for k in range(1, 257) if sum(_parts(cfg, model, prm, gpus, k, seq).values()) <= usable), default=0
        )
        if best:
            return " ".join(turned + [f"optim.micro_batch_size={best}"])
    return "more GPUs or LoRA: even one row per micro-batch with every saving on does not fit"


def resolve_model_path(path: str) -> str:
    """``model.path`` as the planner reads it: the embedded model's cached folder if converted,
    else its shipped architecture (converting it would load weights)."""
    if path in EMBEDDED_ALIASES:
        cached = cache_root() / "models" / EMBEDDED_ALIASES[0]
        return str(cached) if (cached / "config.json").is_file() else path
    return path


# ---- text ---------------------------------------------------------------------------------------
def format_plan(p: Plan) -> str:
    """The plan as the CLI prints it."""
    a = p.arch
    gb = lambda x: f"{x / GiB:7.2f} GiB"  # noqa: E731
    lines = [
        f"{p.recipe or 'recipe'}: {a.name} ({a.params / 1e9:.2f} B parameters; config: {a.source})",
        f"  {p.gpus} GPU(s) × {p.gpu_mem:g} GB; micro-batch {p.micro_batch} × {p.seq_len} tokens; "
        f"tokens per step ≤ {p.tokens_per_step:,} ({p.tokens_per_step // max(1, p.gpus):,} per rank)",
    ]
    for k, v in p.parts.items():
        lines.append(f"  {k:<28} {gb(v)}")
    lines.append(f"  {'total per rank':<28} {gb(p.total)}   usable {gb(p.usable)}")
    for n in p.notes:
        lines.append(f"  note: {n}")
    if p.fits:
        lines.append(f"  FITS; largest micro-batch that fits: {p.max_micro_batch}")
    else:
        lines.append(f"  DOES NOT FIT; turn: {p.knob}")
    return "\n".join(lines)


def plan_report(plans: list[Plan], recipe: str) -> str:
    """What ``harness train --plan`` prints: the plans :func:`plan_recipe` made of ``recipe`` as text."""
    if not plans:
        return f"{recipe}: not a training recipe (an eval, MCTS or sampling config trains nothing): nothing to plan"
    return "\n\n".join(format_plan(p) for p in plans)


def plan_recipe(
    files: list[str],
    overrides: list[str] | None = None,
    gpus: int = 8,
    gpu_mem_gb: float = 80.0,
    arch: str | None = None,
) -> list[Plan]:
    """Plans for a recipe file: a training recipe gives one; a stage chain one per ``train``
    stage (its model path from the stage that produces it); an eval or MCTS config none (they
    train nothing). The CLI's ``--plan``."""
    first = Path(files[0])
    raw = load_yaml(first)
    if "stages" in raw:
        return _plan_chain(first, gpus, gpu_mem_gb, arch)
    if not _is_train_recipe(raw):
        logger.info("%s is not a training recipe (no algo/optim/model keys): nothing to plan", first)
        return []
    cfg = compose(TrainConfig, [str(f) for f in files], list(overrides or []))
    path = arch or _produced_by(cfg.model.path)
    return [plan(cfg, gpus, gpu_mem_gb, path if path != cfg.model.path else None, str(first))]


def _is_train_recipe(raw: dict[str, Any]) -> bool:
    return any(k in raw for k in ("algo", "optim", "model", "trainer"))


def _produced_by(path: str, depth: int = 0) -> str:
    """A ``model.path`` that an earlier recipe writes (``RUN/final``, a chain stage's output) is
    traced back to the architecture that recipe starts from: through the shipped recipes' run
    folders (``trainer.out/name``, or ``trainer.out`` itself: the demo's recipes name the folders
    ``harness demo`` trains into) and the shipped chains' train stages."""
    if Path(path).expanduser().exists() or depth > 5 or not path.startswith("runs/"):
        return path
    run = str(Path(path).parent if Path(path).name == "final" else Path(path))
    for f in sorted((ARCH_DIR.parents[1] / "configs" / "train").rglob("*.yaml")):
        raw = load_yaml(f)
        if "stages" in raw:
            for st in load_chain(f).stages:
                if st.output == run and st.command == ("train",) and st.config:
                    return _produced_by(_stage_config(st).model.path, depth + 1)
        elif _is_train_recipe(raw):
            cfg = compose(TrainConfig, [str(f)], [])
            # trainer.out/name is the default run folder; trainer.out itself when run with --out trainer.out
            if run in (str(Path(cfg.trainer.out) / cfg.name), str(Path(cfg.trainer.out))):
                return _produced_by(cfg.model.path, depth + 1)
    return path


# Overrides that name training data, not the model's size: left out of a stage's plan, since the
# data a chain's earlier stage writes does not exist when the chain is planned.
_DATA_KEYS = ("sft.sources", "prm.data")


def _stage_config(stage: Stage, *, model_path: bool = True) -> TrainConfig:
    """A ``train`` stage's recipe through the config loader: its config files and its overrides,
    less the data ones (and less ``model.path=`` when not ``model_path``)."""
    skip = _DATA_KEYS if model_path else (*_DATA_KEYS, "model.path=")
    return compose(TrainConfig, list(stage.config), [x for x in stage.set if not x.startswith(skip)])


def _plan_chain(chain_file: Path, gpus: int, gpu_mem_gb: float, arch: str | None) -> list[Plan]:
    out = []
    for st in load_chain(chain_file).stages:
        if st.command != ("train",) or not st.config:
            continue
        base = _stage_config(st, model_path=False)  # the recipe's own model, sized by the one it trains
        path = arch or _produced_by(_stage_config(st).model.path)
        out.append(plan(base, gpus, gpu_mem_gb, path if path != base.model.path else None, f"{chain_file}:{st.name}"))
    return out
