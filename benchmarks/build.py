"""From names to objects: the one place an evaluation is built from an :class:`EvalConfig`.

:func:`build_eval` turns a config into an :class:`EvalRun` (examples, the method with its
backend and retriever, the run directory and its manifest); :func:`simple_evaluate` builds one
and runs it through :func:`benchmarks.evaluate.evaluate`. The CLI, training validation, the perf
scripts and the tests all come through here (compare lm-evaluation-harness's
``simple_evaluate``, which builds what ``evaluate`` takes).

Everything is validated before anything is written: a typo in a method option fails here and
leaves no run folder behind. The manifest's config omits keys that only change how a run
executes (:data:`EXECUTION_ONLY_KEYS`), so changing them resumes the same run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.answerability import known_answerability, retriever_index_dir
from benchmarks.datasets import corpus_path, examples_hash, get_spec, load_examples
from benchmarks.evaluate import evaluate
from benchmarks.judge import JudgeConfig, LLMJudge, judge_identity
from benchmarks.metrics import METRICS
from benchmarks.profiles import JUDGE, get_profile
from harness.backends import build_backend
from harness.backends.dtype import choose_dtype
from harness.config import pop_paths, to_dict
from harness.eval_config import EvalConfig, RetrieverConfig
from harness.retrieval.factory import build_retriever, needs_corpus
from harness.run_records import ItemScore, RunManifest, RunResults
from harness.runlock import run_lock
from harness.runlog import file_hash
from harness.types import Example
from pipelines.method import check_schedule
from pipelines.methods import (
    build_method,
    check_method_backend,
    check_method_schedule,
    method_kind,
    needs_retriever,
    validate_options,
)

logger = logging.getLogger(__name__)

# Config keys that change how a run executes, never what it computes: left out of the config
# hash, so a run resumes with another concurrency, server URL or data folder.
EXECUTION_ONLY_KEYS = (
    "out",
    "dataset.data_dir",
    "backend.url",
    "backend.launch",
    "backend.engine",
    "backend.max_concurrency",
    "backend.timeout",
    "backend.retries",
    "backend.max_batch_size",
    "backend.batch_window_ms",  # how requests are grouped into POSTs, not what is generated
    "backend.prefix_cache_tokens",  # hf: KV reuse is token-exact, it changes only the time
    "backend.threads",
    "retriever.timeout",
    "retriever.retries",
    "retriever.faiss_gpu",
    "retriever.faiss_shard",
    "agent.max_concurrency",
    "baseline.max_concurrency",
    "judge.url",
    "judge.api_key_env",
    "judge.timeout",
    "judge.retries",
    "stop_after_failures",
    "schedule",  # the order turns run in, not what they compute (recorded under the manifest's execution)
)
# Keys added after runs were first recorded: left out of the identity at their default, so a
# run started before they existed still resumes.
_OMIT_AT_DEFAULT = {"metric_profile": "default", "judge": {}, "n_samples": 1, "label": None}


@dataclass
class EvalRun:
    """Everything one (method, dataset) evaluation needs, built and validated."""

    config: EvalConfig
    examples: list[Example]
    method: Any  # pipelines.methods.Method
    backend: Any
    retriever: Any
    run_dir: Path
    manifest: RunManifest


def split_config(cfg: EvalConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(identity, execution): the resolved config less :data:`EXECUTION_ONLY_KEYS`, which
    identifies the run, and those keys' values by dotted name."""
    out = to_dict(cfg)
    if cfg.backend.kind == "hf" and cfg.backend.dtype == "auto":
        # What is computed is the dtype auto picks on this machine: a run resumed on a CPU that
        # picks another is another run.
        out["backend"]["dtype"] = choose_dtype("auto")[0]
    execution = pop_paths(out, EXECUTION_ONLY_KEYS)
    for key, default in _OMIT_AT_DEFAULT.items():
        if out.get(key) == default:
            out.pop(key, None)
    return out, execution


def validate_metrics(cfg: EvalConfig) -> None:
    """Every metric is known, the profile exists, and the judge options (when given) are valid."""
    get_profile(cfg.metric_profile)
    for m in cfg.metrics:
        if m != JUDGE:
            METRICS.get(m)
    JudgeConfig.from_options(dict(cfg.judge))


def _with_judge_identity(config: dict[str, Any], cfg: EvalConfig) -> dict[str, Any]:
    """With the ``judge`` metric, the run's config names the judge's prompt, model and decoding."""
    if "judge" in cfg.metrics:
        config["judge"] = {**config.get("judge", {}), **judge_identity(JudgeConfig.from_options(dict(cfg.judge)))}
    return config


