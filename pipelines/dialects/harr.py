"""HARR (zyc140345/HARR), as its own code runs it: the rollouts of its Search-R1 generator
(``generator.py`` ``search_r1_generate``), the frozen generator its retriever RL drives.
"""

from __future__ import annotations

import re

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd
from pipelines.dialects.protocols import last_answer, no_format_check, search_r1_docs
from pipelines.dialects.system import System, register

# After every turn that does not answer: the turn + '\n\n<information>{results}</information>\n\n'
# (prompt.py SEARCH_R1_SEARCH_TEMPLATE), results '' when the turn searched nothing.
HARR_NO_SEARCH = "\n\n<information></information>\n\n"
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SEARCH_BLOCK_ANY = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def harr_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """``search_r1_generate``: the turn's LAST ``<answer>`` block, unstripped, answers when it is
    not empty (``if response: break``); else its LAST ``<search>`` block, unstripped, searches when
    not empty (``if sub_qa``); else nothing is searched and the empty ``<information>`` block
    follows, EOS and token-limit turns included, until ``max_iterations`` turns."""
    answers = _ANSWER_BLOCK.findall(text)
    if answers and answers[-1]:
        return Action("answer", answer=answers[-1])
    queries = _SEARCH_BLOCK_ANY.findall(text)
    if queries and queries[-1]:
        return Action("search", queries=(queries[-1],))
    return Action("invalid", reason="no search: the empty <information> block follows")


def harr_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """``SEARCH_R1_SEARCH_TEMPLATE`` with ``_nodes2string``: ``Doc i(Title: t) text`` lines, each
    ended, NOT stripped (Search-R1's own generation.py strips them)."""
    return f"\n\n<information>{search_r1_docs(results[0] if results else [])}</information>\n\n"


SYSTEM = System(
    name="harr",
    profile="harr",
    # HARR trains its retriever, not the policy: the retriever RL's reward is a metric
    # (training.retriever_config's algo.reward, f1_squad), not a training.rewards reward.
    reward=None,
    configs=(
        "configs/dialects/harr.yaml",
        "configs/methods/harr.yaml",
        "configs/replicate/harr.yaml",
        "configs/train/harr/minilm_search_r1.yaml",
        "configs/train/harr/minilm_search_r1_ppo.yaml",
        "configs/train/demo/harr_grpo.yaml",
    ),
    flashrag_differences=("FlashRAG has no HARR port; this dialect follows HARR's generator.py search_r1_generate",),
)

register(
    SYSTEM,
    parse=harr_parse,
    observe=harr_observe,
    extract=last_answer,
    validate=no_format_check,
    search_stops=("</search>", "</answer>"),
    final_stops=("</search>", "</answer>"),
    corrective=HARR_NO_SEARCH,
    on_eos="parse",
    on_length="parse",
    final_turn=False,
    drop_eos=True,  # the next prompt is text (prompt += output_text), re-encoded by the server
    no_answer="None",  # str(response) of a rollout that never answered
    answer_rule="the last non-empty <answer>...</answer> of the answering turn, unstripped; 'None' without one",
)
