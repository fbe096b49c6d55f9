"""``harness demo [--system NAME]``: a seed system's whole chain on the shipped demo world, on CPU.

For every system (:mod:`programs.demo.systems` says what each trains):

1. the baselines (``naive``, ``standard``) and the untrained agent on the first
   :data:`BASELINE_LIMIT` questions of the demo's ``test`` split (a balanced prefix: the baselines
   are context, and the untrained agent's 0 needs no more to show);
2. trajectories synthesized in the system's dialect from the first :data:`SFT_QUESTIONS` questions
   of the demo's ``train`` split (other questions, other supporting passages: see
   ``benchmarks/demo_data/build_demo.py``);
3. an SFT warm-up on them;
4. the SFT agent on the whole ``test`` split, labelled ``METHOD+sft``;
5. the system's own training from the SFT model, once per seed (``--seeds``), each stage's rollouts
   through the very agent step 4 evaluates (the methods config's agent and retriever blocks are
   copied into every RL recipe);
6. each trained agent on the whole ``test`` split, labelled ``METHOD+sft+rl`` (seed 0) and
   ``METHOD+sft+rl-sN``;
7. a report whose rows carry 95% bootstrap intervals, every row paired-tested against the SFT
   agent (where training starts), the training curves, ``demo.md`` (untrained → SFT → each trained
   agent, paired against the stage it starts from, overall and per question template) and
   ``timings.json`` (each stage's wall time).

Every step is cached under ``out``, so a rerun is fast: evaluations resume (a finished one is not
rerun), the synthesized data is kept while its inputs are unchanged, and each training is skipped
when its ``final`` model exists and the run's recorded config equals the recipe's. A stage whose
recipe or inputs changed since it ran is refused, naming what changed (nothing is deleted), unless
``--retrain`` (:attr:`DemoOptions.retrain`) asks to replace it; a retrained model makes every later
stage that used it start over. What it shows goes through a
:class:`DemoUI` the caller gives (the CLI prints tables).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from benchmarks.build import dataset_retriever, run_dir_for
from benchmarks.datasets import corpus_path, dataset_file, load_examples
from benchmarks.demo_summary import summarize
from benchmarks.eval_runs import run_configs
from benchmarks.fmt import pct
from benchmarks.report_write import write_report
from benchmarks.training_curves import load_training_run
from harness import safe_delete
from harness.config import compose, deep_merge, from_dict, load_yaml, pop_paths, to_dict
from harness.eval_config import EvalConfig, RetrieverConfig
from harness.fsutil import write_json_atomic
from harness.memory import release_memory, resident_kb
from harness.models import load_tokenizer
from harness.runlog import RUN_ENTRIES, RunDir, config_differences, file_hash
from harness.safe_delete import FILE
from harness.textfiles import read_jsonl
from pipelines.dialects import resolve_dialect
from pipelines.dialects.base import chat_template_file
from programs.demo.systems import METHODS_CONFIG, DemoSystem, get_system, shipped
from training.build import TRAIN_ENTRIES, StaleRunError, train_cached
from training.config import RolloutAgentConfig, SamplingConfig, TrainConfig
from training.epochs import split_held_out

if TYPE_CHECKING:
    from training.data.rft import RFTFilterConfig

logger = logging.getLogger(__name__)

TEST_SPLIT, TRAIN_SPLIT = "test", "train"
# Prefixes of a multiple of 14 questions are balanced (every template equally often, yes/no and
# first/second 50/50: build_demo.py), so these subsets keep the splits' balance.
BASELINE_LIMIT = 42  # test questions for the baselines and the untrained agent
SFT_QUESTIONS = 28  # train questions the SFT warm-up's trajectories are synthesized from (one pass)
# What a refused stage says to do (StaleRunError): replacing a trained stage deletes what follows it.
RETRAIN_HINT = "to replace it and every stage after it, rerun with --retrain; or use another --out folder"


class DemoUI(Protocol):
    """What the demo shows as it goes."""

    def step(self, title: str) -> None: ...  # a new step begins
    def results(self, results: list[Any]) -> None: ...  # an evaluation's run results
    def report(self, report: Any) -> None: ...  # the written report (benchmarks.report_write.Report)
    def say(self, text: str) -> None: ...  # one line of plain text (Markdown included)


@dataclass
class DemoOptions:
    """What a demo run may change: the configs (None: the system's shipped ones) and their
    ``key.path=value`` overrides (``sft``: the warm-up's; ``rl``: every training recipe's), the
    seeds of the training stages, the torch threads of every stage (None: :func:`auto_threads`;
    ``optim.threads`` in the overrides still wins for a training), and ``limit``: evaluate the first
    N test questions only (every stage; None: the whole split); ``baselines``: whether FlashRAG's
    ``naive`` and ``standard`` run beside the untrained agent."""

    methods_config: str | None = None
    sft_config: str | None = None
    rl_configs: Sequence[str] | None = None
    sft_overrides: list[str] = field(default_factory=list)
    rl_overrides: list[str] = field(default_factory=list)
    seeds: Sequence[int] = (0,)
    threads: int | None = None
    limit: int | None = None  # the first N test questions only (a quick look; the figures need all 154)
    baselines: bool = True  # FlashRAG's naive and standard beside the untrained agent (context only)
    # Replace a stage whose recipe or inputs changed since it ran (and what was built on it); without
    # it such a stage is refused (training.build.StaleRunError), so nothing trained is lost unasked.
    retrain: bool = False


def labels(system: DemoSystem) -> tuple[str, str, str]:
    """The run labels of the untrained agent, the SFT agent and the trained one (seed 0)."""
    trained = f"{system.method}+sft+harr" if system.chain == "harr" else f"{system.method}+sft+rl"
    return system.method, f"{system.method}+sft", trained


def start_label(system: DemoSystem) -> str:
    """The run label of HARR's start: the SFT agent searching with the untrained query tower in
    HARR's state, what every seed's training starts from (``search_r1+sft+harr-start``)."""
    return f"{labels(system)[2]}-start"


def seeded(name: str, seed: int) -> str:
    """A folder or label of a seed's training: the name itself for seed 0 (the demo's own), else
    ``NAME-sSEED``."""
    return name if seed == 0 else f"{name}-s{seed}"


@dataclass
class StageRun:
    """What a stage tells :meth:`Timings.stage`: ``reused`` when it found its outputs made by an
    earlier run (cached training, a finished evaluation), so its record is that run's time."""

    reused: bool = False


