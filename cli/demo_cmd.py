"""``harness demo``: the whole mission on the shipped demo, on CPU, in minutes (``make demo``):
baselines, the untrained agent, an SFT warm-up, the SFT agent, GRPO from it, the RL agent and a report
(:func:`training.demo.run_demo`, which says what each step does and caches)."""

from __future__ import annotations

from typing import Any

import typer

from cli.common import console, fail


class _Terminal:
    """The demo's steps, tables and report on the terminal."""

    def step(self, title: str) -> None:
        console.rule(title)

    def results(self, results: list[Any]) -> None:
        # deferred: the command's library loads when it runs, not at every harness --help
        from cli.eval_cmd import print_results_table

        print_results_table(results)

    def report(self, report: Any) -> None:
        # deferred: the command's library loads when it runs, not at every harness --help
        from cli.report_cmd import print_report

        print_report(report)

    def say(self, text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)  # markdown: no wrapped rows


def demo_command(
    out: str = typer.Option("runs/demo", "--out", help="Folder for every step's output (cached between runs)."),
    # Defaults None, the demo's own (training.demo): importing it here would put training.build's
    # import (about 0.6 s) into every `harness --help`.
    methods_config: str = typer.Option(
        None, "--methods-config", help="Eval config of all methods (default: the demo's, configs/methods/)."
    ),
    train_config: str = typer.Option(None, "--train-config", help="The SFT recipe (default: the demo's)."),
    rl_config: str = typer.Option(None, "--rl-config", help="The RL recipe, from the SFT model (default: the demo's)."),
    rl_overrides: list[str] = typer.Option(
        None, "--rl", help="key.path=value override of the RL recipe (repeatable), e.g. --rl trainer.max_steps=4."
    ),
    threads: int = typer.Option(
        0,
        "--threads",
        min=0,
        help="Torch threads of every stage. 0 (default): every core when the machine is quiet (load average "
        "under half the cores), else 1, since on a busy 2-core machine two threads spin-wait on each other.",
    ),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides of the SFT recipe."),
) -> None:
    """Baselines, untrained agent, SFT warm-up, SFT agent, RL, RL agent, report; see training.demo."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from training.demo import METHODS_CONFIG, RL_CONFIG, TRAIN_CONFIG, run_demo

    try:
        run_demo(
            _Terminal(),
            out,
            methods_config or METHODS_CONFIG,
            train_config or TRAIN_CONFIG,
            threads or None,
            list(overrides or []),
            rl_config or RL_CONFIG,
            rl_overrides,
        )
    except (ValueError, KeyError, FileNotFoundError, RuntimeError, OSError) as e:
        fail(f"{type(e).__name__}: {e}")
