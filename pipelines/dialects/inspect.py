"""What a model sees under a dialect: the prompt, the observation after a search, stops, extraction.

``harness prompt`` prints :func:`describe`; users compare it with what their checkpoint was
trained on to debug an off-protocol run.
"""

from __future__ import annotations

from typing import Any

from harness.types import Doc
from pipelines.dialects.base import Dialect


def describe(
    dialect: Dialect,
    question: str,
    tokenizer: Any = None,
    docs: list[Doc] | None = None,
    queries: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Everything ``harness prompt`` shows, as one JSON-ready dict.

    ``text`` has the chat template applied when the dialect puts its prompt in messages and
    ``tokenizer`` has one. ``observation`` is the text inserted after a search for ``queries``
    (default: the question) that returned ``docs`` in that order (every query gets the same
    documents), or ``None`` without ``docs``.
    """
    messages = dialect.messages(question)
    chat = tokenizer is not None and dialect.uses_chat_template(tokenizer)
    observation = None
    if docs is not None:
        qs = queries or (question,)
        observation = dialect.observation_text(qs, [list(docs) for _ in qs])
        if chat and dialect.chat_observation is not None:  # tool_call: the template's tool message
            eos = getattr(tokenizer, "eos_token", None) or ""
            observation = dialect.chat_observation(dialect, tokenizer, observation, eos)
    return {
        "dialect": dialect.name,
        "system": dialect.system,
        "source": dialect.source,
        "placement": dialect.placement,
        "chat_template_applied": chat,
        "messages": messages,
        "text": dialect.render(question, tokenizer, chat=True),
        "observation": observation,
        "stops": {"search_turn": list(dialect.search_stops), "final_turn": list(dialect.final_stops)},
        "stop_kept_in_text": True,
        "eos": "the parsed action decides" if dialect.on_eos == "parse" else "ends the item",
        "length_cut": "the parsed action decides" if dialect.on_length == "parse" else "ends the item",
        "final_turn": dialect.final_turn,
        "mode": dialect.mode,
        "modes": sorted(dialect.modes),
        "differences": list(dialect.differences),
        "answer": dialect.answer_rule,
        "corrective": dialect.corrective,
        "flashrag_differences": list(dialect.options.get("flashrag_differences", ())),
        "notes": list(dialect.options.get("notes", ())),
    }
