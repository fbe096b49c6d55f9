"""RAG-R1 (inclusionAI/AWorld-RL RAG-R1), as its own code runs it: several queries a search, their
documents as one JSON block.

Its evaluation script and its training loop disagree, so the dialect has two modes: ``eval``
(``evaluation/eval_multiquery.py``, the default for ``harness eval``) and ``train``
(``rag_r1/llm_agent/generation_mq.py``, Search-R1's loop, :mod:`.search_r1`; the default for
rollouts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd, doc_contents
from pipelines.dialects.protocols import last_answer, no_format_check
from pipelines.dialects.search_r1 import SEARCH_R1_LOOP, search_r1_parse, search_r1_valid_sequence
from pipelines.dialects.small import register as register_small
from pipelines.dialects.system import System, register


def rag_r1_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """Mode ``train`` (``generation_mq.py``, Search-R1's loop): Search-R1's cut and parse; the
    query is split on commas, pieces stripped, empty ones dropped (``batch_search``). The prompt
    asks for up to three; the code does not cap them."""
    action = search_r1_parse(d, text, end)
    if action.kind != "search":
        return action
    queries = tuple(q.strip() for q in action.queries[0].split(",") if q.strip())
    return Action("search", queries=queries)


def rag_r1_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """``generation_mq.execute_predictions``: ``{"query": [...], "documents": [...]}`` as
    ``json.dumps(..., indent=2)`` (ASCII-escaped) inside ``\\n<information>\\n ... \\n</information>\\n``;
    each query's documents are ``Doc i: contents`` lines, stripped."""
    return rag_r1_observe_cut(d, queries, results, lambda block: block)


def rag_r1_observe_cut(
    d: Dialect, queries: tuple[str, ...], results: list[list[Doc]], cut: Callable[[str], str]
) -> str:
    """:func:`rag_r1_observe` with each query's block passed through ``cut`` (the agent's
    ``max_query_doc_tokens``): ``_passages2string`` hands the stripped ``Doc i: contents`` block,
    labels and titles included, to ``_process_documents``, which keeps its first max_obs_length
    token ids and decodes them (generation_mq.py:488-520)."""
    documents = [
        cut("".join(f"Doc {i}: {doc_contents(doc)}\n" for i, doc in enumerate(docs, 1)).strip()) for docs in results
    ]
    payload = json.dumps({"query": list(queries), "documents": documents}, indent=2)
    return f"\n<information>\n{payload.strip()}\n</information>\n"


_SEARCH_BLOCK = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def rag_r1_eval_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """Mode ``eval`` (``evaluation/eval_multiquery.py``): EOS ends the item; any other turn (the
    ``</search>`` stop, or the 1024-token limit) searches the LAST ``<search>`` block of the whole
    decoded sequence, prompt included (``get_query``; after a cut without one, an earlier query or
    the prompt's example is searched again); no block, or an empty one, gives an empty
    ``<information>`` block. ``</answer>`` does not end a turn."""
    if end.eos:  # the answer is read from the whole sequence; this only names how the item ended
        if "</answer>" in text:
            return Action("answer", answer=None, reason="EOS")
        return Action("end", reason="EOS without an answer")
    blocks = _SEARCH_BLOCK.findall(end.context + text)
    query = blocks[-1] if blocks else ""
    if not query:
        return Action("search", queries=(), reason="no query: empty <information> block")
    return Action("search", queries=tuple(q.strip() for q in query.split(",") if q.strip()))


def rag_r1_eval_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """``curr_search_template`` with the JSON of :func:`rag_r1_observe`; with nothing to search,
    an empty block (``search_results = ''``)."""
    if not queries:
        return "\n<information>\n\n</information>\n"
    return rag_r1_observe(d, queries, results)


def rag_r1_eval_answer(d: Dialect, text: str) -> str | None:
    """``get_answer``: the last ``<answer>`` block, NOT stripped (EM normalises it)."""
    matches = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    return matches[-1] if matches else None


SYSTEM = System(
    name="rag_r1",
    profile="rag_r1",
    reward="em",
    configs=(
        "configs/dialects/rag_r1.yaml",
        "configs/methods/rag_r1.yaml",
        "configs/replicate/rag_r1.yaml",
        "configs/train/rag_r1_sft.yaml",
        "configs/train/rag_r1_ppo.yaml",
        "configs/train/rag_r1/chain.yaml",
        "configs/train/demo/rag_r1_ppo.yaml",
    ),
    flashrag_differences=(
        "FlashRAG has no RAG-R1 port; mode eval follows RAG-R1's evaluation/eval_multiquery.py, mode train its "
        "rag_r1/llm_agent/generation_mq.py",
    ),
)

register(
    SYSTEM,
    parse=rag_r1_parse,
    observe=rag_r1_observe,
    extract=last_answer,
    validate=search_r1_valid_sequence,
    max_queries=3,
    doc_style="json",
    answer_rule="",
    search_stops=(),
    final_stops=(),
    mode="eval",
    modes={
        # evaluation/eval_multiquery.py
        "eval": dict(
            parse=rag_r1_eval_parse,
            observe=rag_r1_eval_observe,
            extract=rag_r1_eval_answer,
            validate=no_format_check,
            search_stops=("</search>",),
            final_stops=("</search>",),
            on_eos="end",
            on_length="parse",
            answer_from="response",
            prompt_answers_count=True,
            question_mark=False,
            cut=None,
            drop_eos=True,  # eval_multiquery.py decodes each turn (skip_special_tokens) and re-encodes
            observe_cut=None,  # eval_multiquery.py prints each document whole
            final_turn=False,
            corrective=None,
            answer_rule="the last <answer>...</answer> of prompt + response, unstripped (the prompt's "
            "example 'Beijing' when the response has none); EM only, no format check",
        ),
        # rag_r1/llm_agent/generation_mq.py (Search-R1's loop) and the training data's '?'
        "train": dict(
            parse=rag_r1_parse,
            observe=rag_r1_observe,
            observe_cut=rag_r1_observe_cut,
            extract=last_answer,
            validate=search_r1_valid_sequence,
            prompt_answers_count=False,
            question_mark=True,
            answer_rule="the last <answer>...</answer> of the response, stripped",
            **SEARCH_R1_LOOP,
        ),
    },
)

# rag_r1_small: RAG-R1's tags and JSON documents with our wording (pipelines/dialects/small.py).
register_small(
    "rag_r1",
    ending=" One search may hold up to {max_queries} queries separated by | (for example "
    "{query_open} first query | second query {query_close}). "
    "Finish with the short final answer as {answer_open} answer {answer_close}.",
    max_queries=3,
    doc_style="json",
)
