"""``harness prompt``: print exactly what a model sees under a method's dialect."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cli.common import fail
from cli.options import Variant


def prompt_command(
    method: str = typer.Option(..., "--method", "-m", help="An agent method (its dialect): research, search_r1, ..."),
    question: str = typer.Option(..., "--question", "-q", help="The question to render."),
    docs: Path | None = typer.Option(
        None, "--docs", help="FlashRAG corpus JSONL: show the observation after a search that returned these docs."
    ),
    query: list[str] = typer.Option(
        [], "--query", help="Query (repeatable) the observation answers; default the question."
    ),
    model: str = typer.Option(
        "smollm2-135m-instruct", "--model", help="Tokenizer whose chat template is applied ('none': no template)."
    ),
    template: Path | None = typer.Option(None, "--template", help="A prompt-template file replacing the dialect's."),
    variant: Variant = "exact",
    mode: str | None = typer.Option(
        None, "--mode", help="eval or train, for a dialect whose two codes differ (RAG-R1); default eval."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on the last line."),
) -> None:
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.registry import RegistryError
    from harness.retrieval.corpus import read_corpus
    from pipelines.dialects import resolve_dialect
    from pipelines.dialects.inspect import describe
    from pipelines.methods import method_kind

    try:
        if method_kind(method) != "agent":
            fail(f"--method {method!r} is a baseline, not an agent dialect")
        dialect = resolve_dialect(method, variant, str(template) if template else None, mode)
        documents = read_corpus(docs) if docs is not None else None  # titles verbatim, quotes kept
    except (RegistryError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    tokenizer = None
    if model.lower() != "none" and dialect.placement != "raw":
        # deferred: the command's library loads when it runs, not at every harness --help
        from harness.models import load_tokenizer

        try:
            tokenizer = load_tokenizer(model)
        except OSError as e:
            fail(f"--model {model!r}: {e}")
    out = {"method": method, "model": None if tokenizer is None else model}
    out |= describe(dialect, question, tokenizer, documents, tuple(query) or None)
    if as_json:
        typer.echo(json.dumps(out, ensure_ascii=False))
        return
    _print(out)


def _print(out: dict) -> None:
    # deferred: the command's library loads when it runs, not at every harness --help
    from rich.console import Console
    from rich.rule import Rule

    console = Console()
    src = out["source"]
    console.print(
        f"[bold]{out['method']}[/] — dialect {out['dialect']} ({out['system']}), prompt in {out['placement']}"
    )
    if src.get("repository"):
        console.print(f"source: {src['repository']} @ {src['commit']}: {'; '.join(src['files'])}", highlight=False)
    for title, value in (("messages", out["messages"]), ("text", out["text"]), ("observation", out["observation"])):
        console.print(Rule(title))
        # Raw text, whitespace as is (``--json`` shows every newline unambiguously).
        body = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
        console.out(body, highlight=False)
    console.print(Rule("turns"))
    console.print(f"stops (search turn): {out['stops']['search_turn']}", highlight=False)
    console.print(f"stops (final turn):  {out['stops']['final_turn']}; EOS {out['eos']}", highlight=False)
    console.print(f"token-limit cut: {out['length_cut']}; final no-search turn: {out['final_turn']}", highlight=False)
    console.print(
        f"mode: {out['mode']}" + (f" (of {', '.join(out['modes'])})" if out["modes"] else ""), highlight=False
    )
    console.print(f"answer: {out['answer']}", highlight=False)
    console.print(f"after an invalid action: {out['corrective']!r}", highlight=False)
    for note in out["notes"]:
        console.print(f"note: {note}", highlight=False)
    for diff in out["differences"] or ["(none known)"]:
        console.print(f"differs from the original: {diff}", highlight=False)
    for diff in out["flashrag_differences"]:
        console.print(f"differs from FlashRAG's port: {diff}", highlight=False)
