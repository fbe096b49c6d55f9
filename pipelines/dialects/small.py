"""Our own protocol variants for small models (``<dialect>_small``): our wording, lenient parsing.

These are not any system's protocol. They keep each system's tags but use one instruction of
ours, tolerant action parsing (the last query before the stop tag), observations with newlines
inside the tags, and a loose format check. Small models (SmolLM2-135M on CPU) follow them with a
one-shot demonstration, which is what the CPU demo and training recipe use. A system's module
registers its variant with :func:`register`, giving its tags and how our instruction ends (how the
system answers).

``rag_r1_small`` parallel queries: separated by ``|`` (or one per line). The comma form is
accepted only when unambiguous: every comma-separated piece is a quoted string (``"q1", "q2"``
or a JSON list) or every piece ends with a question mark. So ``Paris, Texas population`` is
one query.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd, closing_brace
from pipelines.dialects.system import DIALECTS

INSTRUCTION = (
    "Work out the answer step by step. Put your reasoning inside {think_open} {think_close}. "
    "Whenever you need a fact you do not know, search for it by writing {query_open} your query "
    "{query_close}; the search results will then appear inside {obs_open} {obs_close}. "
    "You may search as often as you need."
)
CORRECTIVE = (
    "\n\n{obs_open}\nYour last action was not valid: {reason}. Search with {query_open} query {query_close} "
    "or answer with {answer_open} answer {answer_close}.\n{obs_close}\n\n"
)


def instruction(ending: str, tags: dict[str, str], max_queries: int) -> str:
    """Our instruction with a system's ``ending`` (how it answers), its tags filled in."""
    return (INSTRUCTION + ending).format(**tags, max_queries=max_queries)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, with nested braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    end = closing_brace(text, i, depth=1)
    return None if end is None else text[i:end]


def split_parallel_queries(raw: str) -> list[str]:
    """Split a multi-query search body; see the module docstring for the accepted forms."""
    raw = raw.strip()
    if raw.startswith("[") and raw.endswith("]"):
        try:
            parsed = json.loads(raw)
            if isinstance(parsed, list) and all(isinstance(q, str) for q in parsed):
                return [q.strip() for q in parsed if q.strip()]
        except json.JSONDecodeError:
            pass
    if "|" in raw:
        return [q.strip() for q in raw.split("|") if q.strip()]
    if "\n" in raw:
        return [q.strip() for q in raw.splitlines() if q.strip()]
    if "," in raw:
        if re.fullmatch(r'\s*"[^"]+"\s*(,\s*"[^"]+"\s*)+', raw):
            return [q.strip() for q in re.findall(r'"([^"]+)"', raw) if q.strip()]
        pieces = [p.strip() for p in raw.split(",")]
        if len(pieces) > 1 and all(p.endswith("?") and len(p) > 1 for p in pieces):
            return pieces
    return [raw]


def parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """An answer block anywhere answers; a turn ending in the query tag searches its last query."""
    if d.answer_close in text:
        answer = extract(d, text)
        if answer is None:
            return Action("invalid", reason="the answer is empty or not in the expected form")
        return Action("answer", answer=answer)
    if text.rstrip().endswith(d.query_close):
        body = text.rstrip()[: -len(d.query_close)]
        start = body.rfind(d.query_open)
        if start < 0:
            return Action("invalid", reason=f"{d.query_close} without {d.query_open}")
        raw = body[start + len(d.query_open) :].strip()
        queries = ([raw] if raw else []) if d.max_queries == 1 else split_parallel_queries(raw) if raw else []
        if not queries:
            return Action("invalid", reason="the search query is empty")
        if len(queries) > d.max_queries:
            return Action("invalid", reason=f"at most {d.max_queries} queries per search")
        return Action("search", queries=tuple(queries))
    return Action("none")


def extract(d: Dialect, response: str) -> str | None:
    """The last complete answer in the response (inside ``\\boxed{}`` when the dialect boxes)."""
    pattern = re.escape(d.answer_open) + r"(.*?)" + re.escape(d.answer_close)
    matches = re.findall(pattern, response, flags=re.DOTALL)
    if not matches:
        return None
    answer = matches[-1].strip()
    if d.boxed_answer:
        boxed = extract_boxed(answer)
        if boxed is not None:
            answer = boxed.strip()
    return answer or None


def validate(d: Dialect, response: str) -> tuple[bool, str]:
    """One answer block at the end, balanced tags (observations dropped first), boxed if asked."""
    obs = re.escape(d.obs_open) + r".*?" + re.escape(d.obs_close)
    text = re.sub(obs, "", response, flags=re.DOTALL)
    if text.count(d.answer_open) != 1 or text.count(d.answer_close) != 1:
        return False, "expected exactly one answer block"
    if text.count(d.query_open) != text.count(d.query_close):
        return False, "unbalanced search tags"
    if not text.rstrip().endswith(d.answer_close):
        return False, "text after the answer"
    if d.think_open and text.count(d.think_open) != text.count(d.think_close):
        return False, "unbalanced think tags"
    if extract(d, text) is None:
        return False, "empty answer" + (" or no \\boxed{}" if d.boxed_answer else "")
    if d.boxed_answer and extract_boxed(text.rsplit(d.answer_open, 1)[-1]) is None:
        return False, "answer without \\boxed{}"
    return True, "ok"


def format_docs(docs: list[Doc]) -> str:
    return "\n".join(f"Doc {i}(Title: {doc.title}) {doc.text}" for i, doc in enumerate(docs, 1))


def observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """Documents inside the dialect's observation tags, newlines inside; JSON for ``rag_r1``."""
    if d.doc_style == "json":
        payload = {"query": list(queries), "documents": [format_docs(docs) for docs in results]}
        body = json.dumps(payload, ensure_ascii=False)
    elif len(queries) == 1:
        body = format_docs(results[0])
    else:
        body = "\n".join(f"Query: {q}\n{format_docs(docs)}" for q, docs in zip(queries, results, strict=True))
    return f"\n\n{d.obs_open}\n{body}\n{d.obs_close}\n\n"


def register(system: str, ending: str, **tags: Any) -> None:
    """Register ``<system>_small``: ``system``'s tags (``tags``: the :class:`Dialect` tag fields
    and ``max_queries`` / ``doc_style`` where they differ from the defaults) with our instruction
    ending in ``ending`` (how the system answers; ``{answer_open}``-style fields are filled in)."""
    probe = Dialect(
        name="", system="", template="", placement="user", parse=parse, observe=observe,
        extract=extract, validate=validate, search_stops=(), final_stops=(), raw_bos=False, **tags,
    )  # fmt: skip
    tag_values = {k: getattr(probe, k) for k in ("query_open", "query_close", "obs_open", "obs_close")}
    tag_values |= {k: getattr(probe, k) for k in ("answer_open", "answer_close", "think_open", "think_close")}
    text = instruction(ending, tag_values, probe.max_queries) + "{shot}\n\nQuestion: {question}"
    name = f"{system}_small"
    DIALECTS.register(
        name,
        replace(
            probe,
            name=name,
            system=f"ours ({system} tags)",
            template=text,
            base_template=text + "\n",
            search_stops=(probe.query_close, probe.answer_close),
            final_stops=(probe.answer_close,),
            final_turn=True,  # ours: small models get one more turn to answer
            corrective=CORRECTIVE.replace("{obs_open}", probe.obs_open).replace("{obs_close}", probe.obs_close),
            answer_rule="the last answer block of the response" + (", inside \\boxed{}" if probe.boxed_answer else ""),
            source={"wording": "ours (pipelines/dialects/small.py)"},
        ),
    )
