"""``harness demo``: the whole mission on the shipped demo, on CPU, in minutes (``make demo``).

1. the baselines (``naive``, ``standard``) and the untrained agent (``research``) on the first
   :data:`BASELINE_LIMIT` questions of the demo's ``test`` split (a balanced prefix: the baselines
   are context, and the untrained agent's 0 needs no more to show);
2. an SFT warm-up of the same model on trajectories synthesized from the first
   :data:`SFT_QUESTIONS` questions of the demo's ``train`` split (other questions, other
   supporting passages: see ``benchmarks/demo_data/build_demo.py``);
3. the SFT agent on the whole ``test`` split, labelled ``research+sft``;
4. RL (GRPO, ReSearch's F1 + format reward) from the SFT model on the ``train`` split, validated
   on the ``val`` split as it trains (the recipe's ``data.val_split``), its rollouts through the
   very agent step 3 evaluates (the methods config's agent and retriever blocks are copied into
   the RL recipe);
5. the RL agent on the whole ``test`` split, labelled ``research+sft+rl``;
6. a report whose rows carry 95% bootstrap intervals, every row paired-tested against the SFT
   agent (where RL starts), the RL run's training curves, and ``demo.md``: untrained → SFT → RL (EM, F1,
   format-valid responses, searches per question) with each stage paired against the one before
   it, overall and per question template.

Every step is cached under ``out`` so a rerun is fast: evaluations resume (a finished one is
not rerun), the synthesized data is kept while its inputs are unchanged, and each training is
skipped when its ``final`` model exists and the run's recorded config equals the recipe's. A
retrained model makes every later stage start over. It sits in ``training`` because it trains;
what it shows goes through a :class:`DemoUI` the caller gives (the CLI prints tables).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from benchmarks.build import dataset_retriever
from benchmarks.datasets import corpus_path, dataset_file, load_examples
from benchmarks.demo_summary import summarize
from benchmarks.eval_runs import run_configs
from benchmarks.fmt import pct
from benchmarks.report_write import write_report
from benchmarks.training_curves import load_training_run
from harness import safe_delete
from harness.config import compose, deep_merge, from_dict, load_yaml
from harness.eval_config import EvalConfig, RetrieverConfig
from harness.models import load_tokenizer
from harness.runlog import RUN_ENTRIES, file_hash
from pipelines.dialects import resolve_dialect
from training.build import TRAIN_ENTRIES, train_cached
from training.config import RolloutAgentConfig, SamplingConfig, TrainConfig

logger = logging.getLogger(__name__)

METHODS_CONFIG = "configs/methods/demo_cpu.yaml"
TRAIN_CONFIG = "configs/train/smollm2_cpu_sft_demo.yaml"
RL_CONFIG = "configs/train/smollm2_cpu_grpo_demo.yaml"
UNTRAINED, TRAINED, RL = "research", "research+sft", "research+sft+rl"
DEFAULT_OUT = "runs/demo"
TEST_SPLIT, TRAIN_SPLIT = "test", "train"
# Prefixes of a multiple of 14 questions are balanced (every template equally often, yes/no and
# first/second 50/50: build_demo.py), so these subsets keep the splits' balance.
BASELINE_LIMIT = 42  # test questions for the baselines and the untrained agent
SFT_QUESTIONS = 28  # train questions the SFT warm-up's trajectories are synthesized from (one pass)


def trained_runs(out: str | Path = DEFAULT_OUT) -> dict[Path, str]:
    """The run folders the demo trains into, each with the recipe it trains there. A recipe that
    starts from one (the GRPO recipe names the SFT model) is traced back to an architecture by
    ``harness train --plan`` through this before the demo has ever run."""
    root = Path(out)
    return {root / "sft" / "model": TRAIN_CONFIG, root / "rl": RL_CONFIG}


class DemoUI(Protocol):
    """What the demo shows as it goes."""

    def step(self, title: str) -> None: ...  # a new step begins
    def results(self, results: list[Any]) -> None: ...  # an evaluation's run results
    def report(self, report: Any) -> None: ...  # the written report (benchmarks.report_write.Report)
    def say(self, text: str) -> None: ...  # one line of plain text (Markdown included)


def run_demo(
    ui: DemoUI,
    out: str | Path = DEFAULT_OUT,
    methods_config: str = METHODS_CONFIG,
    train_config: str = TRAIN_CONFIG,
    threads: int | None = None,
    overrides: list[str] | None = None,
    rl_config: str = RL_CONFIG,
    rl_overrides: list[str] | None = None,
) -> Path:
    """Baselines, untrained agent, SFT, SFT agent, RL, RL agent, report; see the module docstring.
    ``threads``: torch threads of every stage (None: :func:`auto_threads`; ``optim.threads`` in
    ``overrides``/``rl_overrides`` still wins for a training); ``overrides`` and ``rl_overrides``:
    ``key.path=value`` of the SFT and RL recipes. Returns the report folder."""
    root = Path(out)
    eval_dir, sft_dir = root / "eval", root / "sft"
    if threads is None:
        threads, why = auto_threads()
        ui.say(f"torch threads: {threads} ({why}; --threads N to choose)")
    # Threads are execution-only: cached evaluations resume and cached trainings are reused
    # whatever thread count made them (training.build.EXECUTION_ONLY).
    overrides = [f"optim.threads={threads}", *(overrides or [])]
    rl_overrides = [f"optim.threads={threads}", *(rl_overrides or [])]
    base_cfg = _eval_data(methods_config, eval_dir, threads)
    ui.step(f"1/6 baselines and the untrained agent (the first {BASELINE_LIMIT} questions of the demo test split)")
    _evaluate(ui, _limited(base_cfg, BASELINE_LIMIT), ["naive", "standard", UNTRAINED])
    ui.step(f"2/6 SFT data: synthesized from the first {SFT_QUESTIONS} questions of the demo train split")
    data = _synthesize(ui, base_cfg, sft_dir)
    ui.step("3/6 SFT warm-up")
    sft_run, rl_run = trained_runs(root)
    model, retrained = _train(ui, train_config, list(overrides or []), data, sft_run)
    if retrained:  # everything after the SFT model belongs to an older one: folders harness made
        for name in (TRAINED, RL):
            safe_delete.remove(eval_dir / f"{name}-demo-test", RUN_ENTRIES, kind="eval", why="harness demo")
        safe_delete.remove(rl_run, TRAIN_ENTRIES, kind="train", why="harness demo")
    ui.step("4/6 the SFT agent (demo test split)")
    _evaluate(ui, _with_model(base_cfg, model), [UNTRAINED], TRAINED)
    ui.step("5/6 RL: GRPO from the SFT model (demo train split)")
    rl_model, rl_retrained = _train_rl(ui, rl_config, list(rl_overrides or []), base_cfg, model, rl_run)
    if rl_retrained:  # results of an older RL model
        safe_delete.remove(eval_dir / f"{RL}-demo-test", RUN_ENTRIES, kind="eval", why="harness demo")
    ui.step("6/6 the RL agent (demo test split)")
    _evaluate(ui, _with_model(base_cfg, rl_model), [UNTRAINED], RL)
    return _report(ui, eval_dir, root / "report", rl_run)


def auto_threads() -> tuple[int, str]:
    """Torch threads for the demo on this machine, and why. Every core when the machine is quiet
    (1-minute load average under half the cores); one when it is busy, where on a 2-core VM two
    threads spin-wait on each other (~3x the CPU time of a step, measured under load). Quiet, two
    threads make a GRPO step of the demo 1.5x faster than one (111 s against 171 s, measured with
    scripts/perf/train_step.py; see docs/training.md)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if cores > 1 and load < cores / 2:
        return cores, f"{cores} cores, load average {load:.2f}: quiet"
    return 1, f"{cores} core(s), load average {load:.2f}: busy or single-core"


