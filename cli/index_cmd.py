"""``harness index``: build and inspect retrieval indexes."""

from __future__ import annotations

import json

import typer

from cli.common import console, fail
from cli.options import DataDir, Limit

app = typer.Typer(no_args_is_help=True)


@app.command("build")
def build(
    corpus: str = typer.Option(..., "--corpus", help="FlashRAG-format corpus JSONL ({id, contents})."),
    kind: str = typer.Option("bm25", "--kind", help="bm25 | dense"),
    out: str = typer.Option(..., "--out", help="Index directory to write."),
    model: str = typer.Option(None, "--model", help="Dense encoder: all-MiniLM-L6-v2 (default), a path or hub id."),
    faiss_kind: str = typer.Option("flat", "--faiss", help="Dense index type: flat | hnsw"),
) -> None:
    """Build a BM25 or dense index over a FlashRAG-format corpus."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.retrieval.corpus import CorpusError
    from harness.retrieval.index import IndexLoadError, build_index

    if kind == "bm25" and model:
        fail("--model applies to dense indexes only (BM25 has no encoder)")
    try:
        manifest = build_index(corpus, kind, out, model=model, faiss_kind=faiss_kind)
    except (CorpusError, IndexLoadError, ValueError, RuntimeError, OSError) as e:  # RuntimeError: encoder
        fail(str(e))
    console.print(f"built {kind} index of {manifest['num_docs']} documents in {manifest['build_seconds']} s → {out}")


@app.command("info")
def info(index: str = typer.Argument(..., help="Index directory.")) -> None:
    """Print an index's manifest."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.retrieval.index import IndexLoadError, read_manifest

    try:
        typer.echo(json.dumps(read_manifest(index), indent=2))
    except IndexLoadError as e:
        fail(str(e))


@app.command("import")
def import_cmd(
    faiss_file: str = typer.Option(..., "--faiss", help="FlashRAG/Search-R1 FAISS index file (e.g. e5_Flat.index)."),
    corpus: str = typer.Option(..., "--corpus", help="The corpus JSONL it was built on (row i = vector i)."),
    model: str = typer.Option(..., "--model", help="Encoder it was built with, e.g. intfloat/e5-base-v2."),
    out: str = typer.Option(..., "--out", help="Index directory to write (manifest + row offsets; no copies)."),
    model_path: str = typer.Option(None, "--model-path", help="Load the encoder's weights from this directory."),
    pooling: str = typer.Option(None, "--pooling", help="mean | cls (default: the encoder table's)."),
    query_prefix: str = typer.Option(None, "--query-prefix", help='Query prefix (table default; e5: "query: ").'),
    passage_prefix: str = typer.Option(None, "--passage-prefix", help="Passage prefix (recorded only)."),
) -> None:
    """Wrap an existing FlashRAG/Search-R1 FAISS index and its corpus in an index directory, in place."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.retrieval.index import IndexLoadError, import_index

    try:
        m = import_index(faiss_file, corpus, out, model, pooling, query_prefix, passage_prefix, model_path=model_path)
    except (IndexLoadError, ValueError, OSError) as e:
        fail(str(e))
    console.print(
        f"imported {m['faiss']} index of {m['num_docs']} vectors ({m['dim']}-d, {m['model']}, {m['pooling']} pooling, "
        f"query prefix {m['query_prefix']!r}) → {out}"
    )


@app.command("download")
def download_cmd(
    name: str = typer.Argument(None, help="A published setting (see --list), e.g. wiki18-e5."),
    dest: str = typer.Option(None, "--dir", help="Where the files go (default: $HARNESS_CACHE/prebuilt/NAME)."),
    no_import: bool = typer.Option(False, "--no-import", help="Only download; do not write DIR/index."),
    list_: bool = typer.Option(False, "--list", help="List the published settings and exit."),
) -> None:
    """Download a published wiki-18 corpus / E5 index from the hub (resumable) and import it."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.hub import HubError
    from harness.retrieval.index import IndexLoadError
    from harness.retrieval.prebuilt import PREBUILT, download_prebuilt

    if list_ or not name:
        for n in PREBUILT.names():
            p = PREBUILT.get(n)
            files = ", ".join(str(f) for f in (*p.index_parts, p.corpus))
            console.print(f"[bold]{n}[/bold]: {p.description}\n    {files}")
        return
    if name not in PREBUILT.names():
        fail(f"unknown published setting {name!r}; known: {', '.join(PREBUILT.names())}")
    try:
        got = download_prebuilt(name, dest, do_import=not no_import)
    except (HubError, IndexLoadError, OSError) as e:
        fail(str(e))
    console.print(f"corpus: {got['corpus']}")
    if got["faiss"]:
        console.print(f"FAISS index: {got['faiss']}")
    if got["index"]:
        console.print(f"index: {got['index']}  (harness serve retriever --index {got['index']})")


@app.command("check")
def check_cmd(
    index: str = typer.Option(..., "--index", help="Index directory (built or imported)."),
    datasets: list[str] = typer.Option(..., "--dataset", help="Dataset to check (repeat for several)."),
    split: str = typer.Option(None, "--split", help="Split (default: each dataset's default split)."),
    topk: int = typer.Option(5, "--topk", help="Retrievable: an answer in the top-k passages for the question."),
    data_dir: DataDir = None,
    limit: Limit = None,
    workers: int = typer.Option(1, "--workers", help="Processes scanning the corpus in parallel."),
) -> None:
    """How answerable each question is on the index's corpus: a gold answer in the corpus, and in the top-k."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.answerability import check_index, check_lines
    from harness.retrieval.index import IndexLoadError

    try:
        report = check_index(index, datasets, split, topk, data_dir, limit, workers)
    except (IndexLoadError, ValueError, KeyError, OSError) as e:  # KeyError: an unknown dataset
        fail(str(e))
    for line in check_lines(report):
        console.print(line, highlight=False, soft_wrap=True)
