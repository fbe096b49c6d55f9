"""Small helpers shared by CLI commands."""

from __future__ import annotations

import errno
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)

WRITE_ERRNOS = (errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM, errno.EDQUOT)


def error_text(e: BaseException) -> str:
    """What a failed command tells the user: the library's own message, never the exception's
    class name; for an OS error the path and the reason (a read-only or full disk)."""
    if isinstance(e, OSError) and e.filename is not None:
        where = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else str(e.filename)
        return f"cannot write {where}: {e.strerror or e}" if e.errno in WRITE_ERRNOS else f"{where}: {e.strerror or e}"
    if isinstance(e, OSError) and e.strerror:  # no "[Errno 98]" before the reason
        return e.strerror
    if isinstance(e, KeyError):  # a registry's message (an unknown name), or a bare missing key
        what = str(e.args[0]) if e.args else ""
        return what if " " in what else f"missing entry {what!r} (a checkpoint or record without it)"
    return str(e) or type(e).__name__


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
