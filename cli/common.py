"""Small helpers shared by CLI commands."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a clear error for a person and exit non-zero."""
    # escape: a message quoting a list or an override (prm.data=[DIR]) is text, not rich markup.
    from harness.errors import redact_urls  # deferred: harness.errors imports asyncio (~40 ms at every harness --help)

    message = redact_urls(message)  # a server URL's user:password@ is never printed
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)  # no hard line breaks
    raise typer.Exit(code)


def say(message: str) -> None:
    """Tell the user (stderr) what the library reports through its ``say`` callbacks: plain text,
    printed as is (no rich markup, no highlighting)."""
    console.print(escape(message), highlight=False, soft_wrap=True)
