"""``harness``: the command-line entry point.

Each command lives in its own module under ``harness.cli``; heavy imports happen inside the
command functions so that ``harness --help`` stays fast.
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

app = typer.Typer(
    name="harness",
    help="Evaluate and train LLM agents that reason with search (FlashRAG-integrated).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    # Third-party libraries log at WARNING; our own packages at INFO (DEBUG with -v).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for pkg in ("harness", "pipelines", "benchmarks", "training"):
        logging.getLogger(pkg).setLevel(logging.DEBUG if verbose else logging.INFO)


app.command("eval", help="Run methods on datasets; one run directory per (method, dataset).")(eval_cmd.eval_command)
app.command(
    "train", help="Train with a recipe: RL (GRPO / PPO / Reinforce++) on DeepSpeed, or algo.kind sft, prm or retriever."
)(train_cmd.train_command)
app.command("report", help="Leaderboards with confidence intervals, plots and a trajectory browser.")(
    report_cmd.report_command
)
app.add_typer(
    data_cmd.app, name="data", help="Data tools: synthesize SFT trajectories, RFT's filter, HARR's question filter."
)
app.add_typer(
    stages_cmd.app,
    name="stages",
    help="Run a chain of harness stages (SFT → PRM → RFT → RL), resuming where it stopped.",
)
app.add_typer(index_cmd.app, name="index", help="Build and inspect retrieval indexes.")
app.add_typer(serve_cmd.app, name="serve", help="Serve a retriever or a model over HTTP.")
app.command("datasets", help="List the registered datasets, their splits and where each is read from.")(
    datasets_cmd.datasets_command
)
app.command("prompt", help="Show exactly what a model sees under a method's dialect.")(prompt_cmd.prompt_command)
app.command("replicate", help="Run a seed system's replication card; print the paper's numbers beside ours.")(
    replicate_cmd.replicate_command
)
app.command(
    "demo", help="The mission on the shipped demo: baselines, untrained agent, SFT warm-up, trained agent, report."
)(demo_cmd.demo_command)
app.command("score", help="Score any JSONL prediction file (EM, F1, acc, cover_em).")(score_cmd.score_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
