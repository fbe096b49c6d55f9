"""R1-Searcher (RUCAIBox/R1-Searcher: ``evaluation/eval_search_loacl.py``; its OpenRLHF-RAG
training rollout ``experience_maker.py``; the reward servers ``train/reward_server_qwen_zero.py``,
``reward_server_llama_stage1.py`` and ``_stage2.py``), as its own code runs it.

Its evaluation and training code disagree (raw base-model prompt vs. the chat template, stops,
the turn limit), so the dialect has two modes: ``eval`` and ``train``.
"""

from __future__ import annotations

import re

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd, shipped_template, title_and_text
from pipelines.dialects.small import register as register_small
from pipelines.dialects.system import SynthTurns, System, register


def r1_searcher_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """``eval_search_loacl.py``: a turn stopped on ``</answer>`` with an ``<answer>`` answers with
    the text after the last ``<answer>``, NOT stripped (``pred_ans``); one stopped on
    ``<|end_of_query|>`` with a ``<|begin_of_query|>`` searches the text after the last
    ``<|begin_of_query|>`` with quotes, tabs and ``...`` cleaned (not stripped); an empty query
    (``query_inst_error``) or any other ending, EOS and the token limit included (``shot_down``),
    ends the item; the dialect's ``no_answer`` ("I don't know.") is then the prediction. The
    label is the original's ``stop_reason_final``."""
    if not end.length and text.endswith("</answer>") and "<answer>" in text:
        return Action("answer", answer=text[: -len("</answer>")].split("<answer>")[-1], label="finished")
    if not end.length and text.endswith("<|end_of_query|>") and "<|begin_of_query|>" in text:
        query = text[: -len("<|end_of_query|>")].split("<|begin_of_query|>")[-1]
        query = query.replace('"', "").replace("'", "").replace("\t", " ").replace("...", "")
        if query:
            return Action("search", queries=(query,))
        return Action("end", reason="empty query", label="query_inst_error")
    return Action("end", reason="neither an answer nor a query", label="shot_down")


def r1_searcher_train_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """Mode ``train`` (OpenRLHF-RAG ``experience_maker.py``): the only stop is ``<|end_of_query|>``;
    a turn that stopped on it with a ``<|begin_of_query|>`` searches the text after the last one,
    double quotes removed, stripped, whitespace squeezed (empty: the rollout ends); any other turn
    (EOS, the token limit) ends the rollout, the reward server reading the answer from the whole
    response."""
    if not end.eos and not end.length and text.endswith("<|end_of_query|>") and "<|begin_of_query|>" in text:
        query = text[: -len("<|end_of_query|>")].split("<|begin_of_query|>")[-1]
        query = " ".join(query.replace('"', "").split())
        if query:
            return Action("search", queries=(query,))
        return Action("end", reason="empty query")
    if "</answer>" in text:
        return Action("answer", answer=None)
    return Action("end", reason="the rollout ended without a query")


def r1_searcher_rewrite(text: str, action: Action) -> str | None:
    """A searching turn continues as ``generated_text.strip()`` + ``<|end_of_query|>``: the
    original strips the turn (both ends) before appending the tag and the documents."""
    if action.kind != "search" or not text.endswith("<|end_of_query|>"):
        return None
    new = text[: -len("<|end_of_query|>")].strip() + "<|end_of_query|>"
    return new if new != text else None


def r1_searcher_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """After ``<|end_of_query|>``: ``\\n\\n<|begin_of_documents|>\\n``, ``(i)`` + document + newline
    each (``None`` when nothing came back), ``<|end_of_documents|>\\n\\n``. A document is its
    KILT corpus line without the id: ``title`` + three spaces + ``text`` (FlashRAG's port writes
    ``Title: t Text: x``)."""
    docs = results[0] if results else []
    lines = []
    for i, doc in enumerate(docs, 1):
        title, text = title_and_text(doc)
        lines.append(f"({i}){title}   {text}\n" if text else f"({i}){title}\n")
    body = "".join(lines) if lines else "None"
    return f"\n\n<|begin_of_documents|>\n{body}<|end_of_documents|>\n\n"


# The reward servers' get_qa split the query (prompt + response) on the generation prompt's end
# and keep the LAST piece: the Qwen server (reward_server_qwen_zero.py:150-154) on the base
# prompt's, the Llama servers (reward_server_llama_stage1.py:122-125, _stage2.py:149-152) on
# Llama 3's chat header. Before that they strip EOS/pad runs from both ends and append one EOS
# (strip_sequence(...) + eos_token, qwen :170-173, llama stage 1 :143-146, stage 2 :170-173),
# the eos of the policy's tokenizer (--reward_pretrain): Qwen2.5's <|endoftext|>, Llama 3.1
# Instruct's <|eot_id|>.
R1S_SERVER_TURNS = {
    "qwen": ("\nAssistant: <think>", "<|endoftext|>"),
    "llama": ("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>", "<|eot_id|>"),
}