class Timings:
    """Each stage's wall time, written to ``timings.json`` as it goes, with the process's memory:
    ``peak_rss_mb`` is the peak so far (the stage's own when it is the largest yet), ``rss_mb``
    what is held once the stage's memory has been given back (:func:`harness.memory.release_memory`).

    The file is the folder's record, not one process's: the entries already there are kept (a rerun
    of cached stages, or another seed's demo writing into the same folder, adds its own), and a
    stage that reused an earlier run's outputs keeps that run's record instead of its own second."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _on_disk(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    @contextmanager
    def stage(self, name: str) -> Iterator[StageRun]:
        run, start = StageRun(), time.monotonic()
        yield run
        seconds = round(time.monotonic() - start, 1)
        release_memory()  # the stage's models and caches are gone: their pages go back to the OS
        kb = resident_kb()
        stages = self._on_disk()  # read again now: another process may have written since
        if run.reused and name in stages:
            return
        stages[name] = {
            "seconds": seconds,
            "peak_rss_mb": round(kb.get("peak", 0) / 1024),
            "rss_mb": round(kb.get("rss", 0) / 1024),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, stages)


def run_demo(
    ui: DemoUI, system: str = "research", out: str | Path | None = None, opts: DemoOptions | None = None
) -> Path:
    """The system's chain (see the module docstring); returns the report folder."""
    s, o = get_system(system), opts or DemoOptions()
    root = Path(out or s.default_out)
    threads = o.threads
    if threads is None:
        threads, why = auto_threads()
        ui.say(f"torch threads: {threads} ({why}; --threads N to choose)")
    if not o.seeds or len(set(o.seeds)) != len(o.seeds) or any(seed < 0 for seed in o.seeds):
        raise ValueError(f"--seeds must be distinct non-negative integers, not {list(o.seeds)}")
    rl_configs = list(o.rl_configs) if o.rl_configs else [shipped(r) for r in s.rl]
    if len(rl_configs) != len(s.rl):
        raise ValueError(f"{s.name} trains {len(s.rl)} recipe(s) in order ({', '.join(s.rl)}): got {len(rl_configs)}")
    # Threads are execution-only: cached evaluations resume and cached trainings are reused
    # whatever thread count made them (training.build.EXECUTION_ONLY).
    sft_over = [f"optim.threads={threads}", *o.sft_overrides]
    rl_over = [f"optim.threads={threads}", *o.rl_overrides]
    eval_dir = root / "eval"
    untrained, sft_label, trained = labels(s)
    base = _eval_data(o.methods_config or shipped(METHODS_CONFIG), eval_dir, threads, s)
    if o.limit is not None:
        base = _limited(base, o.limit)
    timings = Timings(root / "timings.json")
    n = 7
    ui.step(f"1/{n} baselines and the untrained {s.method} agent (the first {BASELINE_LIMIT} test questions)")
    with timings.stage("baselines") as st:
        methods = ["naive", "standard", s.method] if o.baselines else [s.method]
        st.reused = _evaluate(ui, _limited(base, min(BASELINE_LIMIT, o.limit or BASELINE_LIMIT)), methods)
    ui.step(f"2/{n} SFT data: synthesized in {s.method}'s dialect from the first {SFT_QUESTIONS} train questions")
    with timings.stage("synthesis") as st:
        data, kept_data = _synthesize(ui, base, root / "sft", s.method, o.retrain)
        st.reused = kept_data
    ui.step(f"3/{n} SFT warm-up")
    with timings.stage("sft") as st:
        if not kept_data:  # new SFT data: a model trained on other data is stale whatever its recipe
            safe_delete.remove(root / "sft" / "model", TRAIN_ENTRIES, kind="train", why="harness demo: new SFT data")
        recipe = compose(TrainConfig, [o.sft_config or shipped(s.sft)], [_sft_source(data), *sft_over])
        model, retrained = _train(ui, recipe, root / "sft" / "model", o.retrain)
        st.reused = not retrained
    if retrained:  # everything after the SFT model belongs to an older one: folders harness made
        _clear_after_sft(root, s, eval_dir)
    ui.step(f"4/{n} the SFT agent ({sft_label}, demo test split)")
    with timings.stage("eval_sft") as st:
        st.reused = _evaluate(ui, _with_model(base, model), [s.method], sft_label)
    chain = Chain(ui, s, rl_over, base, model, root, o.retrain)
    if s.chain == "harr":
        ui.step(f"4/{n} HARR's start: the SFT agent searching with the untrained query tower ({start_label(s)})")
        with timings.stage("eval_start") as st:
            st.reused = _harr_start(chain, rl_configs[0], eval_dir)
    finals: list[tuple[int, Path, str]] = []  # (seed, the trained run's folder, its label)
    for seed in o.seeds:
        ui.step(f"5/{n} {s.name}'s training from the SFT model, seed {seed}: {s.algorithm}")
        with timings.stage(seeded("train", seed)) as st:
            last_run, retrained = _train_chain(chain, rl_configs, seed)
            st.reused = not retrained
        label = seeded(trained, seed)
        if retrained:  # results of an older trained model
            safe_delete.remove(eval_dir / f"{label}-demo-test", RUN_ENTRIES, kind="eval", why="harness demo")
        ui.step(f"6/{n} the trained agent ({label}, demo test split)")
        with timings.stage(seeded("eval_trained", seed)) as st:
            st.reused = _evaluate(ui, _trained_eval(base, s, model, last_run), [s.method], label)
        finals.append((seed, last_run, label))
    ui.step(f"7/{n} report")
    with timings.stage("report"):
        return _report(ui, s, eval_dir, root / "report", finals)


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


