"""ReSearch (Agent-RL/ReSearch: its FlashRAG fork's ``src/flashrag/pipeline/active_pipeline.py``
``ReSearchPipeline``, the reward ``re_search.py``), as its own code runs it: a turn stops on
``</search>``, EOS ends the answering turn, and the answer is the last ``\\boxed{}`` inside the
first ``<answer>`` block.
"""

from __future__ import annotations

import re

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd, closing_brace, doc_contents
from pipelines.dialects.small import register as register_small
from pipelines.dialects.system import System, register


def research_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """``run_item``: a turn that stopped on ``</search>`` searches the text between the last
    ``<search>`` and that tag, stripped (empty: no retrieval); a turn that ended on EOS ends
    the item, its answer read from the whole response; a token-limit cut ends the item with the
    empty prediction (``over_length_flag``), a ``\\boxed{}`` answer before it notwithstanding."""
    eos = end.eos
    if not eos and not end.length and text.endswith("</search>"):
        end = text.rfind("</search>")
        start = text.rfind("<search>", 0, end)
        query = text[start + len("<search>") : end].strip() if start >= 0 else ""
        return Action("search", queries=(query,) if query else ())
    if eos:
        if "<answer>" in text or "</answer>" in text:
            return Action("answer", answer=None)
        return Action("end", reason="EOS without <answer>")
    return Action("none", reason="no </search> and no EOS")


def research_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """`` <result>\\n{contents joined by blank lines}\\n</result>`` right after ``</search>``, no
    newline after it; an empty query gets ``nothing to search``."""
    if not queries:
        body = "nothing to search"
    else:
        body = "".join(f"{doc_contents(doc)}\n\n" for doc in results[0]).strip()
    return f" <result>\n{body}\n</result>"


def last_boxed(text: str) -> str | None:
    """``last_boxed_only_string`` + ``remove_boxed``: the content of the last ``\\boxed{...}``
    (braces balanced), or the text after the last ``\\boxed `` up to a ``$``."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    end = closing_brace(text, start)
    if end is None:
        return None
    boxed = text[start : end + 1]
    # remove_boxed accepts only "\boxed{...}"; "\fbox{...}" raises there (answer "").
    return boxed[len("\\boxed{") : -1] if boxed.startswith("\\boxed{") else None


def research_answer(d: Dialect, response: str) -> str | None:
    """``extract_answer`` (the FIRST ``<answer>`` block) then its last ``\\boxed{}``."""
    m = re.search(r"<answer>(.*?)</answer>", response.strip(), flags=re.DOTALL)
    if m is None:
        return None
    return last_boxed(m.group(1))


def research_validate(d: Dialect, response: str) -> tuple[bool, str]:
    """``re_search.validate_format`` on the response, results included: paired and present
    think tags, exactly one answer, every ``<search>`` followed in order by ``</search>``,
    ``<result>``, ``</result>``, and ``\\boxed{`` with a ``}`` inside the answer."""
    t = response
    if t.count("<think>") != t.count("</think>"):
        return False, "<think> </think> not paired"
    if t.count("<think>") == 0 or t.count("</think>") == 0:
        return False, "<think> or </think> not found"
    if t.count("<answer>") != 1 or t.count("</answer>") != 1:
        return False, "<answer> or </answer> not found"
    pos = 0
    while (s := t.find("<search>", pos)) != -1:
        r, s_end = t.find("<result>", s), t.find("</search>", s)
        r_end = t.find("</result>", r)
        if -1 in (r, s_end, r_end):
            return False, "search/result tags are incomplete"
        if not s < s_end < r < r_end:
            return False, "search/result tags are nested in the wrong order"
        pos = r_end
    a, a_end = t.find("<answer>"), t.find("</answer>")
    if a > a_end:
        return False, "<answer> must be before </answer>"
    inside = t[a:a_end]
    if "\\boxed{" not in inside or "}" not in inside:
        return False, "answer is missing \\boxed{} format"
    return True, "format is correct"


# ReSearch's compute_score (re_search.py:151-156) splits the decoded prompt + response on the
# chat model's assistant header when the text holds one, else on the base prompt's "Assistant:".
RESEARCH_TURN_MARKERS = ("<|im_start|>assistant\n", "Assistant:")


def research_scored_turn(text: str) -> tuple[str, bool] | None:
    """What ReSearch's reward validates and scores (``re_search.compute_score``): ``text`` (the
    decoded prompt + response) split on ``<|im_start|>assistant\\n`` when it holds one, else on
    ``Assistant:``; piece [1], the text between the first marker (the prompt's) and the next. So a
    response that writes the next dialogue turn itself is validated only up to that turn, and then
    fails the EOS check (the piece does not end with the EOS token): returns (the piece, whether
    it runs to the end of the text). None without any marker (the original's index error)."""
    marker = RESEARCH_TURN_MARKERS[0] if RESEARCH_TURN_MARKERS[0] in text else RESEARCH_TURN_MARKERS[1]
    parts = text.split(marker)
    if len(parts) < 2:
        return None
    return parts[1], len(parts) == 2


SYSTEM = System(
    name="research",
    profile="research",
    reward="research_f1_format",
    configs=(
        "configs/dialects/research.yaml",
        "configs/judges/research.yaml",
        "configs/methods/research.yaml",
        "configs/replicate/research.yaml",
        "configs/train/research_grpo_qwen2.5_7b.yaml",
        "configs/train/smollm2_cpu_grpo_demo.yaml",
    ),
    flashrag_differences=(
        "FlashRAG's main repository has no ReSearch port; ReSearch ships its own FlashRAG fork whose "
        "ReSearchPipeline is what this dialect follows (EOS ends the answer turn, \\boxed{} answers)",
    ),
)

register(
    SYSTEM,
    parse=research_parse,
    observe=research_observe,
    extract=research_answer,
    validate=research_validate,
    search_stops=("</search>",),
    final_stops=(),
    obs_open="<result>",
    obs_close="</result>",
    boxed_answer=True,
    length_cut_answer="",
    answer_rule="the last \\boxed{} inside the first <answer>...</answer> of the response, read at EOS; "
    "'' after a token-limit cut",
)

# research_small: ReSearch's tags and \boxed{} answer with our wording (pipelines/dialects/small.py).
register_small(
    "research",
    ending=" When you are sure, give the final answer as {answer_open} \\boxed{{short answer}} {answer_close}.",
    obs_open="<result>",
    obs_close="</result>",
    boxed_answer=True,
)