def r1_searcher_solution(response: str, server: str) -> str:
    """The text an R1-Searcher reward server scores (``get_qa``'s ``solution``): the response with
    EOS runs stripped from both ends and one EOS appended, then the text after the LAST
    occurrence of the server's turn marker, stripped. A response that writes a next turn itself
    (``\\nAssistant: <think>``) is scored on what follows it; an unclosed last ``<answer>`` reads
    to the EOS text."""
    marker, eos = R1S_SERVER_TURNS[server]
    core = re.sub(f"^({re.escape(eos)})+", "", response)
    core = re.sub(f"({re.escape(eos)})+$", "", core)
    return (core + eos).split(marker)[-1].strip()


def r1_searcher_answer(d: Dialect, response: str) -> str | None:
    """The reward servers' extraction: the text between the last ``<answer>`` and the
    ``</answer>`` after it, stripped (the evaluation's prediction is the answering turn's own,
    unstripped: :func:`r1_searcher_parse`)."""
    if "<answer>" not in response or "</answer>" not in response:
        return None
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def r1_searcher_validate_llama(response: str) -> tuple[bool, str]:
    """The format checks of R1-Searcher's Llama stage-2 reward server
    (``train/reward_server_llama_stage2.py``): document/query tag counts all equal, no ``<think>``
    and one each of ``</think>``, ``<answer>``, ``</answer>``, no CJK outside the documents. Unlike
    the Qwen server: no "Assistant" check, no check of tags inside the answer, no 10-word limit."""
    s = response
    counts = [s.count(t) for t in _R1S_TAGS]
    if len(set(counts)) != 1:
        return False, f"query/document tag counts differ: {counts}"
    if not (s.count("<think>") == 0 and s.count("</think>") == s.count("<answer>") == s.count("</answer>") == 1):
        return False, "expected no <think> and one </think>, <answer>, </answer>"
    outside = re.sub(r"<\|begin_of_documents\|>.*?<\|end_of_documents\|>", "", s, flags=re.DOTALL)
    if any("\u4e00" <= ch <= "\u9fff" for ch in outside):
        return False, "Chinese characters outside the documents"
    return True, "ok"


_R1S_TAGS = (
    "<|begin_of_documents|>\n",
    "<|end_of_documents|>\n\n",
    "<|begin_of_query|>",
    "<|end_of_query|>",
    "<|begin_of_documents|>",
    "<|end_of_documents|>",
    "<|begin_of_documents|>\n(1)",
)


def r1_searcher_validate(d: Dialect, response: str) -> tuple[bool, str]:
    """The format checks of R1-Searcher's Qwen stage-2 reward server (``reward_server_qwen_zero.py``)
    on the response after ``Assistant: <think>``: document/query tag counts all equal, no
    "Assistant"/"assistant", no ``<think>`` and one ``</think>``, one answer block without query
    or document tags, at most 10 words, and no CJK outside the documents. The Llama server's
    checks: :func:`r1_searcher_validate_llama`. Only the text after the last ``\\nAssistant: <think>``
    is checked, as the server's ``get_qa`` reads it (a response that writes a next turn itself)."""
    s = response.split(R1S_SERVER_TURNS["qwen"][0])[-1].strip()
    counts = [s.count(t) for t in _R1S_TAGS]
    if len(set(counts)) != 1:
        return False, f"query/document tag counts differ: {counts}"
    if s.count("Assistant") or s.count("assistant"):
        return False, "'Assistant' in the response"
    if s.count("<think>") != 0 or s.count("</think>") != 1:
        return False, "expected no <think> and one </think>"
    if s.count("<answer>") != 1 or s.count("</answer>") != 1:
        return False, "expected one <answer> and one </answer>"
    answer = s.split("<answer>")[-1].split("</answer>")[0].strip()
    if "begin_of_query" in answer or "begin_of_documents" in answer:
        return False, "query or document tags inside the answer"
    if len(answer.split()) > 10:
        return False, "answer longer than 10 words"
    outside = re.sub(r"<\|begin_of_documents\|>.*?<\|end_of_documents\|>", "", s, flags=re.DOTALL)
    if any("\u4e00" <= ch <= "\u9fff" for ch in outside):
        return False, "Chinese characters outside the documents"
    return True, "ok"


def r1_searcher_stage1(response: str) -> tuple[bool, bool]:
    """R1-Searcher's stage-1 reward terms (``reward_server_llama_stage1.py``) on the response:
    (retrieval well formed: the seven query/document tag counts equal and at least 1,
    format: no ``<think>``, one ``</think>``, one ``<answer>``, one ``</answer>``)."""
    s = response.strip()
    counts = {s.count(t) for t in _R1S_TAGS}  # the same seven tags the Qwen/Llama validators count
    retrieval = len(counts) == 1 and counts.pop() >= 1
    fmt = s.count("<think>") == 0 and s.count("</think>") == s.count("<answer>") == s.count("</answer>") == 1
    return retrieval, fmt


# R1-Searcher's response is one thought opened by the prompt ("Assistant: <think>"): queries
# sit inside it, and its only </think> comes before the answer (its stage-2 format check).
def _one_thought_search(d: Dialect, lead: str, query: str) -> str:
    return f"{lead}\n{query}"


