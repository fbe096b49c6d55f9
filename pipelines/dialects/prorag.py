"""ProRAG (lilinwz/ProRAG: ``inference.py``, the reward ``prorag/rl/reward.py``, the step check
``prorag/prm/filter.py``), as its own code runs it: ``<step>`` blocks, each a sub-query with its
retrieval, a sub-answer, or the final answer.
"""

from __future__ import annotations

import re

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd
from pipelines.dialects.protocols import search_r1_docs
from pipelines.dialects.system import SynthTurns, System, register

PRORAG_QUERY_ERROR = "\n<retrieval>Error in query parsing</retrieval>\n<step>\n"
PRORAG_NEXT_STEP = "\n<step>\n"


def prorag_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """``inference.py``: ``</answer>`` in the turn answers (the first ``<answer>`` block,
    stripped; "" if none parses; both case-sensitive there); ``</subquery>`` searches the first
    ``<subquery>`` block, stripped (none parses: the query-error observation); anything else
    (``</subanswer>``, EOS, a token-limit cut) continues with ``\\n<step>\\n``."""
    if "</answer>" in text:
        m = re.search(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
        return Action("answer", answer=m.group(1).strip() if m else "")
    if "</subquery>" in text:
        m = re.search(r"<subquery>(.*?)</subquery>", text, flags=re.DOTALL)
        if m is None:
            return Action("invalid", reason="no <subquery> block")
        return Action("search", queries=(m.group(1).strip(),))
    return Action("continue")


def prorag_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """``\\n<retrieval>\\n{Search-R1 passages, last newline kept}\\n</retrieval>\\n<step>\\n``."""
    return f"\n<retrieval>\n{search_r1_docs(results[0] if results else [])}\n</retrieval>\n<step>\n"


def first_answer(d: Dialect, response: str) -> str | None:
    """ProRAG's ``outcome_reward`` (``prorag/rl/reward.py``): the first ``<answer>`` block of the
    completion, tags matched case-insensitively, stripped. (The evaluation's prediction is the
    answering turn's own, :func:`prorag_parse`.)"""
    m = re.search(r"<answer>(.*?)</answer>", response, flags=re.DOTALL | re.IGNORECASE)
    return m.group(1).strip() if m else None


_PRORAG_TAGS = {
    "<step>": ("</step>", "S"),
    "<subquery>": ("</subquery>", "Q"),
    "<retrieval>": ("</retrieval>", "R"),
    "<subanswer>": ("</subanswer>", "A"),
    "<answer>": ("</answer>", "F"),
}


def prorag_validate(d: Dialect, response: str) -> tuple[bool, str]:
    """ProRAG ``format_reward`` (valid = +1): with the prompt's opening ``<step>`` put back, the
    tags pair up in order and read (step subquery retrieval step subanswer)* step answer."""
    tags = re.findall(r"</?[a-zA-Z]+>", "<step>\n" + response)
    symbols = []
    for i in range(0, len(tags), 2):
        if tags[i] not in _PRORAG_TAGS:
            return False, f"unexpected tag {tags[i]}"
        close, symbol = _PRORAG_TAGS[tags[i]]
        if i + 1 >= len(tags) or tags[i + 1] != close:
            return False, f"{tags[i]} not closed by {close}"
        symbols.append(symbol)
    if symbols[-2:] != ["S", "F"]:
        return False, "does not end with a step and an answer"
    body = symbols[:-2]
    if len(body) % 5 or any(body[k : k + 5] != ["S", "Q", "R", "S", "A"] for k in range(0, len(body), 5)):
        return False, "steps are not (step subquery retrieval step subanswer)*"
    return True, "ok"


_PRORAG_STEPS = (
    ["<step>", "</step>", "<subquery>", "</subquery>", "<retrieval>", "</retrieval>"],
    ["<step>", "</step>", "<subanswer>", "</subanswer>"],
    ["<step>", "</step>", "<answer>", "</answer>"],
)


def prorag_step_ok(step: str) -> bool:
    """ProRAG's ``format_check`` (``prorag/prm/filter.py``) on one step as the loop records it (the
    model's turn and its observation): with the step's opening ``<step>`` (in the text before it)
    put back and the next step's ``<step>`` (its observation's end) left off, the tags are exactly
    a search, a sub-answer or an answer step."""
    tags = re.findall(r"</?[a-zA-Z]+>", "<step>\n" + step)
    if len(tags) > 1 and tags[-1] == "<step>":
        tags = tags[:-1]
    return tags in _PRORAG_STEPS


# A synthesized ProRAG turn: the prompt / observation already opened the <step>.
def _step_search(d: Dialect, lead: str, query: str) -> str:
    return f"{lead} {d.think_close}\n{query}"


def _step_final(d: Dialect, lead: str, answer: str) -> str:
    return f"{lead} {d.think_close}\n{answer}"


def _step_sub_answer(d: Dialect, fact: str) -> str:
    """(step subquery retrieval step subanswer) per hop: the sub-answer step after a retrieval."""
    return f"The retrieved passage answers the sub-question. {d.think_close}\n<subanswer> {fact} </subanswer>"


SYSTEM = System(
    name="prorag",
    profile="prorag",
    reward="prorag",
    configs=(
        "configs/dialects/prorag.yaml",
        "configs/methods/prorag.yaml",
        "configs/replicate/prorag.yaml",
        "configs/train/prorag/chain.yaml",
        "configs/train/prorag/sft.yaml",
        "configs/train/prorag/mcts.yaml",
        "configs/train/prorag/rft_sample.yaml",
        "configs/train/prorag/rft_sft.yaml",
        "configs/train/prorag/rl.yaml",
        "configs/train/prorag/cpu_chain.yaml",
        "configs/train/prorag/cpu_sft.yaml",
        "configs/train/prorag/mcts_cpu.yaml",
        "configs/train/prorag/cpu_sample.yaml",
        "configs/train/prorag/cpu_rft_sft.yaml",
        "configs/train/prorag/cpu_rl.yaml",
        "configs/train/prorag/cpu_eval.yaml",
        "configs/train/prorag_prm.yaml",
        "configs/train/prorag_prm_cpu.yaml",
        "configs/train/prorag_dual_granularity.yaml",
        "configs/train/demo/prorag_mcts.yaml",
        "configs/train/demo/prorag_prm.yaml",
        "configs/train/demo/prorag_rft_sft.yaml",
        "configs/train/demo/prorag_rl.yaml",
    ),
    flashrag_differences=("FlashRAG has no ProRAG port; this dialect follows ProRAG's inference.py",),
    turns=SynthTurns(search=_step_search, final=_step_final, sub_answer=_step_sub_answer),
)

register(
    SYSTEM,
    parse=prorag_parse,
    observe=prorag_observe,
    extract=first_answer,
    validate=prorag_validate,
    search_stops=("</subquery>", "</subanswer>", "</answer>", "<|im_end|>"),
    final_stops=("</subquery>", "</subanswer>", "</answer>", "<|im_end|>"),
    corrective=PRORAG_QUERY_ERROR,
    continue_text=PRORAG_NEXT_STEP,
    on_eos="parse",
    on_length="parse",
    no_answer="",
    query_open="<subquery>",
    query_close="</subquery>",
    obs_open="<retrieval>",
    obs_close="</retrieval>",
    think_open="<step>",
    think_close="</step>",
    # Read by training.data.mcts: ProRAG's format_check of a step (prorag/prm/filter.py).
    extra_options={"step_check": prorag_step_ok},
    answer_rule="the answering turn's first <answer>...</answer>, stripped ('' without one); the "
    "reward reads the completion's first, tags case-insensitive",
)