def _with_model(data: dict[str, Any], model: Path) -> dict[str, Any]:
    return {**data, "backend": {**data.get("backend", {}), "model": str(model)}}


def _eval_data(methods_config: str, eval_dir: Path, threads: int) -> dict[str, Any]:
    data = load_yaml(methods_config)
    backend = {**data.get("backend", {}), "threads": threads}  # execution-only: runs still resume
    return {**data, "backend": backend, "dataset": {"name": "demo", "split": TEST_SPLIT}, "out": str(eval_dir)}


def _limited(data: dict[str, Any], limit: int) -> dict[str, Any]:
    return {**data, "dataset": {**data["dataset"], "limit": limit}}


def _evaluate(ui: DemoUI, data: dict[str, Any], methods: list[str], label: str | None = None) -> None:
    configs = [from_dict(EvalConfig, deep_merge(data, {"method": m, "label": label})) for m in methods]
    results = run_configs(configs, say=ui.say)
    ui.results(results)
    failed = [r for r in results if r.errors]
    if failed:
        raise RuntimeError(f"{', '.join(str(r.method) for r in failed)}: items failed (see the run directories)")


def _synthesize(ui: DemoUI, data: dict[str, Any], sft_dir: Path) -> Path:
    """The research_small trajectories of the first :data:`SFT_QUESTIONS` questions of the demo's
    train split, kept while their inputs are unchanged."""
    # deferred: training.synthesize imports flashrag and torch (seconds)
    from training.synthesize import corpus_titles, synthesize

    agent = data.get("agent", {})
    variant, max_doc = agent.get("variant", "exact"), int(agent.get("max_doc_tokens", 128))
    model = data.get("backend", {}).get("model", "smollm2-135m-instruct")
    rcfg = RetrieverConfig(**data.get("retriever", {}))
    inputs = {
        "questions": file_hash(dataset_file("demo", TRAIN_SPLIT)),
        "limit": SFT_QUESTIONS,
        "corpus": file_hash(corpus_path("demo", TRAIN_SPLIT)),
        "dialect": UNTRAINED,
        "variant": variant,
        "max_doc_tokens": max_doc,
        "tokenizer": model,
        "retriever": rcfg.kind,
        "topk": rcfg.topk,
    }
    path, stamp = sft_dir / "train.jsonl", sft_dir / "train.inputs.json"
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == inputs:
        ui.say(f"cached: {path}")
        return path
    sft_dir.mkdir(parents=True, exist_ok=True)
    examples = load_examples("demo", TRAIN_SPLIT, limit=SFT_QUESTIONS)
    retriever = dataset_retriever(rcfg, "demo", TRAIN_SPLIT)
    titles = corpus_titles(corpus_path("demo", TRAIN_SPLIT))
    d = resolve_dialect(UNTRAINED, variant)
    stats = synthesize(examples, d, retriever, path, rcfg.topk, load_tokenizer(model), max_doc, titles)
    if not stats.kept:
        raise RuntimeError(f"synthesis kept no trajectory: {stats.summary()}")
    stamp.write_text(json.dumps(inputs, indent=2))
    ui.say(f"{d.name}: {stats.summary()} → {path}")
    return path