def _eval_data(methods_config: str, eval_dir: Path, threads: int, s: DemoSystem) -> dict[str, Any]:
    """The evaluation config every stage of ``s`` shares: the methods config, with the system's
    agent and retriever overrides, on the demo's test split."""
    data = load_yaml(methods_config)
    backend = {**data.get("backend", {}), "threads": threads}  # execution-only: runs still resume
    data = deep_merge(data, {"agent": s.agent, "retriever": s.retriever})
    return {**data, "backend": backend, "dataset": {"name": "demo", "split": TEST_SPLIT}, "out": str(eval_dir)}


def _limited(data: dict[str, Any], limit: int) -> dict[str, Any]:
    return {**data, "dataset": {**data["dataset"], "limit": limit}}


def _evaluate(ui: DemoUI, data: dict[str, Any], methods: list[str], label: str | None = None) -> bool:
    """Evaluate ``methods`` (resuming their run folders); returns whether every one was finished
    before (nothing ran now)."""
    configs = [from_dict(EvalConfig, deep_merge(data, {"method": m, "label": label})) for m in methods]
    finished = all(_finished(run_dir_for(c)) for c in configs)
    results = run_configs(configs, say=ui.say)
    ui.results(results)
    failed = [r for r in results if r.errors]
    if failed:
        raise RuntimeError(f"{', '.join(str(r.method) for r in failed)}: items failed (see the run directories)")
    return finished


def _finished(run_dir: Path) -> bool:
    """Whether an evaluation folder holds a finished run (every item scored without an error)."""
    results = RunDir(run_dir).results()
    return results is not None and results.complete


