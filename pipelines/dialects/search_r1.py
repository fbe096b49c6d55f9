"""Search-R1 (PeterGriffinJin/Search-R1: ``search_r1/llm_agent/generation.py``, ``infer.py``, the
reward ``verl/utils/reward_score/qa_em.py`` and v0.3's ``qa_em_format.py``), as its own code runs it.

The rollout has no stop strings: a turn runs to EOS or the token limit and is cut after its first
``</search>`` (else ``</answer>``); the FIRST block acts, a turn without one gets the corrective
message, and one final no-search turn follows ``max_turns``. RAG-R1's training loop is this one
(:mod:`.rag_r1` imports it).
"""

from __future__ import annotations

import re
from typing import Any

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd
from pipelines.dialects.protocols import last_answer, search_r1_docs
from pipelines.dialects.small import register as register_small
from pipelines.dialects.system import System, register

_FIRST_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

SEARCH_R1_CORRECTIVE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


def search_r1_cut(text: str) -> int | None:
    """``_postprocess_responses``: a turn is cut after its FIRST ``</search>``, even when an
    ``</answer>`` comes earlier; without one, after its first ``</answer>``; else kept whole.
    (Search-R1's rollout has no stop strings: the cut is what ends a turn.)"""
    for tag in ("</search>", "</answer>"):
        if tag in text:
            return text.index(tag) + len(tag)
    return None


def search_r1_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """``postprocess_predictions`` on the cut turn: the FIRST ``<search>``/``<answer>`` block, its
    content stripped. An empty query is still a search (the original sends it); no block at all
    (a stray closing tag, or a turn that ended on EOS or the token limit without a block) is an
    invalid action: the corrective message follows and the loop goes on."""
    m = _FIRST_ACTION.search(text)
    if m is None:
        return Action("invalid", reason="no <search> or <answer> block")
    content = m.group(2).strip()
    if m.group(1) == "answer":
        return Action("answer", answer=content)
    return Action("search", queries=(content,))


def search_r1_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """``execute_predictions``: the stripped passages inside ``<information>`` with NO inner
    newlines, two newlines either side (FlashRAG's port adds a newline inside each tag)."""
    body = search_r1_docs(results[0] if results else []).strip()
    return f"\n\n<information>{body}</information>\n\n"


def qa_em_answer(text: str) -> str | None:
    """Search-R1 ``qa_em.extract_solution`` exactly, on prompt + response: ``None`` unless there
    are at least two ``<answer>`` blocks, else the last one, stripped. Search-R1's own prompt
    already holds two (``<answer> and </answer>`` and the example ``<answer> Beijing </answer>``),
    so a response without an answer is scored as "Beijing"."""
    matches = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    return matches[-1].strip() if len(matches) >= 2 else None


_SR1_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")
_SR1_MOVES = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_SR1_INSIDE = {"in_think", "in_search", "in_information", "in_answer"}


def search_r1_valid_sequence(d: Dialect, response: str) -> tuple[bool, str]:
    """Search-R1 v0.3 ``qa_em_format.is_valid_sequence`` on the response (the text after the
    assistant marker): balanced tags, then exactly think → (search → information → think)* →
    answer, with only whitespace between blocks and nothing after the answer."""
    for tag in ("think", "search", "information", "answer"):
        n_open, n_close = response.count(f"<{tag}>"), response.count(f"</{tag}>")
        if n_open != n_close:
            return False, f"Mismatch in {tag} tags: {n_open} opening vs {n_close} closing tags"
    state = "start"
    for part in _SR1_TAG.split(response):
        if not part.strip():
            continue
        if _SR1_TAG.fullmatch(part):
            nxt = _SR1_MOVES.get((state, part))
            if nxt is None:
                return False, f"Unexpected tag {part} in state {state}"
            state = nxt
        elif state not in _SR1_INSIDE:
            return False, f"Unexpected content between tags (state: {state})"
    if state != "end":
        return False, f"Incomplete sequence, ended in state {state}"
    return True, "Valid sequence format"


# Search-R1's rollout has no stop strings (a turn runs to EOS or the token limit and is then
# cut); stopping at the first </search> gives the same text. </answer> cannot be a stop: a later
# </search> moves the cut past it (_postprocess_responses).
SEARCH_R1_STOPS = ("</search>",)
# Search-R1's generation.py on every turn: cut, then the first block; EOS/length without one
# gets the corrective message; a final no-search turn after max_turns; the score reads the last
# <answer> of the sequence (qa_em).
SEARCH_R1_LOOP: dict[str, Any] = dict(
    cut=search_r1_cut,
    drop_eos=True,  # generation.py decodes each turn with skip_special_tokens=True and re-encodes it
    on_eos="parse",
    on_length="parse",
    final_turn=True,
    answer_from="response",
    corrective=SEARCH_R1_CORRECTIVE,
    search_stops=SEARCH_R1_STOPS,
    final_stops=SEARCH_R1_STOPS,
)


SYSTEM = System(
    name="search_r1",
    profile="search_r1",
    reward="em",
    configs=(
        "configs/dialects/search_r1.yaml",
        "configs/methods/search_r1.yaml",
        "configs/replicate/search_r1.yaml",
        "configs/train/search_r1_ppo_qwen2.5_3b.yaml",
        "configs/train/demo/search_r1_ppo.yaml",
    ),
    # What FlashRAG's own port (flashrag/pipeline/reasoning_pipeline.py, RUC-NLPIR/FlashRAG at
    # 1ee524901aa3daf009f97b7a31e7a1b58eee8206) does differently from the original code.
    flashrag_differences=(
        "observation: FlashRAG wraps documents as '\\n\\n<information>\\n' + docs + '\\n</information>\\n\\n' "
        "(newlines inside the tags, last document's newline kept); Search-R1's generation.py writes "
        "'\\n\\n<information>' + docs.strip() + '</information>\\n\\n'",
        "question: FlashRAG does not strip the question or append '?'; Search-R1 does",
        "invalid action: FlashRAG ends the item with the raw output as prediction; Search-R1 appends its "
        "corrective message ('My previous action is invalid. ...') and goes on",
        "parsing: FlashRAG answers only when the turn ends with </answer> (or <|endoftext|>) and takes the "
        "last <answer> block of that turn, and searches the last <search> block, stripped; Search-R1 acts on "
        "the FIRST <search>/<answer> block of the turn and scores the last <answer> of the sequence",
        "turn limit: FlashRAG runs max_retrieval_num=5 generations and then gives 'No valid answer found'; "
        "Search-R1 runs max_turns=4 search turns and then one final turn",
        "each turn's output is .strip()-ed before the observation is appended (Search-R1 keeps it)",
        "stops include '</answer>\\n', '</answer>\\n\\n' and ' </search>' variants as separate strings",
    ),
)

register(
    SYSTEM,
    parse=search_r1_parse,
    observe=search_r1_observe,
    extract=last_answer,
    validate=search_r1_valid_sequence,
    answer_rule="the last <answer>...</answer> of the response, stripped (qa_em reads prompt + response "
    "and needs two: metric profile search_r1)",
    **SEARCH_R1_LOOP,
)

# search_r1_small: Search-R1's tags with our wording (pipelines/dialects/small.py).
register_small(
    "search_r1",
    ending=" When no more knowledge is needed, give only the short answer as {answer_open} answer {answer_close}.",
)
