"""``harness``'s commands, in one table: each name with its help text and the dotted path of the
function (or typer group) that runs it. The CLI (:mod:`cli.main`) attaches every command from
this table, in its order.

The table names its targets as text (``"eval_cmd:eval_command"``, under ``cli``): :mod:`cli.main`
imports each command's module to attach it (the modules defer their libraries' imports to the
command's run, so ``harness --help`` stays fast). Which commands a stage
chain may run is the library's word (:data:`training.stages.STAGE_COMMANDS`: finite runs that leave
an output); :func:`stage_commands` reads it against this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.registry import Registry


@dataclass(frozen=True)
class Command:
    """A command's one-line help; ``target``: ``"module:attribute"`` under ``cli`` of the
    function (or, for a group, the ``typer.Typer``) that runs it; ``group``: it groups subcommands
    (``harness data synthesize``, ...)."""

    help: str
    target: str
    group: bool = False


COMMANDS: Registry[Command] = Registry("harness command")

# In the order `harness --help` lists them (HELP_ORDER).
_TABLE = (
    ("eval", Command("Run methods on datasets; one run directory per (method, dataset).", "eval_cmd:eval_command")),
    (
        "train",
        Command(
            "Train with a recipe: RL (GRPO / PPO / Reinforce++) on DeepSpeed, or algo.kind sft, prm or retriever.",
            "train_cmd:train_command",
        ),
    ),
    (
        "report",
        Command("Leaderboards with confidence intervals, plots and a trajectory browser.", "report_cmd:report_command"),
    ),
    (
        "data",
        Command(
            "Data tools: synthesize SFT trajectories, MCTS, RFT's filter, HARR's question filter.",
            "data_cmd:app",
            group=True,
        ),
    ),
    (
        "stages",
        Command(
            "Run a chain of harness stages (SFT → PRM → RFT → RL), resuming where it stopped.",
            "stages_cmd:app",
            group=True,
        ),
    ),
    ("index", Command("Build and inspect retrieval indexes.", "index_cmd:app", group=True)),
    ("serve", Command("Serve a retriever or a model over HTTP.", "serve_cmd:app", group=True)),
    (
        "datasets",
        Command(
            "List the registered datasets, their splits and where each is read from.", "datasets_cmd:datasets_command"
        ),
    ),
    ("prompt", Command("Show exactly what a model sees under a method's dialect.", "prompt_cmd:prompt_command")),
    (
        "replicate",
        Command(
            "Run a seed system's replication card; print the paper's numbers beside ours.",
            "replicate_cmd:replicate_command",
        ),
    ),
    (
        "demo",
        Command(
            "The mission on the shipped demo: baselines, untrained agent, SFT warm-up, trained agent, report.",
            "demo_cmd:demo_command",
        ),
    ),
    ("score", Command("Score any JSONL prediction file (EM, F1, acc, cover_em).", "score_cmd:score_command")),
)
for _name, _command in _TABLE:
    COMMANDS.register(_name, _command)
HELP_ORDER: tuple[str, ...] = tuple(name for name, _ in _TABLE)


def stage_commands() -> list[str]:
    """The commands of this table a chain stage may run (servers, the demo and chains themselves
    are not stages)."""
    # deferred: the stage chains' library loads when a command needs it, not at every harness --help
    from training.stages import STAGE_COMMANDS

    return [n for n in COMMANDS.names() if n in STAGE_COMMANDS]
