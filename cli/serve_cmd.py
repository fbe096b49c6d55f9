"""``harness serve``: the retriever server, and model engines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.common import console, error_text, fail, say
from cli.options import Host, Model, Port

app = typer.Typer(no_args_is_help=True)


@app.command("retriever")
def retriever(
    index: str = typer.Option(..., "--index", help="Index directory (harness index build)."),
    host: Host = "127.0.0.1",
    port: Port = 8000,
    max_k: int = typer.Option(100, "--max-k", help="Largest k a request may ask for."),
    default_k: int = typer.Option(3, "--default-k", help="k when a Search-R1/R1-Searcher request gives none."),
    max_batch: int = typer.Option(256, "--max-batch", help="Most queries concurrent requests share in one search."),
    max_wait_ms: float = typer.Option(
        0.0, "--max-wait-ms", help="Hold a batch this long to collect more requests (0: batch what queued)."
    ),
    embed_cache: int = typer.Option(50_000, "--embed-cache", help="Query embeddings cached (dense; 0: none)."),
    access_log: bool = typer.Option(False, "--access-log/--no-access-log", help="One log line per request."),
) -> None:
    """Serve an index over the Search-R1, FlashRAG and R1-Searcher HTTP APIs (and /health, /metrics)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.retrieval.index import IndexLoadError, load_index
    from harness.retrieval.server import serve

    if not 1 <= default_k <= max_k:
        fail(f"--default-k must be between 1 and --max-k ({max_k}), got {default_k}")
    if max_batch < 1 or max_wait_ms < 0 or embed_cache < 0:
        fail(
            f"--max-batch must be >= 1, --max-wait-ms and --embed-cache >= 0 "
            f"(got {max_batch}, {max_wait_ms}, {embed_cache})"
        )
    try:
        r = load_index(index)
    except (IndexLoadError, RuntimeError, OSError) as e:  # RuntimeError: the encoder cannot be loaded
        fail(str(e))
    apis = "/retrieve, /search, /batch_search, /queries, /health, /metrics"
    try:
        serve(
            r,
            host=host,
            port=port,
            max_k=max_k,
            default_k=default_k,
            access_log=access_log,
            max_batch=max_batch,
            max_wait_s=max_wait_ms / 1000,
            embed_cache=embed_cache,
            ready=lambda url: say(f"serving {index} on {url} ({apis})"),  # once it listens
        )
    except (OSError, ValueError) as e:  # a port in use or not allowed
        fail(error_text(e))


@app.command(
    "model",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def model(
    ctx: typer.Context,
    engine: str = typer.Option(..., "--engine", help="sglang | vllm"),
    model: Model = "smollm2-135m-instruct",
    python: str = typer.Option(
        None, "--python", help="Interpreter of the engine's environment (default: the venv make test-engines builds)."
    ),
    host: Host = "127.0.0.1",
    port: Port = 30000,
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel size (one URL; the engine spreads requests)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda (cpu adds the CPU recipe's flags)."),
    log_dir: str = typer.Option("runs/engines", "--log-dir", help="Folder for the engine's log file."),
    health_timeout: float = typer.Option(900.0, "--health-timeout", help="Seconds to wait for /health."),
) -> None:
    """Launch an SGLang or vLLM server for a model; Ctrl-C or SIGTERM stops it and all its workers.

    Arguments after ``--`` go to the engine verbatim, e.g. ``-- --mem-fraction-static 0.5``.
    """
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.engines import EngineConfig, EngineError, serve_engine

    if engine not in ("sglang", "vllm"):
        fail(f"--engine must be sglang or vllm, got {engine!r}")
    if device not in ("auto", "cpu", "cuda"):
        fail(f"--device must be auto, cpu or cuda, got {device!r}")
    if tp < 1 or dp < 1:
        fail(f"--tp and --dp must be at least 1 (got --tp {tp} --dp {dp})")
    cfg = EngineConfig(
        python=python,
        device=device,
        host=host,
        port=port,
        tp=tp,
        dp=dp,
        args=list(ctx.args),  # type: ignore[arg-type]
        health_timeout=health_timeout,
        log_dir=log_dir,
    )
    console.print(f"starting {engine} for {model} (log in {log_dir}/{engine}-{port}.log) ...")

    def ready(proc: Any) -> None:
        console.print(f"[bold]{engine}[/] serving {model} at [bold]{proc.url}[/] (Ctrl-C to stop)")
        typer.echo(proc.url)  # stdout carries only the URL, for a script that reads it

    try:
        serve_engine(engine, model, cfg, ready)  # type: ignore[arg-type]
    except (EngineError, OSError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        console.print(f"stopped {engine}")


@app.command("prm")
def prm(
    path: str = typer.Option(..., "--path", help="A trained PRM folder (harness train with algo.kind=prm: RUN/final)."),
    host: Host = "127.0.0.1",
    port: Port = 8010,
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per forward pass."),
    threads: int = typer.Option(None, "--threads", help="torch threads (CPU)."),
    max_tokens: int = typer.Option(8192, "--max-tokens", help="Longest sequence accepted (longer: HTTP 413)."),
) -> None:
    """Serve a process reward model: POST /score {"sequences": [[ids]]} → {"scores": [...]} (algo.step_scorer_url)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from training.prm.prm_scorer import serve

    if not (Path(path) / "prm.json").exists():
        fail(f"--path {path}: not a PRM folder (no prm.json; train one with algo.kind=prm)")
    if batch_size < 1 or max_tokens < 1:
        fail(f"--batch-size and --max-tokens must be >= 1, got {batch_size} and {max_tokens}")
    try:
        serve(
            path,
            host=host,
            port=port,
            batch_size=batch_size,
            threads=threads,
            max_tokens=max_tokens,
            ready=lambda url: say(f"serving the PRM {path} on {url} (/score, /health)"),  # once it listens
        )
    except (OSError, ValueError) as e:  # a port in use or not allowed, a PRM folder that does not load
        fail(error_text(e))
