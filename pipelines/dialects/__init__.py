"""Agent dialects: each seed system's protocol as its own code runs it, plus our small-model variants.

One module per seed system: :mod:`.research`, :mod:`.search_r1`, :mod:`.r1_searcher`,
:mod:`.rag_r1`, :mod:`.prorag` and :mod:`.harr` follow ReSearch, Search-R1, R1-Searcher, RAG-R1,
ProRAG and HARR: the prompt template (a data file under ``configs/dialects/`` citing repository,
file and commit), where it sits (system / user / raw), question normalisation, stops, how a turn
is cut, what follows a malformed turn, an EOS or a token-limit cut, the observation text, the
answer, the corrective message and the format check of each system's reward. Each module also
holds the system's :class:`~pipelines.dialects.system.System` record (metric profile, reward,
shipped configs, FlashRAG's differences, how a synthesized turn is written) and registers it;
importing this package imports them all. ``docs/adding_a_system.md`` adds one.

They follow the evaluation code; RAG-R1 and R1-Searcher, whose evaluation script and training
loop disagree, have two modes (``eval``, the default for ``harness eval``, and ``train``, the
default for rollouts; :meth:`Dialect.with_mode`). What is still known to differ from an original
is listed under ``differences`` in its dialect file (printed by ``harness prompt``; ``--json``:
``differences``); the main one, common to all, is that the loop works on token ids: the
originals re-encode their text (or re-append a trimmed stop string), while the backends here
keep the model's own tokens, the stop string's included.

:mod:`.tool_call` is no paper's protocol: the model's own chat template and tool-call format,
with the observation appended as the template's tool message (docs/tool_calling.md).

``<name>_small`` (for the first four) keep our own wording and lenient parsing for small models
(:mod:`.small`); ``AgentConfig.variant="small"`` selects them. ``AgentConfig.template=FILE``
replaces a dialect's template with the one a checkpoint was trained with.

Where FlashRAG's ports differ from the originals, the originals are implemented;
``FLASHRAG_DIFFERENCES`` lists what differs, per system (:attr:`System.flashrag_differences`).
"""

from __future__ import annotations

# Each seed system's module registers its System and dialects when imported.
from pipelines.dialects import harr, prorag, r1_searcher, rag_r1, research, search_r1, tool_call  # noqa: F401
from pipelines.dialects.base import (
    TEMPLATE_DIR,
    Action,
    Dialect,
    doc_contents,
    load_template_file,
    shipped_template,
    title_and_text,
)
from pipelines.dialects.small import extract_boxed, split_parallel_queries
from pipelines.dialects.system import DIALECTS, SYSTEMS, SynthTurns, System, synth_turns

__all__ = [
    "DIALECTS",
    "FLASHRAG_DIFFERENCES",
    "SYSTEMS",
    "TEMPLATE_DIR",
    "Action",
    "Dialect",
    "SynthTurns",
    "System",
    "doc_contents",
    "extract_boxed",
    "get_dialect",
    "load_template_file",
    "resolve_dialect",
    "shipped_template",
    "split_parallel_queries",
    "synth_turns",
    "title_and_text",
]

# What FlashRAG's own ports (flashrag/pipeline/reasoning_pipeline.py, RUC-NLPIR/FlashRAG at
# 1ee524901aa3daf009f97b7a31e7a1b58eee8206) do differently from the original code, per system.
FLASHRAG_DIFFERENCES: dict[str, tuple[str, ...]] = {n: SYSTEMS.get(n).flashrag_differences for n in SYSTEMS}


def get_dialect(name: str) -> Dialect:
    return DIALECTS.get(name)


def resolve_dialect(
    dialect: str | Dialect, variant: str = "exact", template: str | None = None, mode: str | None = None
) -> Dialect:
    """The dialect an agent runs: ``variant="small"`` picks ``<name>_small``; ``mode`` (``eval``
    or ``train``) picks a two-mode dialect's protocol (default: its registered one, ``eval``);
    ``template`` (a file) replaces the prompt template."""
    d = get_dialect(dialect) if isinstance(dialect, str) else dialect
    if mode is not None:
        if mode not in ("eval", "train"):
            raise ValueError(f"agent.mode must be 'eval' or 'train', not {mode!r}")
        d = d.with_mode(mode)
    if variant == "small" and not d.name.endswith("_small"):
        d = get_dialect(f"{d.name}_small")
    elif variant not in ("exact", "small"):
        raise ValueError(f"agent.variant must be 'exact' or 'small', not {variant!r}")
    return d.with_template(template) if template else d
