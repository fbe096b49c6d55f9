"""The names of ``harness``'s commands, in one registry: the CLI (``harness.cli.main``) attaches a
command under each name with its help text, and stage chains (:mod:`training.stages`) accept a
stage's command only if it is registered here with ``stage=True``.

Kept free of the CLI's code (a name and a line of help each), so the library can read it
without importing ``harness.cli``.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.registry import Registry


@dataclass(frozen=True)
class Command:
    """A command's one-line help; ``stage``: a chain stage may run it (a finite run that leaves
    an output; servers, the demo and chains themselves are not stages); ``group``: it groups
    subcommands (``harness data synthesize``, ...)."""

    help: str
    stage: bool = True
    group: bool = False


COMMANDS: Registry[Command] = Registry("harness command")

for _name, _help, _stage, _group in (
    ("eval", "Run methods on datasets; one run directory per (method, dataset).", True, False),
    (
        "train",
        "Train with a recipe: RL (GRPO / PPO / Reinforce++) on DeepSpeed, or algo.kind sft, prm or retriever.",
        True,
        False,
    ),
    ("report", "Leaderboards with confidence intervals, plots and a trajectory browser.", True, False),
    ("data", "Data tools: synthesize SFT trajectories, MCTS, RFT's filter, HARR's question filter.", True, True),
    ("stages", "Run a chain of harness stages (SFT → PRM → RFT → RL), resuming where it stopped.", False, True),
    ("index", "Build and inspect retrieval indexes.", True, True),
    ("serve", "Serve a retriever or a model over HTTP.", False, True),
    ("datasets", "List the registered datasets, their splits and where each is read from.", True, False),
    ("prompt", "Show exactly what a model sees under a method's dialect.", True, False),
    ("replicate", "Run a seed system's replication card; print the paper's numbers beside ours.", True, False),
    (
        "demo",
        "The mission on the shipped demo: baselines, untrained agent, SFT warm-up, trained agent, report.",
        False,
        False,
    ),
    ("score", "Score any JSONL prediction file (EM, F1, acc, cover_em).", True, False),
):
    COMMANDS.register(_name, Command(_help, _stage, _group))


def stage_commands() -> list[str]:
    """The commands a chain stage may run."""
    return [n for n in COMMANDS.names() if COMMANDS.get(n).stage]
