"""Small helpers shared by CLI commands."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a clear error for a person and exit non-zero."""
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)
