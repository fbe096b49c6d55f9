"""``harness demo [--system NAME]``: a seed system's whole chain on the shipped demo, on CPU, in
minutes (``make demo`` runs ReSearch's): baselines, the untrained agent, an SFT warm-up, the SFT
agent, the system's own training from it, the trained agent and a report
(:func:`programs.demo.program.run_demo`, which says what each step does and caches)."""

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


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"--seeds takes comma-separated integers (0,1,2), not {text!r}") from None


def demo_command(
    system: str = typer.Option(
        "research",
        "--system",
        help="The system whose chain runs: research (make demo), search_r1, r1_searcher, rag_r1, prorag, harr, "
        "tool_call (the model's own tool-calling format).",
    ),
    out: str = typer.Option(
        None,
        "--out",
        help="Folder for every step's output, cached between runs "
        "(default runs/demo for research, runs/demo-SYSTEM for the others).",
    ),
    seeds: str = typer.Option(
        "0",
        "--seeds",
        help="Training seeds (trainer.seed), comma-separated: one trained agent each, all paired "
        "against the one SFT model (seed 0's folders are the demo's own; seed N's end in -sN).",
    ),
    methods_config: str = typer.Option(
        None, "--methods-config", help="Eval config of all methods (default: the demo's, configs/methods/)."
    ),
    train_config: str = typer.Option(None, "--train-config", help="The SFT recipe (default: the system's)."),
    rl_config: list[str] = typer.Option(
        None, "--rl-config", help="The training recipe(s), in order, from the SFT model (default: the system's)."
    ),
    rl_overrides: list[str] = typer.Option(
        None,
        "--rl",
        help="key.path=value override of every training recipe (repeatable), e.g. --rl trainer.max_steps=4.",
    ),
    threads: int = typer.Option(
        0,
        "--threads",
        min=0,
        help="Torch threads of every stage. 0 (default): every core when the machine is quiet (load average "
        "under half the cores), else 1, since on a busy 2-core machine two threads spin-wait on each other.",
    ),
    limit: int = typer.Option(
        None,
        "--limit",
        min=1,
        help="Evaluate only the first N test questions (a quick look; the demo's figures need all 154).",
    ),
    baselines: bool = typer.Option(
        True, "--baselines/--no-baselines", help="Run FlashRAG's naive and standard beside the untrained agent."
    ),
    retrain: bool = typer.Option(
        False,
        "--retrain",
        help="Replace a stage whose recipe or inputs changed since it ran, and every stage after it "
        "(without it such a stage is refused, naming what changed, and nothing is deleted).",
    ),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides of the SFT recipe."),
) -> None:
    """Baselines, untrained agent, SFT warm-up, SFT agent, the system's training, trained agent, report."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from programs.demo.program import DemoOptions, run_demo

    opts = DemoOptions(
        methods_config=methods_config,
        sft_config=train_config,
        rl_configs=list(rl_config) if rl_config else None,
        sft_overrides=list(overrides or []),
        rl_overrides=list(rl_overrides or []),
        seeds=_seeds(seeds),
        threads=threads or None,
        limit=limit,
        baselines=baselines,
        retrain=retrain,
    )
    try:
        run_demo(_Terminal(), system, out, opts)
    except (ValueError, KeyError, FileNotFoundError, RuntimeError, OSError) as e:
        fail(str(e))