def build_judge(cfg: EvalConfig, run_dir: Path) -> Any:
    """The run's LLM judge (None unless the ``judge`` metric is asked for and ``judge.url`` is set)."""
    if "judge" not in cfg.metrics:
        return None
    jcfg = JudgeConfig.from_options(dict(cfg.judge))
    if not jcfg.url:
        logger.warning("metric 'judge' asked for without judge.url: every item's judge score is missing")
        return None
    return LLMJudge(jcfg, cache_dir=run_dir)


def eval_split(cfg: EvalConfig) -> str:
    """The split a config evaluates: the given one, or the dataset's default eval split."""
    return cfg.dataset.split or get_spec(cfg.dataset.name).default_split


def run_dir_for(cfg: EvalConfig) -> Path:
    """``OUT/<name>-<dataset>-<split>`` (name: the label, else the method), with ``-k<K>`` when K
    samples are drawn per question (so a K-sample run and a greedy run of the same pair live side
    by side)."""
    suffix = f"-k{cfg.n_samples}" if cfg.n_samples > 1 else ""
    return Path(cfg.out) / f"{cfg.name}-{cfg.dataset.name}-{eval_split(cfg)}{suffix}"


def validate_n_samples(cfg: EvalConfig, kind: str, options: Any) -> None:
    """K > 1 samples per question must be able to differ: the agent with ``temperature > 0``.
    FlashRAG's baselines decode greedily, so their K samples would be K copies."""
    if cfg.n_samples == 1:
        return
    if kind != "agent":
        raise ValueError(
            f"n_samples={cfg.n_samples}: method {cfg.method!r} is a baseline, which decodes greedily "
            "(its samples would be identical); sample with an agent method"
        )
    if options.temperature <= 0:
        raise ValueError(
            f"n_samples={cfg.n_samples} with agent.temperature={options.temperature}: greedy samples are "
            "identical; set agent.temperature > 0 (ProRAG's RFT samples at 0.8)"
        )


def load_eval_examples(cfg: EvalConfig) -> list[Example]:
    d = cfg.dataset
    return load_examples(d.name, d.split, data_dir=d.data_dir, limit=d.limit, sample=d.sample, seed=d.seed)


def default_corpus(rcfg: RetrieverConfig, dataset: str, split: str | None, data_dir: str | None) -> Path | None:
    """The dataset split's own corpus when the retriever needs one and names none; else None."""
    if not needs_corpus(rcfg):
        return None
    corpus = corpus_path(dataset, split, data_dir=data_dir)
    if corpus is None:
        raise ValueError(
            f"no corpus known for dataset {dataset!r} split {split!r}: pass --index DIR "
            "(a built index) or retriever.corpus=FILE (a FlashRAG-format corpus JSONL)"
        )
    return corpus


def dataset_retriever(
    rcfg: RetrieverConfig, dataset: str, split: str | None = None, data_dir: str | None = None
) -> Any:
    """The configured retriever, over the dataset split's own corpus unless the config names one."""
    corpus = default_corpus(rcfg, dataset, split, data_dir)
    return build_retriever(rcfg, str(corpus) if corpus else None)


def check_eval(cfg: EvalConfig) -> tuple[str, dict[str, Any], Any]:
    """The checks of ``cfg`` that build nothing (its method's options, samples, metrics and
    schedule); returns the method's kind, its options and their typed form. A run of several
    configs makes them for every one before the first starts (:func:`benchmarks.eval_runs.run_configs`)."""
    kind = method_kind(cfg.method)
    options = dict(cfg.agent if kind == "agent" else cfg.baseline)
    options.setdefault("topk", cfg.retriever.topk)
    typed = validate_options(cfg.method, options)
    validate_n_samples(cfg, kind, typed)
    validate_metrics(cfg)
    check_method_schedule(cfg.method, cfg.schedule)
    check_method_backend(cfg.method, cfg.backend.kind)
    return kind, options, typed