def _synthesize(ui: DemoUI, data: dict[str, Any], sft_dir: Path, dialect: str, retrain: bool) -> tuple[Path, bool]:
    """The ``dialect`` trajectories (its small-model variant where the agent runs it) of the first
    :data:`SFT_QUESTIONS` questions of the demo's train split, kept while their inputs are unchanged.
    Each record names the agent's chat template file, if it has one (``agent.chat_template``), so
    SFT renders the prompts the evaluations and the rollouts see. Returns the file and whether it
    was kept from an earlier run. New inputs where an SFT model was trained on the old data are
    refused unless ``retrain`` (the new data would make that model, and all after it, stale)."""
    # deferred: training.synthesize imports flashrag and torch (seconds)
    from training.synthesize import corpus_titles, synthesize

    agent = data.get("agent", {})
    variant, max_doc = agent.get("variant", "exact"), int(agent.get("max_doc_tokens", 128))
    chat_template = agent.get("chat_template")
    model = data.get("backend", {}).get("model", "smollm2-135m-instruct")
    rcfg = RetrieverConfig(**data.get("retriever", {}))
    inputs = {
        "questions": file_hash(dataset_file("demo", TRAIN_SPLIT)),
        "limit": SFT_QUESTIONS,
        "corpus": file_hash(corpus_path("demo", TRAIN_SPLIT)),
        "dialect": dialect,
        "variant": variant,
        "max_doc_tokens": max_doc,
        "tokenizer": model,
        "retriever": rcfg.kind,
        "topk": rcfg.topk,
        # the template's text, not only its name: an edited template makes new records
        **({"chat_template": [chat_template, file_hash(chat_template_file(chat_template))]} if chat_template else {}),
    }
    path, stamp = sft_dir / "train.jsonl", sft_dir / "train.inputs.json"
    before = json.loads(stamp.read_text()) if stamp.exists() else None
    if path.exists() and before == inputs:
        ui.say(f"cached: {path}")
        return path, True
    if not retrain and (sft_dir / "model" / "final").is_dir():
        said = config_differences(before, inputs) if isinstance(before, dict) else [f"{stamp.name}: missing"]
        said = said or [f"{path.name}: missing"]  # the same inputs, the file gone
        raise StaleRunError(sft_dir / "model", [f"its SFT data's {d}" for d in said], RETRAIN_HINT)
    sft_dir.mkdir(parents=True, exist_ok=True)
    examples = load_examples("demo", TRAIN_SPLIT, limit=SFT_QUESTIONS)
    retriever = dataset_retriever(rcfg, "demo", TRAIN_SPLIT)
    titles = corpus_titles(corpus_path("demo", TRAIN_SPLIT))
    d = resolve_dialect(dialect, variant).with_chat_template(chat_template)
    stats = synthesize(examples, d, retriever, path, rcfg.topk, load_tokenizer(model), max_doc, titles)
    if not stats.kept:
        raise RuntimeError(f"synthesis kept no trajectory: {stats.summary()}")
    stamp.write_text(json.dumps(inputs, indent=2))
    ui.say(f"{d.name}: {stats.summary()} → {path}")
    return path, False


def _sft_source(data: Path) -> str:
    """The SFT recipe's override that trains on the synthesized file ``data``."""
    return f"sft.sources=[{{kind: synth, path: {json.dumps(str(data))}}}]"


def _clear_after_sft(root: Path, s: DemoSystem, eval_dir: Path) -> None:
    """Remove what an older SFT model led to: the later evaluations and every training run of
    the system (any seed), each only when harness wrote all of it (:mod:`harness.safe_delete`)."""
    _, sft_label, trained = labels(s)
    for run in sorted(eval_dir.glob("*-demo-test")):
        if run.name.startswith((f"{sft_label}-", f"{trained}-")):
            safe_delete.remove(run, RUN_ENTRIES, kind="eval", why="harness demo")
    for name in s.stage_names:
        for run in sorted(root.glob(f"{name}")) + sorted(root.glob(f"{name}-s*")):
            safe_delete.remove(run, TRAIN_ENTRIES, kind="train", why="harness demo")
    if s.chain == "prorag":  # the MCTS values, the PRM and the RFT data and model were the old SFT model's
        safe_delete.remove(root / MCTS_DIR, MCTS_LAYOUT, kind="mcts", why="harness demo")
        safe_delete.remove(root / PRM_RUN, TRAIN_ENTRIES, kind="train", why="harness demo")
        safe_delete.remove(root / RFT_DIR / "model", TRAIN_ENTRIES, kind="train", why="harness demo")
        # The RFT samples and set need no clearing here: the MCTS just removed makes the next
        # run's MCTS new, and _rft_set then renews both (its stamp is not read on a renewal).


# What ``harness demo --system prorag`` writes between its SFT model and its RL runs; every part
# derives from the SFT model, so a retrained SFT model clears them all (see _clear_after_sft).
MCTS_DIR, PRM_RUN, RFT_DIR = "mcts", "prm", "rft"
MCTS_LAYOUT = {"steps.jsonl": FILE, "pairs.jsonl": FILE, "done.jsonl": FILE, "inputs.json": FILE}
MCTS_LIMIT = "recipe.dataset.limit"  # where an MCTS folder's inputs.json holds its question limit
PRM_EPOCHS = 3  # ProRAG's scripts/prm.sh: --num_train_epochs 3 over its pairs
RFT_SAMPLES = 4  # samples per question for RFT (ProRAG samples its training set; K=4 as cpu_chain.yaml)
RFT_QUESTIONS = 28  # train questions sampled for RFT


