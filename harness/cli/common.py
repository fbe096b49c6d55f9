"""Small helpers shared by CLI commands."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a clear error for a person and exit non-zero."""
    # escape: a message quoting a list or an override (prm.data=[DIR]) is text, not rich markup.
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)  # no hard line breaks
    raise typer.Exit(code)


def start_engine(stack: Any, engine: str, model: str, cfg: Any, log_dir: Any) -> Any:
    """Launch ``engine`` for a run inside ``stack`` (an ``ExitStack``: leaving it stops the engine,
    however the run ends) and say so; returns the running :class:`~harness.engines.EngineProcess`."""
    from harness.engines import launched

    console.print(f"launching {engine} for {model} ...")
    proc = stack.enter_context(launched(engine, model, cfg, log_dir=log_dir))  # type: ignore[arg-type]
    console.print(f"{engine} up at {proc.url} (log {proc.log_path})")
    return proc
