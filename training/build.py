"""From a :class:`~training.config.TrainConfig` to a trained run: the one training entry.

:data:`TRAINERS` maps ``algo.kind`` to the trainer that runs it (``rl``, ``sft``, ``prm``,
``retriever``); :func:`build_trainer` builds it and :func:`train` runs it (``harness train`` calls
nothing else). For RL the rollout backend and the retriever are built through the same
registries ``harness eval`` uses (``BackendConfig`` / ``RetrieverConfig``), the agent through
``build_method`` (THE search agent), and validation is the eval path itself:
:func:`benchmarks.evaluate.evaluate` on the validation split, greedy, with the trainer's own
backend (the current policy), into ``RUN/validation/step-N/``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from benchmarks.build import dataset_retriever
from harness import safe_delete
from harness.backends import build_backend
from harness.backends.base import Backend
from harness.backends.dtype import choose_dtype
from harness.backends.hf import HFBackend
from harness.backends.vllm_sync import RL_ARGS as VLLM_RL_ARGS
from harness.backends.vllm_sync import RL_ENV as VLLM_RL_ENV
from harness.config import ConfigError, compose, from_dict, pop_paths, to_dict
from harness.engines import ENGINE_LOGS, EngineConfig, engine_for_backend, sigterm_as_exit, start_engine
from harness.fsutil import write_json_atomic
from harness.models import MODEL_FILES
from harness.registry import Registry
from harness.runlock import run_lock
from harness.runlog import RUN_ENTRIES, config_differences
from harness.safe_delete import FILE, OPAQUE, Folder, Layout
from harness.tokenization import byte_tokenizer
from pipelines.methods import AGENT_METHODS, build_method, method_kind, validate_options
from training.config import TrainConfig, check_ranks
from training.examples import merged_corpus_dataset, train_examples
from training.validation import build_validation, rollout_agent_options

logger = logging.getLogger(__name__)


@runtime_checkable
class Trainer(Protocol):
    """What every :data:`TRAINERS` entry builds (torchtune's recipe interface, adapted).

    Building one (its registered factory) checks the recipe and loads data and models, and writes
    nothing. ``step`` runs one training step (the run records open at the first), ``train`` runs to
    ``trainer.max_steps`` and returns the final output; ``save`` writes a checkpoint of the current
    step, ``resume`` continues from a run folder's newest one; ``close`` stops whatever the trainer
    runs in the background. ``step_no``: the steps taken."""

    step_no: int

    def step(self) -> dict[str, float]: ...

    def train(self) -> Path: ...

    def save(self) -> Path: ...

    def resume(self, run_dir: Path) -> None: ...

    def close(self) -> None: ...


def rollout_backend(cfg: TrainConfig) -> Backend:
    """The backend rollouts come from; its weights are synced from the policy after each update.

    It serves the policy, so its model is the policy's, and so is its dtype unless
    ``rollout.backend.dtype`` asks for ``bfloat16``, ``float16`` or ``auto``. ``model.tiny`` (tests,
    offline) builds a random tiny Llama on the byte tokenizer, in process.
    """
    b = cfg.rollout.backend
    # The policy's dtype, unless the rollout backend asks for a lower one (bf16 generation beside
    # an fp32 trainer: algo.rollout_correction weighs the mismatch, mismatch/* measures it).
    dtype = cfg.model.dtype if b.dtype == "float32" else b.dtype
    if cfg.model.tiny is not None:
        # deferred: training.engine imports torch (~1.4 s)
        import torch

        from training.engine import build_model

        if b.kind != "hf":
            raise ValueError(f"model.tiny builds an in-process model: rollout.backend.kind must be hf, not {b.kind!r}")
        tok = byte_tokenizer()
        model = build_model(cfg.model, len(tok)).to(getattr(torch, choose_dtype(dtype)[0]))
        return HFBackend(
            model_obj=model,
            tokenizer=tok,
            max_batch_size=b.max_batch_size,
            prefix_cache_tokens=b.prefix_cache_tokens,
        )
    return build_backend(replace(b, model=cfg.model.path, dtype=dtype, threads=b.threads or cfg.optim.threads))


def _rl_trainer(cfg: TrainConfig, out: Path, backend: Backend | None = None) -> Trainer:
    """``algo.kind: rl``: the search agent's rollouts (through ``build_method``) on the policy."""
    # deferred: training.rl.trainer imports torch (~1.4 s), and so do these
    from training.health import preflight
    from training.rewards import build_reward
    from training.rl.trainer import RLTrainer

    d = cfg.data
    if method_kind(cfg.rollout.method) != "agent":
        raise ValueError(f"rollout.method {cfg.rollout.method!r} is a baseline; RL rolls out an agent dialect")
    if cfg.rollout.method not in AGENT_METHODS:  # the chat-API path returns text, no token ids to train
        raise ValueError(
            f"rollout.method {cfg.rollout.method!r} evaluates only; RL rolls out an agent on tokens: "
            f"one of {', '.join(AGENT_METHODS)}"
        )
    # rollout.agent and rollout.sampling were checked when the recipe loaded; this checks them together
    options = validate_options(cfg.rollout.method, rollout_agent_options(cfg), where="rollout.agent")
    examples = train_examples(cfg)
    retriever = dataset_retriever(cfg.retriever, merged_corpus_dataset(cfg), d.split, d.data_dir)
    backend = backend or rollout_backend(cfg)
    agent = build_method(cfg.rollout.method, backend, retriever, options)
    if cfg.trainer.preflight:  # before the policy is built and anything is written: a broken setup trains nothing
        preflight(agent, examples, build_reward(cfg.algo.reward), agent.config.topk)
    validation = build_validation(cfg, backend, Path(out))
    return RLTrainer(cfg, agent, examples, out, validate=validation)


def _sft_trainer(cfg: TrainConfig, out: Path, backend: Backend | None = None) -> Trainer:
    # deferred: training.sft.sft imports torch (~1.4 s)
    from training.sft.sft import SFTTrainer

    return SFTTrainer(cfg, out)


def _prm_trainer(cfg: TrainConfig, out: Path, backend: Backend | None = None) -> Trainer:
    # deferred: training.prm.prm imports torch (~1.4 s)
    from training.prm.prm import PRMTrainer

    return PRMTrainer(cfg, out)


def _retriever_trainer(cfg: TrainConfig, out: Path, backend: Backend | None = None) -> Trainer:
    # deferred: training.retriever.retriever_rl imports torch (~1.4 s)
    from training.retriever.retriever_rl import RetrieverTrainer

    return RetrieverTrainer(cfg, out, backend)


# algo.kind → ``build(cfg, out, backend) -> Trainer`` (:class:`Trainer`). Info: ``rollout_engine``:
# rolls out through ``rollout.backend`` (which ``launch: true`` starts for the run); ``next``: what
# to do with the final output.
TRAINERS: Registry = Registry("trainer (algo.kind)")
TRAINERS.register("rl", _rl_trainer, rollout_engine=True, next="eval it with harness eval --model {final}")
TRAINERS.register("sft", _sft_trainer, next="eval it with harness eval --model {final}")
TRAINERS.register(
    "prm",
    _prm_trainer,
    # a reward model, not a policy: it scores steps, it is not evaluated
    next="score steps with algo.step_scorer_path={final} (step_scorer: prm) or harness serve prm --path {final}",
)
TRAINERS.register(
    "retriever",
    _retriever_trainer,
    next="evaluate: harness eval --retriever harr --index INDEX --encoder {final} (or --retriever dense)",
    output="encoder",  # the run's trained output (train_cached): the query tower, not a final/ model
)


def make_trainer(cfg: TrainConfig, out: Path, backend: Backend | None = None) -> Trainer:
    """The trainer of ``cfg.algo.kind`` (:data:`TRAINERS`), to write into ``out``; ``backend``: an
    already built rollout backend (e.g. one pointing at a launched engine). Building it checks the
    recipe and loads the data and the model, and writes nothing: a trainer writes its run folder
    from its first step on."""
    return TRAINERS.get(cfg.algo.kind)(cfg, Path(out), backend)


def build_trainer(cfg: TrainConfig, out: Path, backend: Backend | None = None) -> Trainer:
    """:func:`make_trainer`, then a new (or empty) ``out`` is marked as harness's, so
    ``--overwrite`` can later prove what it deletes: a recipe that fails to build claims nothing."""
    trainer = make_trainer(cfg, out, backend)
    if int(os.environ.get("RANK", "0")) == 0:
        safe_delete.claim(out, "train")
    return trainer


def train_config(
    files: list[str], overrides: list[str], data_dir: str | None = None, resume: str | None = None
) -> TrainConfig:
    """A recipe composed from YAML ``files`` and ``key.path=value`` overrides (``data_dir`` sets
    ``data.data_dir``); with no files, the ``resume`` run's own recorded ``config.json``."""
    extra = list(overrides) + ([f"data.data_dir={data_dir}"] if data_dir else [])
    files = list(files) or ([str(Path(resume) / "config.json")] if resume else [])
    return compose(TrainConfig, files, extra)


def run_folder(cfg: TrainConfig, out: str | None = None, resume: str | None = None) -> Path:
    """Where a run writes: the resumed run, ``out``, else ``trainer.out/name``."""
    return Path(resume or out or Path(cfg.trainer.out) / cfg.name)


def _written_by(kind: str) -> safe_delete.Owned:
    """A run-folder file only a ``kind`` trainer writes: harness's where the run's recorded
    ``config.json`` says ``algo.kind: KIND`` (a ``rollouts.jsonl`` in an SFT run is a user's)."""

    def owned(path: Path) -> bool:
        try:
            recorded = json.loads((path.parent / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return (
            isinstance(recorded, dict)
            and isinstance(recorded.get("algo"), dict)
            and recorded["algo"].get("kind") == kind
        )

    return owned


# Everything a trainer writes into its run folder, at every depth (glob patterns, see
# harness.safe_delete.Folder), and nothing wider: all ``--overwrite`` may delete (with the
# temporaries of these names). ``rollouts.jsonl`` and ``value_head.safetensors`` only where the
# run's kind writes them (:func:`_written_by`). Checkpoints and model folders (final/,
# best-step-N/, a retriever's encoder/, the sync exports) are committed with a marker of their
# kind listing their files: one without it is not harness's. validation/step-N/NAME is an eval run.
_MODEL = Folder(MODEL_FILES, kind="model")
_ENCODER = Folder({**MODEL_FILES, "adapter": Folder(MODEL_FILES)}, kind="encoder")
# The names W&B gives what it writes into ``wandb/`` (wandb.sdk: run-YYYYMMDD_HHMMSS-ID folders,
# the latest-run link, the debug logs); a W&B run folder is removed whole.
_WANDB = ("run-[0-9]*_[0-9]*-*", "offline-run-[0-9]*_[0-9]*-*", "latest-run", "debug.log", "debug-internal.log")
TRAIN_ENTRIES: Layout = {
    **dict.fromkeys(("config.json", "metrics.jsonl", "cache_identity.json"), FILE),  # the last: train_cached's
    "rollouts.jsonl": _written_by("rl"),  # trainer.save_rollouts
    "value_head.safetensors": _written_by("retriever"),  # retriever_rl.rl.algo: ppo
    **ENGINE_LOGS,  # an engine launched by a run before its logs went to engines/
    "checkpoints": Folder({"step-[0-9]*": Folder(kind="checkpoint")}),
    "final": _MODEL,
    "best-step-[0-9]*": _MODEL,  # trainer.best_metric (training.best_val)
    "encoder": _ENCODER,
    "validation": Folder({"step-[0-9]*": Folder({"*": Folder(RUN_ENTRIES, kind="eval")})}),
    "sync": Folder({"weights-v[0-9]*": _MODEL, "adapter-v[0-9]*": _MODEL, "step-[0-9]*": _ENCODER}),
    # torch's SummaryWriter: events.out.tfevents.TIME.HOST.PID.N (tensorboard's event_file_writer)
    "tensorboard": Folder({"events.out.tfevents.[0-9]*.*": FILE}),
    "wandb": Folder({**dict.fromkeys(_WANDB, OPAQUE), "debug-cli.*.log": FILE}),
    "engines": RUN_ENTRIES["engines"],
}


def claim_run_folder(run: Path, overwrite: bool = False, check_only: bool = False) -> None:
    """A fresh run needs an empty (or new) folder: two runs in one folder mix their logs,
    checkpoints and final model. ``overwrite`` empties a previous training run's folder, and only
    one harness made (its marker) holding only what a trainer writes (:data:`TRAIN_ENTRIES`);
    anything else raises :class:`~harness.safe_delete.NotOursError` naming it, before any delete.
    ``check_only``: raise as it would, delete nothing."""
    if not run.exists():
        return
    if not run.is_dir():
        raise ValueError(f"run folder {run} is a file")
    held = sorted(p.name for p in run.iterdir() if not safe_delete.bookkeeping(p.name))
    if not held:
        return
    if not overwrite:
        try:  # --overwrite is offered only where it would succeed
            safe_delete.check_removable(run, TRAIN_ENTRIES, kind="train")
            replace = ", replace it with --overwrite"
        except safe_delete.NotOursError:
            replace = ""
        raise ValueError(
            f"run folder {run} is not empty ({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}): "
            f"continue it with --resume {run}{replace}, or pick another --out"
        )
    if check_only:
        safe_delete.check_removable(run, TRAIN_ENTRIES, kind="train", why="--overwrite")
    else:
        safe_delete.clear(run, TRAIN_ENTRIES, kind="train", why="--overwrite")


def train(
    cfg: TrainConfig,
    run: Path,
    resume: bool = False,
    say: Callable[[str], None] = logger.info,
    overwrite: bool = False,
) -> tuple[Trainer, Path]:
    """Train ``cfg`` into ``run`` with its :data:`TRAINERS` entry, continuing from the run's last
    checkpoint when ``resume``; returns (the trainer, its final output). When the trainer rolls
    out through ``rollout.backend`` and that says ``launch: true``, the engine is started for the
    run and stopped however it ends (SIGTERM included); ``say`` tells the user about it. The
    trainer is built first (a recipe that fails leaves no folder); then the run folder is locked
    throughout (:func:`harness.runlock.run_lock`: a second writer is refused), and a fresh run
    claims it (:func:`claim_run_folder`, which ``overwrite`` lets clear it). A
    rank of a multi-rank run ends its process groups when its training ends well
    (:func:`training.engine.end_distributed`)."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))  # as the launcher set
    b = cfg.rollout.backend
    launch = b.launch and TRAINERS.info(cfg.algo.kind).get("rollout_engine")
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_as_exit())
        if launch:
            check_ranks(cfg, world)  # the recipe is checked before an engine takes a minute to start
            if world > 1:
                # Every rank would start its own engine; one shared server is what RL needs.
                raise ValueError(
                    "rollout.backend.launch=true starts one engine from a single-process run; with several "
                    "ranks start it once with `harness serve model --engine sglang` and set rollout.backend.url"
                )
        if not resume and (rank == 0 or not overwrite):
            # a refusal leaves no lock file behind; every rank refuses a non-empty folder (none waits
            # on a failed rank 0)
            claim_run_folder(run, overwrite, check_only=True)
        # Validate, then claim: the trainer is built (recipe checked, data and model loaded) before
        # the run folder is created, claimed or locked, so a recipe that fails leaves no folder. A
        # launched engine logs into the run folder, so then only the recipe checks above come first.
        trainer = None if launch else make_trainer(cfg, run)
        if rank == 0:  # the ranks of one run share its folder: rank 0 owns it
            stack.enter_context(run_lock(run, "train"))
            if not resume:
                claim_run_folder(run, overwrite)
            safe_delete.claim(run, "train")
        if launch:
            engine, engine_cfg = rollout_engine(cfg)
            proc = start_engine(stack, engine, cfg.model.path, engine_cfg, run / "engines", say=say)
            cfg = replace(cfg, rollout=replace(cfg.rollout, backend=replace(b, url=[proc.url])))
            trainer = make_trainer(cfg, run)
        if resume:
            trainer.resume(run)  # nothing is written before it succeeds (the records open at the first step)
        final = Path(trainer.train())
    if world > 1:
        # A launcher's rank trains once and exits; a single process keeps its group for the next
        # training (the demo trains SFT then RL in one process).
        from training.engine import end_distributed

        end_distributed()
    return trainer, final


def next_step(cfg: TrainConfig, final: Path) -> str:
    """What to do with a run's final output (its trainer's ``next`` hint)."""
    return TRAINERS.info(cfg.algo.kind)["next"].format(final=final)


def _as_current(recorded: Path) -> Any:
    """A run's recorded config as this harness writes it: keys added since (with their defaults)
    filled in, so a new option never invalidates a cached run; None where it no longer loads."""
    try:
        return json.loads(json.dumps(to_dict(from_dict(TrainConfig, json.loads(recorded.read_text())))))
    except (ConfigError, ValueError, TypeError):
        return None


# Options that change how a run executes, not what it trains: a cached run trained with other
# values of these is still the run asked for (torch threads change float summation order only).
EXECUTION_ONLY = ("optim.threads", "trainer.progress")
# What a recipe says about itself, not what it trains: the original it shrinks (a path into the
# checkout, so a moved or second checkout would otherwise make every cached run stale), the papers
# it follows, and the reason given for each deviation (rewording one changes no result).
PROVENANCE = ("source", "papers", "deviations")


def _identity(config: Any, home: Path) -> Any:
    """A recorded config (a fresh dict, or None) less :data:`EXECUTION_ONLY`, :data:`PROVENANCE`
    and ``trainer.out`` (where runs go when no folder is given: a cached run's folder is given), in
    place, with every path inside ``home`` (the folder the run lives in) written relative to it
    (:func:`_relocated`)."""
    if isinstance(config, dict):
        pop_paths(config, (*EXECUTION_ONLY, *PROVENANCE, "trainer.out"))
    return _relocated(config, Path(home).resolve())


def _relocated(value: Any, home: Path) -> Any:
    """``value`` with each string naming a path (absolute, or relative to the current folder and
    existing) resolved, and written relative to ``home`` when inside it: a run's identity does
    not include where its folder lives, so the same folder reached as ``runs/demo`` or
    ``/abs/runs/demo``, or copied elsewhere whole, is the same cache (its SFT data and the model
    an RL run starts from are paths inside it)."""
    if isinstance(value, dict):
        return {k: _relocated(v, home) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocated(v, home) for v in value]
    if not isinstance(value, str) or not value or "\n" in value:
        return value
    path = Path(value).expanduser()
    try:
        if not (path.is_absolute() or path.exists()):
            return value  # a name (a hub model id, a registry entry), not a path of this machine
        where = path.resolve()
    except (OSError, ValueError):  # not a path at all
        return value
    return f"@home/{where.relative_to(home).as_posix()}" if where.is_relative_to(home) else str(where)


IDENTITY = "cache_identity.json"  # what train_cached trained a run as (its config, where-independent)


class StaleRunError(ValueError):
    """A folder already holds finished work (a trained model, a search) made with another config
    or other inputs: it is not replaced unless asked (:func:`train_cached`'s ``replace``).
    ``differences`` lists ``key: old → new``; ``hint`` says how to replace it."""

    def __init__(
        self, run: Path, differences: list[str], hint: str = "replace it explicitly, or use another folder"
    ) -> None:
        self.run, self.differences, self.hint = run, differences, hint
        shown = "; ".join(differences[:8]) + (f"; and {len(differences) - 8} more" if len(differences) > 8 else "")
        super().__init__(
            f"{run} was made with another config ({len(differences)} difference(s): {shown}); it is kept: {hint}"
        )


def train_cached(cfg: TrainConfig, run: str | Path, *, replace: bool = False) -> tuple[Path, bool]:
    """Train ``cfg`` into ``run`` unless ``run`` already holds a final model trained with this
    config (its :data:`IDENTITY`, or else its ``config.json``, compared without the
    :data:`EXECUTION_ONLY` options and ``trainer.out``, and with the paths inside ``run``'s parent
    folder relative to it: :func:`_relocated`); returns the
    final model folder and whether it trained now. Training is :func:`train`'s (the engine launch,
    the run-folder claim). A finished model of another config is never replaced silently: without
    ``replace`` that is a :class:`StaleRunError` naming the keys that differ (a harness upgrade that
    changed a default would otherwise delete a user's trained model). A run without a final model
    (interrupted), or one ``replace`` allows, is cleared first (a cached demo or stage never mixes
    recipes), as ``--overwrite`` clears: only a harness training run is ever cleared."""
    run = Path(run)
    final, home = run / TRAINERS.info(cfg.algo.kind).get("output", "final"), run.parent
    # The identity a cached run recorded, its paths relative to its folder's parent then (a copy
    # of the folder keeps it); a run trained before identities were recorded: its config.json.
    recorded = next((p for p in (run / IDENTITY, run / "config.json") if p.exists()), None)
    wanted = _identity(json.loads(json.dumps(to_dict(cfg))), home)  # as config.json holds it (tuples as lists)
    with run_lock(run, "train"):  # re-entrant: train() takes it again
        if final.is_dir() and recorded is not None:
            have = _identity(_as_current(recorded), home)
            if have == wanted:
                return final, False
            if not replace:
                said = config_differences(have, wanted) if isinstance(have, dict) else []
                raise StaleRunError(run, said or [f"{recorded.name}: a config this harness no longer loads"])
        if safe_delete.check_removable(run, TRAIN_ENTRIES, kind="train"):
            logger.info("retraining: %s holds no final model of this config", run)
        final = train(cfg, run, overwrite=True)[1]
        write_json_atomic(run / IDENTITY, wanted)
        return final, True


def rollout_engine(cfg: TrainConfig) -> tuple[str, EngineConfig]:
    """The engine ``rollout.backend.launch`` starts and its launch config, with what weight sync
    needs: ``sglang`` → SGLang as configured; ``openai`` → vLLM with its RL endpoints
    (``VLLM_SERVER_DEV_MODE=1``) and log-probs of the distribution it samples from
    (``--logprobs-mode processed_logprobs``: see ``harness.backends.vllm_sync``). With
    ``model.lora.sync: adapter`` the engine also gets LoRA enabled at the recipe's rank (vLLM:
    ``--enable-lora --max-lora-rank R`` and runtime adapter loading; SGLang: ``--enable-lora
    --max-lora-rank R --lora-target-modules ...``, which its CPU build cannot start with: see
    tests/engines/test_lora_sync.py). Flags given in ``rollout.backend.engine.args`` win."""
    b = cfg.rollout.backend
    engine = engine_for_backend(b.kind)  # EngineError (a RuntimeError) for kinds with no engine
    given = {a.split("=", 1)[0] for a in b.engine.args}
    env: dict[str, str] = {}
    args: list[str] = []
    lora = cfg.model.lora
    adapter = lora is not None and lora.sync == "adapter"
    # a recipe that configures LoRA on the engine itself (--enable-lora given) keeps its own flags
    lora_args = ["--enable-lora", "--max-lora-rank", str(lora.r)] if adapter and "--enable-lora" not in given else []
    if engine == "vllm":
        env.update(VLLM_RL_ENV)
        args += [] if VLLM_RL_ARGS[0] in given else VLLM_RL_ARGS
        if adapter:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
            args += lora_args
    elif lora_args:
        args += [*lora_args, "--lora-target-modules", *lora.target_modules]
    return engine, replace(b.engine, env={**env, **b.engine.env}, args=[*args, *b.engine.args])
