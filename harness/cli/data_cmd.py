"""``harness data synthesize --dataset D --split S --dialect M [--variant small] [--limit N] --out FILE``

Protocol-following SFT trajectories without a teacher (:mod:`training.synthesize`): the gold
decomposition's hops searched for real through the configured retriever, rendered in the
dialect, kept only when retrieval surfaced each hop's gold. Prints how many it kept of how many.
"""

from __future__ import annotations

import typer

from harness.cli.common import console, fail

app = typer.Typer(no_args_is_help=True)


@app.command("synthesize")
def synthesize_command(
    dataset: str = typer.Option(..., "--dataset", help="A registered dataset (harness datasets)."),
    split: str = typer.Option(None, "--split", help="Its split (default: the dataset's default)."),
    dialect: str = typer.Option(..., "--dialect", help="The agent dialect to write in (research, search_r1, ...)."),
    variant: str = typer.Option("exact", "--variant", help="exact, or small (<dialect>_small, our wording)."),
    out: str = typer.Option(..., "--out", help="Output JSONL (an sft source of kind synth)."),
    limit: int = typer.Option(None, "--limit", help="At most N questions."),
    offset: int = typer.Option(
        0, "--offset", help="Skip the first N questions (keep SFT and eval questions disjoint)."
    ),
    data_dir: str = typer.Option(None, "--data-dir", help="FlashRAG-layout data dir."),
    topk: int = typer.Option(3, "--topk", help="Documents per search (the agent's topk)."),
    retriever: str = typer.Option("bm25", "--retriever", help="Retriever kind (bm25, dense, http, memory)."),
    index: str = typer.Option(None, "--index", help="A built index directory."),
    url: str = typer.Option(None, "--url", help="http retriever URL."),
    tokenizer: str = typer.Option(
        None,
        "--tokenizer",
        help="Cap inserted documents to --max-doc-tokens of this model's tokenizer, as the agent does.",
    ),
    max_doc_tokens: int = typer.Option(128, "--max-doc-tokens"),
) -> None:
    """Write synthesized trajectories; see the module docstring."""
    from benchmarks.build import dataset_retriever
    from benchmarks.datasets import corpus_path, load_examples
    from harness.eval_config import RetrieverConfig
    from pipelines.dialects import resolve_dialect
    from training.synthesize import corpus_titles, synthesize

    try:
        d = resolve_dialect(dialect, variant)
        examples = load_examples(dataset, split, data_dir=data_dir)[offset:]
        examples = examples[:limit] if limit is not None else examples
        rcfg = RetrieverConfig(kind=retriever, index=index, url=url, topk=topk)
        ret = dataset_retriever(rcfg, dataset, split, data_dir)
        needs_titles = any("supporting_doc_ids" in (e.metadata or {}) for e in examples)
        titles = corpus_titles(corpus_path(dataset, split, data_dir)) if needs_titles else {}
        tok = None
        if tokenizer:
            from harness.models import load_tokenizer

            tok = load_tokenizer(tokenizer)
        stats = synthesize(examples, d, ret, out, topk, tok, max_doc_tokens, titles)
    except (ValueError, FileNotFoundError, KeyError) as e:
        fail(f"{type(e).__name__}: {e}")
    console.print(f"{d.name}: {stats.summary()} → {out}")
