"""``harness data synthesize --dataset D --split S --dialect M [--variant small] [--limit N] --out FILE``

Protocol-following SFT trajectories without a teacher (:mod:`training.synthesize`): the gold
decomposition's hops searched for real through the configured retriever, rendered in the
dialect, kept only when retrieval surfaced each hop's gold. Prints how many it kept of how many.

``harness data rft-filter RUN_DIR... --out DIR [--step-scorer NAME --step-scorer-arg k=v ...]``

RFT's filter (:mod:`training.data.rft`): of the sampled trajectories of ``harness eval --n-samples K``
runs, keep those with a right outcome and step scores that pass a threshold, as a run directory
that ``algo.kind: sft`` reads (``{kind: run, path: DIR}``), with a summary of what it kept and why.

``harness data harr-filter -c RECIPE --out FILE``: HARR's training-set filter, the questions where
some sampled retrievals succeed and some fail under the frozen generator (a ``data.file`` for an
``algo.kind: retriever`` recipe).
"""

from __future__ import annotations

import typer

from cli.common import console, error_text, fail
from cli.options import DataDir, TopK, Variant

app = typer.Typer(no_args_is_help=True)


@app.command("synthesize")
def synthesize_command(
    dataset: str = typer.Option(..., "--dataset", help="A registered dataset (harness datasets)."),
    split: str = typer.Option(None, "--split", help="Its split (default: the dataset's default)."),
    dialect: str = typer.Option(..., "--dialect", help="The agent dialect to write in (research, search_r1, ...)."),
    variant: Variant = "exact",
    out: str = typer.Option(..., "--out", help="Output JSONL (an sft source of kind synth)."),
    limit: int = typer.Option(None, "--limit", help="At most N questions."),
    offset: int = typer.Option(
        0, "--offset", help="Skip the first N questions (keep SFT and eval questions disjoint)."
    ),
    data_dir: DataDir = None,
    topk: TopK = 3,
    retriever: str = typer.Option("bm25", "--retriever", help="Retriever kind (bm25, dense, http, memory)."),
    index: str = typer.Option(None, "--index", help="A built index directory."),
    url: str = typer.Option(None, "--url", help="http retriever URL."),
    tokenizer: str = typer.Option(
        None,
        "--tokenizer",
        help="Cap inserted documents to --max-doc-tokens of this model's tokenizer, as the agent does.",
    ),
    max_doc_tokens: int = typer.Option(128, "--max-doc-tokens"),
    template: str = typer.Option(None, "--chat-template", help="A chat template file (tool_call) the records name."),
) -> None:
    """Write synthesized trajectories; see the module docstring."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.eval_config import RetrieverConfig
    from training.synthesize import synthesize_split

    try:
        rcfg = RetrieverConfig(kind=retriever, index=index, url=url, topk=topk)  # type: ignore[arg-type]
        name, stats = synthesize_split(
            dataset, dialect, out, split, variant, limit, offset, data_dir, rcfg, tokenizer, max_doc_tokens, template
        )
    except (ValueError, FileNotFoundError, KeyError) as e:
        fail(error_text(e))
    console.print(f"{name}: {stats.summary()} → {out}")


@app.command("mcts")
def mcts_command(
    config: list[str] = typer.Option(None, "-c", "--config", help="MCTS config YAML (configs/train/prorag/mcts.yaml)."),
    out: str = typer.Option(None, "--out", help="Output folder (default: the config's out)."),
    data_dir: DataDir = None,
    model: str = typer.Option(None, "--model", help="The policy to search with (backend.model)."),
    limit: int = typer.Option(None, "--limit", help="At most N questions."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. mcts.num_simulations=20"),
) -> None:
    """MCTS step values and contrastive step pairs for a PRM (training.data.mcts), through the agent loop.

    Appends per question to OUT/steps.jsonl, OUT/pairs.jsonl and OUT/done.jsonl; a rerun skips the
    finished questions (resume after an interrupt)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.config import ConfigError
    from training.data.mcts import run_mcts_recipe

    extra = list(overrides or [])
    extra += [f"dataset.data_dir={data_dir}"] if data_dir else []
    extra += [f"backend.model={model}"] if model else []
    extra += [f"dataset.limit={limit}"] if limit else []
    try:
        stats, folder = run_mcts_recipe(list(config or []), extra, out)
    except (ConfigError, ValueError, FileNotFoundError, KeyError) as e:
        fail(error_text(e))
    console.print(f"MCTS: {stats.summary()} → {folder}")


