"""Command-line options that several commands share, declared once (typer ``Annotated`` aliases).

A command names the alias as the parameter's type and gives the default, e.g.
``data_dir: DataDir = None`` or ``port: Port = 8000``. Options that only look alike but mean
different things per command (``--out``, ``--seed``, ``--backend``...) stay with their command.
"""

from __future__ import annotations

from typing import Annotated

import typer

ConfigFiles = Annotated[list[str] | None, typer.Option("-c", "--config", help="YAML config file(s).")]
Overrides = Annotated[list[str] | None, typer.Argument(help="key.path=value overrides, e.g. agent.max_turns=2")]
DataDir = Annotated[
    str | None,
    typer.Option(
        "--data-dir", help="FlashRAG-layout data dir, DIR/<dataset>/<split>.jsonl (default $HARNESS_DATA_DIR)."
    ),
]
Limit = Annotated[int | None, typer.Option("--limit", help="First N questions of each dataset.")]
TopK = Annotated[int | None, typer.Option("--topk", help="Documents per search.")]
Variant = Annotated[str, typer.Option("--variant", help="exact (the system's protocol) or small (our wording).")]

JudgeUrl = Annotated[
    str | None, typer.Option("--judge-url", help="OpenAI-compatible endpoint (…/v1) of the LLM judge.")
]
JudgeModel = Annotated[
    str | None, typer.Option("--judge-model", help="Judge model name (default: the judge prompt's).")
]
JudgeKeyEnv = Annotated[
    str | None,
    typer.Option("--judge-api-key-env", help="Env var holding the judge's API key (default OPENAI_API_KEY)."),
]

# Servers (harness serve ...): the default port is each server's own.
Host = Annotated[str, typer.Option("--host", help="Bind address (loopback by default).")]
Port = Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port (1 to 65535).")]
Model = Annotated[str, typer.Option("--model", help="Model name, local directory or hub id.")]

# Stage chains (harness stages run / status).
ChainFile = Annotated[str, typer.Argument(help="A chain file (configs/train/prorag/chain.yaml).")]
Workdir = Annotated[str | None, typer.Option("--workdir", help="Where the stages' outputs go (default: the chain's).")]
ChainVars = Annotated[
    list[str] | None, typer.Option("--set", help="NAME=VALUE for one of the chain's vars (repeatable).")
]