@dataclass(frozen=True)
class Chain:
    """What every seed's training chain starts from: the system, the overrides of every training
    recipe, the demo's eval data (agent, retriever, backend blocks), the SFT model and the demo's
    folder."""

    ui: DemoUI
    system: DemoSystem
    overrides: list[str]
    data: dict[str, Any]
    sft: Path
    root: Path
    retrain: bool = False  # DemoOptions.retrain


def _prorag_chain(c: Chain, recipe: str, seed: int) -> tuple[Path, bool]:
    """ProRAG after its SFT model: MCTS step values, a PRM on their sibling pairs, RFT (samples kept
    by outcome and PRM, then SFT on them), and dual-granularity RL with the PRM from the RFT model.
    The MCTS, PRM and RFT stages are the SFT model's (one for every seed); the RL stage is the
    seed's. Returns the RL run and whether anything trained now."""
    ui, s, overrides, data, sft, root = c.ui, c.system, c.overrides, c.data, c.sft, c.root
    threads = [o for o in overrides if o.startswith("optim.threads=")]
    mcts, new = _mcts(ui, shipped(s.extra["mcts"]), data, sft, root / MCTS_DIR, c.retrain)
    prm_over = [f"model.path={json.dumps(str(sft))}", f"prm.data=[{json.dumps(str(mcts))}]", *threads]
    steps = prm_steps(mcts, compose(TrainConfig, [shipped(s.extra["prm"])], prm_over))
    prm_over += [f"trainer.max_steps={steps}", f"trainer.eval_every={steps}"]
    prm_cfg = compose(TrainConfig, [shipped(s.extra["prm"])], prm_over)
    if new:
        safe_delete.remove(root / PRM_RUN, TRAIN_ENTRIES, kind="train", why="harness demo")
    prm, new_prm = _train(ui, prm_cfg, root / PRM_RUN, c.retrain)
    kept, new_set = _rft_set(ui, data, sft, prm, root / RFT_DIR, renew=new or new_prm)
    rft_cfg = compose(
        TrainConfig,
        [shipped(s.extra["rft"])],
        [f"model.path={json.dumps(str(sft))}", f"sft.sources=[{{kind: run, path: {json.dumps(str(kept))}}}]", *threads],
    )
    if new_set:
        safe_delete.remove(root / RFT_DIR / "model", TRAIN_ENTRIES, kind="train", why="harness demo")
    rft, new_rft = _train(ui, rft_cfg, root / RFT_DIR / "model", c.retrain)
    run = root / seeded(s.stage_names[-1], seed)
    earlier = new or new_prm or new_set or new_rft
    if earlier:
        safe_delete.remove(run, TRAIN_ENTRIES, kind="train", why="harness demo")
    rl_over = [*overrides, f"trainer.seed={seed}", f"algo.step_scorer_path={json.dumps(str(prm))}"]
    _, new_rl = _train(ui, rl_stage_config(recipe, s.method, data, rft, run, rl_over), run, c.retrain)
    return run, earlier or new_rl


def prm_steps(mcts: Path, cfg: TrainConfig) -> int:
    """The PRM's steps for ProRAG's :data:`PRM_EPOCHS` epochs over the pairs the MCTS found (ProRAG
    trains by epochs; the number of pairs is only known after the search): the pairs that train
    (after ``prm.val_fraction`` is held out, as the trainer splits them) × the epochs, over
    ``prm.batch_size`` pairs a step, rounded up; at least one."""
    from training.data.mcts import read_pairs  # deferred: flashrag and torch (seconds)

    n = len(read_pairs(mcts))
    train, _ = split_held_out(list(range(n)), cfg.prm.val_fraction, cfg.trainer.seed)
    return max(1, math.ceil(PRM_EPOCHS * len(train) / cfg.prm.batch_size))