def _scorer_args(pairs: list[str]) -> dict:
    """``key=value`` pairs → options (values read as YAML scalars: 0.5, true, a path)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.config import ConfigError, parse_yaml

    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key.strip():
            fail(f"--step-scorer-arg {p!r}: expected key=value")
        try:
            out[key.strip()] = parse_yaml(value, f"--step-scorer-arg {p!r}: value") if value.strip() else ""
        except ConfigError as e:
            fail(str(e))
    return out


@app.command("rft-filter")
def rft_filter_command(
    run_dirs: list[str] = typer.Argument(
        ..., help="Run directories of `harness eval --n-samples K` (or folders of them: an eval --out)."
    ),
    out: str = typer.Option(..., "--out", help="Directory for the kept run (an sft source {kind: run, path: OUT})."),
    metric: str = typer.Option("em", "--metric", help="Outcome metric of scores.jsonl."),
    min_outcome: float = typer.Option(1.0, "--min-outcome", help="Keep when the outcome metric is at least this."),
    where: str = typer.Option(None, "--where", help="Extra filter on the scores, e.g. 'n_searches >= 1'."),
    step_scorer: str = typer.Option(
        "none", "--step-scorer", help="A step scorer (training.rewards.STEP_SCORERS: rule, prm, ...), or none."
    ),
    step_scorer_arg: list[str] = typer.Option(
        None, "--step-scorer-arg", help="key=value option of the step scorer (repeatable), e.g. path=runs/prm/final."
    ),
    step_agg: str = typer.Option("min", "--step-agg", help="min | mean | step (ProRAG: train only passing steps)."),
    step_threshold: float = typer.Option(0.5, "--step-threshold", help="In the scorer's units (PRM sigmoid: 0.5)."),
    dedupe: bool = typer.Option(True, "--dedupe/--no-dedupe", help="Drop repeated responses to one question."),
) -> None:
    """RFT: keep sampled trajectories with a right outcome and good step scores (training.data.rft)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.runlog import RunDirError
    from training.data.rft import SUMMARY, RFTFilterConfig, rft_filter

    try:
        cfg = RFTFilterConfig(
            metric=metric,
            min_outcome=min_outcome,
            where=where,
            step_scorer=None if step_scorer.lower() == "none" else step_scorer,
            step_scorer_args=_scorer_args(step_scorer_arg or []),
            step_agg=step_agg,  # type: ignore[arg-type]
            step_threshold=step_threshold,
            dedupe=dedupe,
        )
        summary = rft_filter(run_dirs, out, cfg)
    except (ValueError, KeyError, FileNotFoundError, RunDirError) as e:  # RegistryError is a KeyError
        fail(error_text(e))
    console.print(f"rft-filter: {summary.line()} → {out} ({SUMMARY})", highlight=False)
    if not summary.n_kept:
        fail("nothing passed the filter: no SFT data (see decisions.jsonl for why)")


@app.command("harr-filter")
def harr_filter_command(
    config: list[str] = typer.Option(None, "-c", "--config", help="A retriever-RL recipe (algo.kind: retriever)."),
    out: str = typer.Option(..., "--out", help="Where to write the kept questions (FlashRAG JSONL)."),
    samples: int = typer.Option(8, "--samples", help="Sampled retrievals per question."),
    metric: str = typer.Option("em", "--metric", help="em | f1: the success measure."),
    threshold: float = typer.Option(1.0, "--threshold", help="A sample succeeds when metric >= this."),
    data_dir: DataDir = None,
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides of the recipe."),
) -> None:
    """HARR: keep the training questions where sampled retrievals change the outcome
    (training.retriever.retriever_rl)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.config import ConfigError
    from training.build import train_config
    from training.retriever.retriever_rl import harr_filter

    try:
        cfg = train_config(list(config or []), list(overrides or []), data_dir)
        path, stats, kept, total = harr_filter(cfg, out, samples, metric, threshold)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError, KeyError) as e:
        fail(error_text(e))
    console.print(f"kept {kept}/{total} questions → {path} (per-question counts: {stats})")


@app.command("rag-r1-train")
def rag_r1_train_command(
    out: str = typer.Option(..., "--out", help="Where to write the questions (FlashRAG JSONL, for data.file)."),
    source: str = typer.Option(None, "--source", help="A local copy of RAG-R1's train_data.json (default: download)."),
) -> None:
    """RAG-R1's filtered HotpotQA training set (6,664 questions) as a data.file (benchmarks.rag_r1_data)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.rag_r1_data import rag_r1_train

    try:
        n = rag_r1_train(out, source)
    except (ValueError, RuntimeError, OSError) as e:
        fail(error_text(e))
    console.print(f"rag-r1-train: {n} questions → {out}")