def _train(ui: DemoUI, train_config: str, overrides: list[str], data: Path, run: Path) -> tuple[Path, bool]:
    """The SFT model folder and whether it was (re)trained now (see :func:`training.build.train_cached`)."""
    source = f"sft.sources=[{{kind: synth, path: {json.dumps(str(data))}}}]"
    final, retrained = train_cached(compose(TrainConfig, [train_config], [source, *overrides]), run)
    ui.say(f"trained → {final}" if retrained else f"cached: {final} (trained with this recipe)")
    return final, retrained


def _train_rl(
    ui: DemoUI, rl_config: str, overrides: list[str], data: dict[str, Any], sft_model: Path, run: Path
) -> tuple[Path, bool]:
    """GRPO from ``sft_model``; the rollouts use the evaluation's agent and retriever options, so
    the agent trained is the agent evaluated. Cached like the SFT run."""
    agent = data.get("agent", {})
    # The evaluation's turn length is the rollouts' (rollout.sampling owns it); its temperature,
    # top_p and seed are evaluation's: rollouts sample as the RL recipe says.
    loop = {k: v for k, v in agent.items() if k not in RolloutAgentConfig.MOVED_KEYS}
    same_agent = [
        f"model.path={json.dumps(str(sft_model))}",
        f"rollout.method={UNTRAINED}",
        f"rollout.agent={json.dumps(loop)}",
        f"rollout.sampling.max_new_tokens={int(agent.get('max_new_tokens', SamplingConfig.max_new_tokens))}",
        f"retriever={json.dumps(data.get('retriever', {}))}",
        f"trainer.out={json.dumps(str(run.parent))}",
    ]
    cfg = compose(TrainConfig, [rl_config], [*same_agent, *overrides])
    final, retrained = train_cached(cfg, run)
    ui.say(f"trained → {final}" if retrained else f"cached: {final} (trained with this recipe)")
    return final, retrained


def _report(ui: DemoUI, eval_dir: Path, out: Path, rl_run: Path) -> Path:
    # Every row is paired against the SFT agent, the RL stage's starting point (demo.md pairs the
    # whole chain: SFT against the untrained agent, RL against SFT); the RL run's folder makes the
    # report draw its training curves (report.html and out/curves/*.png).
    report = write_report([str(eval_dir / "*"), str(rl_run)], out, "md,html,csv", baseline=TRAINED)
    ui.report(report)
    stages = [eval_dir / f"{name}-demo-test" for name in (UNTRAINED, TRAINED, RL)]
    note = (
        f"The baselines and the untrained agent ran on the first {BASELINE_LIMIT} questions of the test split "
        f"(a balanced prefix), the SFT and RL agents on all of it; each pair of stages is compared on the "
        f"questions both answered."
    )
    if chosen := _rl_choice(rl_run):
        note += " " + chosen
    text = summarize(*stages, curves=[(Path(c).stem, c) for c in report.curves], note=note)
    (out / "demo.md").write_text(text)
    ui.say(text)
    ui.say(f"report: {out}/report.html, {out}/leaderboard.md, {out}/demo.md")
    return out


def _rl_choice(rl_run: Path) -> str | None:
    """Which step's weights the RL run kept, when validation chose them (``trainer.best_metric``):
    a sentence for demo.md with every validation's score, or None."""
    if not (rl_run / "metrics.jsonl").exists():
        return None
    series = load_training_run(rl_run).series
    metric = json.loads((rl_run / "config.json").read_text()).get("trainer", {}).get("best_metric")
    chosen = series.get("val/best_step")
    if not metric or not chosen:
        return None
    scores = ", ".join(f"{pct(v)} at step {step}" for step, v in series.get(f"val/{metric}", []))
    return (
        f"The RL agent is the RL run's step {int(chosen[-1][1])}, chosen by validation {metric.upper()} on the val "
        f"split (trainer.best_metric; {scores})."
    )