def build_eval(
    cfg: EvalConfig, backend: Any = None, retriever: Any = None, examples: list[Example] | None = None
) -> EvalRun:
    """Validate ``cfg`` and build its evaluation. ``backend`` / ``retriever``: already built ones
    to use instead (a shared backend, training's current policy); ``examples``: questions already
    loaded (held-out questions of a training run), evaluated instead of ``cfg.dataset``'s."""
    kind, options, typed = check_eval(cfg)  # before anything slow is built or anything is written
    examples = load_eval_examples(cfg) if examples is None else list(examples)
    # An agent with no search turn (a closed-book run: agent.max_turns=0) never searches.
    uses_retriever = needs_retriever(cfg.method) and not (kind == "agent" and typed.max_turns == 0)
    corpus = None
    if uses_retriever and retriever is None:
        d = cfg.dataset
        corpus = default_corpus(cfg.retriever, d.name, d.split, d.data_dir)
        retriever = build_retriever(cfg.retriever, str(corpus) if corpus else None)
    corpus = Path(cfg.retriever.corpus) if uses_retriever and cfg.retriever.corpus else corpus
    if backend is None:
        backend = build_backend(cfg.backend)
    method = build_method(cfg.method, backend, retriever if uses_retriever else None, options)
    check_schedule(method, cfg.schedule)  # a baseline cannot run turn-synchronously: refused by name
    identity, execution = split_config(cfg)
    manifest = RunManifest(
        method=cfg.name,  # the label when given: what reports call the run
        method_kind=kind,
        dataset=cfg.dataset.name,
        split=eval_split(cfg),
        config=_with_judge_identity(identity, cfg),
        execution=execution,
        model=cfg.backend.model if cfg.backend.kind != "scripted" else "scripted",
        backend=cfg.backend.kind,
        retriever=cfg.retriever.kind if uses_retriever else None,
        topk=cfg.retriever.topk if uses_retriever else None,
        n_total=len(examples) * cfg.n_samples,
        data_hash=examples_hash(examples),
        index_id=getattr(retriever, "index_id", None) if uses_retriever else None,
        corpus=str(corpus) if corpus else None,
        corpus_hash=file_hash(corpus) if corpus else None,
        chat_template=getattr(method, "use_chat", None) if kind == "agent" else None,
    )
    if uses_retriever:
        manifest.answerability = _answerability(retriever, examples, cfg.retriever.topk)
    return EvalRun(cfg, examples, method, backend, retriever, run_dir_for(cfg), manifest)


def _answerability(retriever: Any, examples: list[Example], topk: int) -> dict[str, Any] | None:
    """The shares ``harness index check`` recorded beside the run's index for these questions
    (None when it has not checked them on this index)."""
    a = known_answerability(retriever_index_dir(retriever), getattr(retriever, "index_id", None), examples, topk)
    return a.to_dict() if a else None


def preflight(backend: Any, retriever: Any) -> None:
    """One health call each before the first item, so a dead server fails in a second."""
    check = getattr(backend, "check", None)
    if check is not None:
        check()
    check = getattr(retriever, "check", None) if retriever is not None else None
    if check is not None:
        check()


def simple_evaluate(
    cfg: EvalConfig,
    backend: Any = None,
    retriever: Any = None,
    on_item: Callable[[ItemScore], None] | None = None,
    run: EvalRun | None = None,
    examples: list[Example] | None = None,
) -> RunResults:
    """Build (unless ``run`` is given) and run one evaluation; returns its results. ``backend``,
    ``retriever``, ``examples``: as :func:`build_eval` takes them. The run directory is locked
    from the preflight on (:func:`harness.runlock.run_lock`)."""
    run = run or build_eval(cfg, backend, retriever, examples)
    with run_lock(run.run_dir, "eval"):  # a second writer is refused before its preflight
        preflight(run.backend, run.retriever if run.manifest.retriever else None)
        return _run(cfg, run, on_item)


def _run(cfg: EvalConfig, run: EvalRun, on_item: Callable[[ItemScore], None] | None) -> RunResults:
    judge = build_judge(cfg, run.run_dir)

    response_only = get_profile(cfg.metric_profile).answer_in_response_only
    try:
        results = evaluate(
            run.method,
            run.examples,
            run.run_dir,
            cfg.metrics,
            run.manifest,
            on_item=on_item,
            n_samples=cfg.n_samples,
            judge=judge,
            response_only=response_only,
            health=lambda: preflight(run.backend, run.retriever if run.manifest.retriever else None),
            stop_after_failures=cfg.stop_after_failures,
            schedule=cfg.schedule,
        )
        if judge is not None:
            judge.write_record(run.run_dir)  # the prompt, model and decoding the verdicts came from
    finally:
        if judge is not None:
            judge.close()
    return results
