"""The seed systems' protocols, as their own evaluation (and, where it differs, training) code runs them.

Each function follows one rule of one original repository (cited in its docstring; the commits
are in the dialect files under ``configs/dialects/``): how a turn is cut and parsed, what
follows it, the observation, the answer, and the format check of the system's reward. Where
FlashRAG's port of a system differs from the original, the original is what is here (see
``options["flashrag_differences"]``). What still differs from an original is listed under
``differences`` in its dialect file and printed by ``harness prompt`` (``--json``: ``differences``);
the main one, common to all five, is that the loop works on token ids: the originals re-encode
their text (or re-append a trimmed stop string), while the backends here keep the model's own
tokens, the stop string's included.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd, closing_brace, doc_contents, title_and_text

# ---- Search-R1 (search_r1/llm_agent/generation.py, infer.py) and RAG-R1 (generation_mq.py) ----
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


def search_r1_docs(docs: list[Doc]) -> str:
    """``_passages2string``: ``Doc i(Title: first line) rest`` per document, each line ended."""
    out = ""
    for i, doc in enumerate(docs, 1):
        title, text = title_and_text(doc)
        out += f"Doc {i}(Title: {title}) {text}\n"
    return out


def search_r1_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """``execute_predictions``: the stripped passages inside ``<information>`` with NO inner
    newlines, two newlines either side (FlashRAG's port adds a newline inside each tag)."""
    body = search_r1_docs(results[0] if results else []).strip()
    return f"\n\n<information>{body}</information>\n\n"


def last_answer(d: Dialect, response: str) -> str | None:
    """The LAST ``<answer>`` block of the response, stripped: Search-R1's ``qa_em.extract_solution``
    with harness's fix (the prompt's example answer never counts). ``qa_em_answer`` on prompt +
    response is the original itself (metric profile ``search_r1``)."""
    matches = re.findall(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


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


def no_format_check(d: Dialect, response: str) -> tuple[bool, str]:
    """RAG-R1's evaluation script scores EM only: every response passes."""
    return True, "no format check (eval_multiquery.py scores EM only)"


# ---- HARR's generator (zyc140345/HARR generator.py search_r1_generate) -------------------------
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


# ---- ReSearch (src/flashrag/pipeline/active_pipeline.py ReSearchPipeline, reward re_search.py) --
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


# ---- R1-Searcher (evaluation/eval_search_loacl.py; train/reward_server_qwen_zero.py) ---------
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


# ---- ProRAG (inference.py, prorag/rl/reward.py) -----------------------------------------------
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


def r1_searcher_stage1(response: str) -> tuple[bool, bool]:
    """R1-Searcher's stage-1 reward terms (``reward_server_llama_stage1.py``) on the response:
    (retrieval well formed: the seven query/document tag counts equal and at least 1,
    format: no ``<think>``, one ``</think>``, one ``<answer>``, one ``</answer>``)."""
    s = response.strip()
    counts = {s.count(t) for t in _R1S_TAGS}  # the same seven tags the Qwen/Llama validators count
    retrieval = len(counts) == 1 and counts.pop() >= 1
    fmt = s.count("<think>") == 0 and s.count("</think>") == s.count("<answer>") == s.count("</answer>") == 1
    return retrieval, fmt