def _mcts(ui: DemoUI, recipe: str, data: dict[str, Any], sft: Path, out: Path, retrain: bool) -> tuple[Path, bool]:
    """MCTS step values of the SFT model (the recipe's questions and budget, the evaluation's agent,
    backend and retriever), resumed per question; a folder made for other inputs is cleared first
    (a finished one only with ``retrain``, else refused). Returns the folder and whether it
    searched anything now."""
    from training.data.mcts import run_mcts_recipe  # deferred: flashrag and torch (seconds)

    over = [
        f"backend={json.dumps({**data.get('backend', {}), 'model': str(sft)})}",
        f"retriever={json.dumps(data.get('retriever', {}))}",
        f"agent={json.dumps(data.get('agent', {}))}",
    ]
    inputs = {"recipe": load_yaml(recipe), "overrides": over, "sft": _run_identity(sft.parent)}
    stamp = out / "inputs.json"
    before = json.loads(stamp.read_text()) if stamp.exists() else None
    if mcts_grown(before, inputs) and (out / "done.jsonl").exists():
        ui.say(f"MCTS: the recipe asks for more questions than {out} searched; the searched ones stand, resuming")
        write_json_atomic(stamp, inputs)  # before the search: an interrupted one resumes as this recipe
        before = inputs
    if before == inputs and (out / "done.jsonl").exists():
        stats, _ = run_mcts_recipe([recipe], over, str(out))  # resumes: finished questions are skipped
        if not stats.questions:
            ui.say(f"cached: {out}")
            return out, False
        return out, True
    if not retrain and isinstance(before, dict) and (out / "done.jsonl").exists():
        raise StaleRunError(out, config_differences(before, inputs), RETRAIN_HINT)
    safe_delete.remove(out, MCTS_LAYOUT, kind="mcts", why="harness demo: MCTS of another SFT model or recipe")
    safe_delete.claim(out, "mcts")
    write_json_atomic(stamp, inputs)
    stats, _ = run_mcts_recipe([recipe], over, str(out))
    ui.say(f"MCTS: {stats.summary()} → {out}")
    return out, True


def mcts_grown(before: Any, inputs: dict[str, Any]) -> bool:
    """Whether ``inputs`` ask for the MCTS ``before`` was made for over a longer list of questions:
    the recipe's ``dataset.limit`` raised (or removed), everything else the same, so the questions
    searched before are the list's first ones. Each question's tree depends only on its own id and
    the recipe (:mod:`training.data.mcts` seeds the search per question), so they stand, and the
    search resumes over the added ones instead of starting again."""
    if not isinstance(before, dict):
        return False
    old_rest, new_rest = copy.deepcopy(before), copy.deepcopy(inputs)
    old = pop_paths(old_rest, [MCTS_LIMIT]).get(MCTS_LIMIT)
    new = pop_paths(new_rest, [MCTS_LIMIT]).get(MCTS_LIMIT)
    return old_rest == new_rest and isinstance(old, int) and (new is None or (isinstance(new, int) and new > old))


def _rft_set(ui: DemoUI, data: dict[str, Any], sft: Path, prm: Path, folder: Path, renew: bool) -> tuple[Path, bool]:
    """RFT's data: :data:`RFT_SAMPLES` samples of the SFT model on the first :data:`RFT_QUESTIONS`
    train questions (temperature 0.8, ProRAG's rft_sample.yaml), kept when their F1 is at least 0.5
    and their steps pass the learned PRM (``harness data rft-filter``'s rule, as cpu_chain.yaml).
    Returns the kept run and whether it was (re)made now."""
    from training.data.rft import RFTFilterConfig, rft_filter  # deferred: torch (seconds)

    samples, kept, stamp = folder / "samples", folder / "set", folder / "set.inputs.json"
    if renew:
        for run in sorted(samples.glob("*")) if samples.exists() else []:
            safe_delete.remove(run, RUN_ENTRIES, kind="eval", why="harness demo: samples of an older SFT model")
    sample_cfg = deep_merge(
        _with_model(data, sft),
        {
            "dataset": {"name": "demo", "split": TRAIN_SPLIT, "limit": RFT_QUESTIONS},
            "agent": {"temperature": 0.8},
            "n_samples": RFT_SAMPLES,
            "out": str(samples),
        },
    )
    _evaluate(ui, sample_cfg, ["prorag"])
    cfg = RFTFilterConfig(
        metric="f1",
        min_outcome=0.5,
        step_scorer="prm",
        step_scorer_args={"path": str(prm)},
        step_agg="step",
        step_threshold=0.5,
    )
    inputs = {"config": to_dict(cfg), "sft": _run_identity(sft.parent), "prm": _run_identity(prm.parent)}
    if not renew and stamp.exists() and json.loads(stamp.read_text()) == inputs and kept.exists():
        ui.say(f"cached: {kept}")
        _refuse_an_empty_set(kept, cfg)
        return kept, False
    summary = rft_filter([samples], kept, cfg)
    write_json_atomic(stamp, inputs)
    ui.say(f"RFT set: kept {summary.n_kept} of {summary.n_in} samples ({summary.questions_kept} questions) → {kept}")
    _refuse_an_empty_set(kept, cfg)
    return kept, True


