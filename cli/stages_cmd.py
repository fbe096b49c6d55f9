"""``harness stages run CHAIN.yaml [--workdir DIR] [--set NAME=VALUE ...] [--dry-run]`` and
``harness stages status CHAIN.yaml``: run a chain of harness stages (:mod:`training.stages`),
resuming at the first stage that is not done, each as its own ``harness`` process
(:mod:`programs.stages.executor`); a failed stage stops the chain and says why.
"""

from __future__ import annotations

import typer

from cli.common import console, fail
from cli.options import ChainFile, ChainVars, Workdir

app = typer.Typer(no_args_is_help=True)


def _variables(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key.strip():
            fail(f"--set {p!r}: expected NAME=VALUE")
        out[key.strip()] = value
    return out


def _load(chain: str, workdir: str | None, sets: list[str] | None):
    # deferred: the command's library loads when it runs, not at every harness --help
    from training.stages import StageError, load_chain

    try:
        return load_chain(chain, workdir, _variables(sets or []))
    except StageError as e:
        fail(str(e))


def _table(ch, states: dict[str, str]) -> None:
    # deferred: the command's library loads when it runs, not at every harness --help
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"chain {ch.name} (workdir {ch.workdir})"))
    for col in ("stage", "state", "output", "command"):
        table.add_column(col, overflow="fold")
    for s in ch.stages:
        table.add_row(s.name, states[s.name], escape(s.output), escape("harness " + " ".join(s.argv)))
    console.print(table)


@app.command("run")
def run_command(
    chain: ChainFile,
    workdir: Workdir = None,
    sets: ChainVars = None,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run; run nothing."),
) -> None:
    """Run the chain's unfinished stages in order."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.engines import sigterm_as_exit
    from programs.stages.executor import subprocess_executor
    from training.stages import StageError, run_chain, stage_state

    ch = _load(chain, workdir, sets)
    try:
        if dry_run:
            _table(ch, {s.name: stage_state(ch, s) for s in ch.stages})
            return
        with sigterm_as_exit():  # SIGTERM stops the running stage too, not just the runner
            outcomes = run_chain(ch, subprocess_executor)
    except StageError as e:
        fail(str(e), code=1)
    ran = [o for o in outcomes if o.ran]
    for o in outcomes:
        what = f"ran in {o.wall_s:.0f} s ({o.state_before})" if o.ran else "already done"
        if o.moved_aside:
            what += f"; its stale output was moved aside to {o.moved_aside}"
        console.print(f"  {o.name}: {what}", highlight=False)
    console.print(f"chain {ch.name}: {len(ran)} stage(s) run, all {len(outcomes)} done → {ch.workdir}")


@app.command("status")
def status_command(
    chain: ChainFile,
    workdir: Workdir = None,
    sets: ChainVars = None,
) -> None:
    """Each stage's state (done, partial, stale, todo) and resolved command."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from training.stages import StageError, stage_state

    ch = _load(chain, workdir, sets)
    try:
        _table(ch, {s.name: stage_state(ch, s) for s in ch.stages})
    except StageError as e:
        fail(str(e), code=1)