def _one_thought_final(d: Dialect, lead: str, answer: str) -> str:
    return f"{lead} {d.think_close}\n\n{answer}"


SYSTEM = System(
    name="r1_searcher",
    profile="r1_searcher",
    reward="r1_searcher_stage2",
    configs=(
        "configs/dialects/r1_searcher.yaml",
        "configs/judges/r1_searcher.yaml",
        "configs/methods/r1_searcher.yaml",
        "configs/replicate/r1_searcher.yaml",
        "configs/train/r1_searcher_reinforce_pp_stage1.yaml",
        "configs/train/r1_searcher_reinforce_pp_stage2.yaml",
        "configs/train/demo/r1_searcher_stage1.yaml",
        "configs/train/demo/r1_searcher_stage2.yaml",
    ),
    flashrag_differences=(
        "prompt: FlashRAG's ReasoningPipeline.user_prompt writes a literal backslash-n in "
        "'</think>\\\\n\\\\n<answer>'; R1-Searcher's eval_search_loacl.py has two real newlines",
        "prompt placement: FlashRAG's PromptTemplate wraps the prompt in the model's chat template when it "
        "has one; R1-Searcher uses the raw base-model prompt, never a chat template",
        "documents: FlashRAG formats '(i)Title: t Text: x'; R1-Searcher's corpus line is "
        "'title   text' (KILT 100-word split, id removed)",
        "observation: FlashRAG appends '\\n\\n<|begin_of_documents|>\\n' + docs + '\\n<|end_of_documents|>\\n\\n' "
        "(an extra newline before the closing tag); R1-Searcher has none",
        "query: FlashRAG searches the last query block, stripped; R1-Searcher takes the text after the last "
        "<|begin_of_query|>, removes quotes, '...' and turns tabs into spaces, and does not strip it",
        "turn limit: FlashRAG max_retrieval_num=5; R1-Searcher stops at the 10th generation (k == 9)",
        "no documents: FlashRAG writes nothing; R1-Searcher writes 'None'",
    ),
    turns=SynthTurns(search=_one_thought_search, final=_one_thought_final),
)

_TEMPLATE = shipped_template("r1_searcher")
# R1-Searcher's tags: its own dialect's and r1_searcher_small's.
R1_SEARCHER_TAGS = dict(
    query_open="<|begin_of_query|>",
    query_close="<|end_of_query|>",
    obs_open="<|begin_of_documents|>",
    obs_close="<|end_of_documents|>",
)
# Evaluation's stop strings (eval_search_loacl.py), the same for every turn.
R1_SEARCHER_EVAL_STOPS = ("<|im_end|>", "<|endoftext|>", "<|end_of_query|>", "</answer>")
register(
    SYSTEM,
    observe=r1_searcher_observe,
    validate=r1_searcher_validate,
    **R1_SEARCHER_TAGS,
    rewrite=r1_searcher_rewrite,
    # Read by training.rewards.R1SearcherStage1: the stage-1 server's own two checks.
    extra_options={"stage1_checks": r1_searcher_stage1},
    parse=r1_searcher_parse,
    extract=r1_searcher_answer,
    search_stops=(),
    final_stops=(),
    mode="eval",
    modes={
        # evaluation/eval_search_loacl.py
        "eval": dict(
            trained_obs_prefix="",  # evaluation trains nothing
            parse=r1_searcher_parse,
            search_stops=R1_SEARCHER_EVAL_STOPS,
            final_stops=R1_SEARCHER_EVAL_STOPS,
            template=_TEMPLATE["template"],
            base_template=None,
            placement="raw",
            prompt_suffix="",
            no_answer="I don't know.",
            limit_label="many_retrieve",
            final_turn=False,
            answer_from="action",
            answer_rule="the answering turn's text between its last <answer> and </answer>, not stripped; "
            '"I don\'t know." without one',
        ),
        # OpenRLHF-RAG experience_maker.py + prompts_dataset.py (--apply_chat_template)
        "train": dict(
            # experience_maker.py:1264-1293 masks from '<|begin_of_documents|>\n' on
            trained_obs_prefix="\n\n",
            parse=r1_searcher_train_parse,
            search_stops=("<|end_of_query|>",),
            final_stops=("<|end_of_query|>",),
            template=_TEMPLATE["train_template"],
            base_template=_TEMPLATE["train_base_template"],
            placement="system",
            prompt_suffix="<think>",
            no_answer=None,
            limit_label="",
            # t == 8: the 9th generation is kept and the rollout ends (agent.max_turns 8)
            final_turn=True,
            answer_from="response",
            answer_rule="the reward server's: the text between the last <answer> and </answer> of the "
            "response, stripped",
        ),
    },
)

# r1_searcher_small: R1-Searcher's tags with our wording (pipelines/dialects/small.py).
register_small(
    "r1_searcher",
    ending=" Finish with the short final answer as {answer_open} answer {answer_close}.",
    **R1_SEARCHER_TAGS,
)