def _refuse_an_empty_set(kept: Path, cfg: RFTFilterConfig) -> None:
    """An RFT set with nothing in it ends the chain, with what dropped every sample and, when the
    PRM did, how far its best step fell short (a PRM trained on a handful of MCTS pairs has an
    arbitrary level: Bradley-Terry fits score differences only)."""
    from training.data.rft import DECISIONS, SUMMARY, RFTSummary  # deferred: torch (seconds)

    summary = RFTSummary(**json.loads((kept / SUMMARY).read_text()))
    if summary.n_kept:
        return
    scores = [s for _, d in read_jsonl(kept / DECISIONS) for s in d.get("step_scores") or []]
    prm = (
        f"; every step the PRM ({cfg.step_scorer_args.get('path')}) scored was below step_threshold "
        f"{cfg.step_threshold:g} (ProRAG's rule, logit >= 0; the highest: {max(scores):.3f}): a Bradley-Terry PRM "
        "learns differences between steps, not their level, so one trained on few MCTS pairs may place none above it"
        if scores and max(scores) < cfg.step_threshold
        else ""
    )
    raise RuntimeError(f"the RFT filter {summary.line()}{prm}; see {kept / DECISIONS}")


def _run_identity(run: Path) -> Any:
    """What identifies a trained model for the stages built on it: its run's recorded config and
    the last line of its metrics (a retrained model with the same config logs other losses)."""
    cfg = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else None
    metrics = (run / "metrics.jsonl").read_text().strip().splitlines() if (run / "metrics.jsonl").exists() else []
    return {"config": cfg, "last": metrics[-1] if metrics else None}


def _train_chain(c: Chain, recipes: list[str], seed: int) -> tuple[Path, bool]:
    """The system's training stages in order for ``seed``, each from the model the one before
    left; returns the last run's folder and whether any stage trained now (a retrained stage
    retrains every stage after it)."""
    ui, s, overrides, data, sft, root = c.ui, c.system, c.overrides, c.data, c.sft, c.root
    if s.chain == "prorag":
        return _prorag_chain(c, recipes[-1], seed)
    model, any_new = sft, False
    for name, recipe in zip(s.stage_names, recipes, strict=True):
        run = root / seeded(name, seed)
        if any_new:  # an earlier stage changed: this one's model is stale
            safe_delete.remove(run, TRAIN_ENTRIES, kind="train", why="harness demo")
        stage_over = [*overrides, f"trainer.seed={seed}"]
        if s.chain == "harr":
            stage_over.append(f"retriever_rl.rl.seed={seed}")  # the retriever trainer's own seed
            cfg = retriever_stage_config(recipe, s.method, data, sft, run, stage_over)
        else:
            cfg = rl_stage_config(recipe, s.method, data, model, run, stage_over)
        final, new = _train(ui, cfg, run, c.retrain)
        model, any_new = final, any_new or new
    return run, any_new


def rl_stage_config(
    recipe: str, method: str, data: dict[str, Any], start: Path, run: Path, overrides: list[str]
) -> TrainConfig:
    """The config an RL stage of the demo trains: ``recipe`` from ``start``, its rollouts the
    evaluation's agent and retriever (``data``: the demo's eval config), so the agent trained is
    the agent evaluated; ``overrides`` last."""
    agent = data.get("agent", {})
    # The evaluation's turn length is the rollouts' (rollout.sampling owns it); its temperature,
    # top_p and seed are evaluation's: rollouts sample as the RL recipe says.
    loop = {k: v for k, v in agent.items() if k not in RolloutAgentConfig.MOVED_KEYS}
    same_agent = [
        f"model.path={json.dumps(str(start))}",
        f"rollout.method={method}",
        f"rollout.agent={json.dumps(loop)}",
        f"rollout.sampling.max_new_tokens={int(agent.get('max_new_tokens', SamplingConfig.max_new_tokens))}",
        f"retriever={json.dumps(data.get('retriever', {}))}",
        f"trainer.out={json.dumps(str(run.parent))}",
    ]
    return compose(TrainConfig, [recipe], [*same_agent, *overrides])


def retriever_stage_config(
    recipe: str, method: str, data: dict[str, Any], generator: Path, run: Path, overrides: list[str]
) -> TrainConfig:
    """The config HARR's stage trains: the query tower by RL with ``generator`` frozen, its rollouts
    through the evaluation's agent options key by key (the recipe's sampling stays: HARR's
    generator samples at 0.7); ``overrides`` last."""
    loop = {k: v for k, v in data.get("agent", {}).items() if k not in ("temperature", "top_p", "seed")}
    same_agent = [
        f"retriever_rl.method={method}",
        f"retriever_rl.backend.model={json.dumps(str(generator))}",
        *(f"retriever_rl.agent.{k}={json.dumps(v)}" for k, v in loop.items()),
        f"trainer.out={json.dumps(str(run.parent))}",
    ]
    return compose(TrainConfig, [recipe], [*same_agent, *overrides])


