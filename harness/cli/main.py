"""``harness``: the command-line entry point.

Each command lives in its own module under ``harness.cli`` and is attached under its name in
:data:`harness.commands.COMMANDS` (with that registry's help text); heavy imports happen inside
the command functions so that ``harness --help`` stays fast.
"""

from __future__ import annotations

import logging

import typer

from harness.cli import (
    data_cmd,
    datasets_cmd,
    demo_cmd,
    eval_cmd,
    index_cmd,
    prompt_cmd,
    replicate_cmd,
    report_cmd,
    score_cmd,
    serve_cmd,
    stages_cmd,
    train_cmd,
)
from harness.commands import COMMANDS

app = typer.Typer(
    name="harness",
    help="Evaluate and train LLM agents that reason with search (FlashRAG-integrated).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# What each registered command runs, in the order `harness --help` lists them.
COMMAND_FUNCTIONS = {
    "eval": eval_cmd.eval_command,
    "train": train_cmd.train_command,
    "report": report_cmd.report_command,
    "data": data_cmd.app,
    "stages": stages_cmd.app,
    "index": index_cmd.app,
    "serve": serve_cmd.app,
    "datasets": datasets_cmd.datasets_command,
    "prompt": prompt_cmd.prompt_command,
    "replicate": replicate_cmd.replicate_command,
    "demo": demo_cmd.demo_command,
    "score": score_cmd.score_command,
}


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    # Third-party libraries log at WARNING; our own packages at INFO (DEBUG with -v).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for pkg in ("harness", "pipelines", "benchmarks", "training"):
        logging.getLogger(pkg).setLevel(logging.DEBUG if verbose else logging.INFO)


if set(COMMAND_FUNCTIONS) != set(COMMANDS.names()):  # a command registered but not attached, or the reverse
    raise RuntimeError(f"harness.commands and harness.cli.main disagree: {set(COMMAND_FUNCTIONS) ^ set(COMMANDS)}")
for _name, _target in COMMAND_FUNCTIONS.items():
    _command = COMMANDS.get(_name)
    if _command.group:
        app.add_typer(_target, name=_name, help=_command.help)
    else:
        app.command(_name, help=_command.help)(_target)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