def _train(ui: DemoUI, cfg: TrainConfig, run: Path, retrain: bool) -> tuple[Path, bool]:
    """Train ``cfg`` into ``run`` unless it holds this config's output (:func:`training.build.train_cached`;
    another config's output is replaced only with ``retrain``, else refused with what differs)."""
    try:
        final, retrained = train_cached(cfg, run, replace=retrain)
    except StaleRunError as e:
        raise StaleRunError(e.run, e.differences, RETRAIN_HINT) from None
    ui.say(f"trained → {final}" if retrained else f"cached: {final} (trained with this recipe)")
    return final, retrained


def _trained_eval(data: dict[str, Any], s: DemoSystem, sft: Path, last_run: Path) -> dict[str, Any]:
    """The evaluation of the trained agent: its model, or (HARR) the SFT generator with the trained
    query tower searching as it was trained (``--retriever harr``)."""
    if s.chain == "harr":
        return _harr_eval(data, sft, last_run / "encoder")
    return _with_model(data, last_run / "final")


def _harr_eval(data: dict[str, Any], generator: Path, encoder: Path) -> dict[str, Any]:
    """``generator`` searching with the query tower ``encoder`` in the state it was saved with."""
    retriever = {**data.get("retriever", {}), "kind": "harr", "encoder": str(encoder)}
    return {**_with_model(data, generator), "retriever": retriever}


# HARR's untrained query tower, saved as a trained one is (its state format in the sidecar).
HARR_START = "retriever-start"


def _harr_start(c: Chain, recipe: str, eval_dir: Path) -> bool:
    """HARR's own start: the SFT generator searching with the recipe's query tower before training,
    in the recipe's history-aware state (what the training's step 0 searches with, greedily),
    evaluated on the test split. The bare-query SFT agent is the user's start; this one is the
    retriever's, so demo.md pairs each trained tower against it too. Returns whether nothing ran
    now. A start tower built from another recipe is replaced, and its evaluation removed."""
    from training.retriever.retriever_rl import save_start_encoder  # deferred: torch (seconds)

    s = c.system
    seed0 = [*c.overrides, "trainer.seed=0", "retriever_rl.rl.seed=0"]
    cfg = retriever_stage_config(recipe, s.method, c.data, c.sft, c.root / seeded(s.stage_names[0], 0), seed0)
    folder, label = c.root / HARR_START, start_label(s)
    written = save_start_encoder(cfg, folder)
    if written:
        safe_delete.remove(eval_dir / f"{label}-demo-test", RUN_ENTRIES, kind="eval", why="harness demo: a new start")
    c.ui.say(f"untrained query tower → {folder}" if written else f"cached: {folder} (this recipe's untrained tower)")
    return _evaluate(c.ui, _harr_eval(c.data, c.sft, folder), [s.method], label) and not written


def _report(ui: DemoUI, s: DemoSystem, eval_dir: Path, out: Path, finals: list[tuple[int, Path, str]]) -> Path:
    # Every row is paired against the SFT agent, where training starts (demo.md pairs the chain:
    # SFT against the untrained agent, each trained agent against SFT); the training runs' folders
    # make the report draw their curves (report.html and out/curves/*.png).
    untrained, sft_label, _ = labels(s)
    report = write_report(
        [str(eval_dir / "*"), *(str(run) for _, run, _ in finals)], out, "md,html,csv", baseline=sft_label
    )
    ui.report(report)
    stages = [eval_dir / f"{name}-demo-test" for name in (untrained, sft_label)]
    # HARR: its own start (the untrained tower in its state) after the SFT agent; the trained
    # towers are paired against it, the leaderboard against the SFT agent as for every system.
    starts = [eval_dir / f"{start_label(s)}-demo-test"] if s.chain == "harr" else []
    stages += starts + [eval_dir / f"{label}-demo-test" for _, _, label in finals]
    seeds = ", ".join(str(seed) for seed, _, _ in finals)
    paired_with = "HARR's start" if starts else "the SFT agent"
    note = (
        f"{s.name}: {s.algorithm}. The baselines and the untrained agent ran on the first {BASELINE_LIMIT} questions "
        f"of the test split (a balanced prefix), the SFT and trained agents on all of it; each pair of stages is "
        f"compared on the questions both answered. Training seeds: {seeds} ({len(finals)} draw"
        f"{'s' if len(finals) > 1 else ''}; each trained agent is paired against {paired_with})."
    )
    for seed, run, _ in finals:
        if chosen := _rl_choice(run):
            note += f" Seed {seed}: {chosen}"
    if starts:
        note += (
            f" HARR's start ({start_label(s)}) is the SFT agent searching with the untrained query tower in HARR's "
            "history-aware state, as its training starts; the leaderboard pairs every row against the SFT agent."
        )
    against = [None, 0] + ([1] if starts else []) + [1 + len(starts)] * len(finals)
    text = summarize(*stages, curves=[(Path(c).stem, c) for c in report.curves], note=note, against=against)
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
