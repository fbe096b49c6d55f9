"""The seed systems' protocols, as their own inference code runs them.

Each function reproduces one rule of one original repository (cited in its docstring; the
commits are in the template files under ``configs/dialects/``). Where FlashRAG's port of a
system differs from the original, the original is what is here; the differences are listed in
each dialect's ``options["flashrag_differences"]`` (see :mod:`.registry`) and shown by
``harness prompt``.

Two deliberate departures, forced by running on token ids rather than re-encoded text:

- R1-Searcher strips whitespace around the model's text before appending ``<|end_of_query|>``
  and the documents (``generated_text.strip()``); we keep the model's own tokens.
- The originals re-append a trimmed stop string (ReSearch, R1-Searcher) or cut the decoded
  text after it (Search-R1, RAG-R1); the backends here keep the stop string's own tokens.
"""

from __future__ import annotations

import json
import re

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, doc_contents, title_and_text

# ---- Search-R1 (search_r1/llm_agent/generation.py, infer.py) and RAG-R1 (generation_mq.py) ----
_FIRST_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

SEARCH_R1_CORRECTIVE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


def search_r1_parse(d: Dialect, text: str, eos: bool) -> Action:
    """``postprocess_predictions``: the FIRST ``<search>``/``<answer>`` block of the turn, its
    content stripped. An empty query is still a search (the original sends it); no block at all
    is an invalid action."""
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
    """Search-R1 ``qa_em.extract_solution`` on the response only: the LAST ``<answer>`` block,
    stripped (the original reads prompt + response and skips the prompt's example by asking for
    two matches)."""
    matches = re.findall(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


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


def rag_r1_parse(d: Dialect, text: str, eos: bool) -> Action:
    """Search-R1's parse; the query is split on commas, pieces stripped, empty ones dropped
    (``batch_search``). The prompt asks for up to three; the code does not cap them."""
    action = search_r1_parse(d, text, eos)
    if action.kind != "search":
        return action
    queries = tuple(q.strip() for q in action.queries[0].split(",") if q.strip())
    return Action("search", queries=queries)


def rag_r1_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """``generation_mq.execute_predictions``: ``{"query": [...], "documents": [...]}`` as
    ``json.dumps(..., indent=2)`` (ASCII-escaped) inside ``\\n<information>\\n ... \\n</information>\\n``;
    each query's documents are ``Doc i: contents`` lines, stripped."""
    documents = [
        "".join(f"Doc {i}: {doc_contents(doc)}\n" for i, doc in enumerate(docs, 1)).strip() for docs in results
    ]
    payload = json.dumps({"query": list(queries), "documents": documents}, indent=2)
    return f"\n<information>\n{payload.strip()}\n</information>\n"


# ---- ReSearch (src/flashrag/pipeline/active_pipeline.py ReSearchPipeline, reward re_search.py) --
def research_parse(d: Dialect, text: str, eos: bool) -> Action:
    """``run_item``: a turn that stopped on ``</search>`` searches the text between the last
    ``<search>`` and that tag, stripped (empty: no retrieval); a turn that ended on EOS ends
    the item, its answer read from the whole response; anything else (cut off) is not an
    answer."""
    if not eos and text.endswith("</search>"):
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
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                boxed = text[start : j + 1]
                # remove_boxed accepts only "\boxed{...}"; "\fbox{...}" raises there (answer "").
                return boxed[len("\\boxed{") : -1] if boxed.startswith("\\boxed{") else None
    return None


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


# ---- R1-Searcher (evaluation/eval_search_loacl.py; train/reward_server_qwen_zero.py) ---------
def r1_searcher_parse(d: Dialect, text: str, eos: bool) -> Action:
    """A turn stopped on ``</answer>`` with an ``<answer>`` answers (the text after the last
    ``<answer>``); one stopped on ``<|end_of_query|>`` with a ``<|begin_of_query|>`` searches the
    text after the last ``<|begin_of_query|>`` with quotes, tabs and ``...`` cleaned (NOT
    stripped); an empty query (``query_inst_error``) or any other ending (``shot_down``) ends
    the item."""
    if text.endswith("</answer>") and "<answer>" in text:
        return Action("answer", answer=text[: -len("</answer>")].split("<answer>")[-1].strip())
    if text.endswith("<|end_of_query|>") and "<|begin_of_query|>" in text:
        query = text[: -len("<|end_of_query|>")].split("<|begin_of_query|>")[-1]
        query = query.replace('"', "").replace("'", "").replace("\t", " ").replace("...", "")
        if query:
            return Action("search", queries=(query,))
        return Action("end", reason="empty query (query_inst_error)")
    return Action("end", reason="neither an answer nor a query (shot_down)")


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


def r1_searcher_answer(d: Dialect, response: str) -> str | None:
    """The text between the last ``<answer>`` and the ``</answer>`` after it, stripped."""
    if "<answer>" not in response or "</answer>" not in response:
        return None
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def r1_searcher_validate(d: Dialect, response: str) -> tuple[bool, str]:
    """The format checks of R1-Searcher's stage-2 reward (``reward_server_qwen_zero.py``) on the
    response after ``Assistant: <think>``: document/query tag counts all equal, no
    "Assistant"/"assistant", no ``<think>`` and one ``</think>``, one answer block without query
    or document tags, at most 10 words, and no CJK outside the documents."""
    s = response.strip()
    counts = [
        s.count(t)
        for t in (
            "<|begin_of_documents|>\n",
            "<|end_of_documents|>\n\n",
            "<|begin_of_query|>",
            "<|end_of_query|>",
            "<|begin_of_documents|>",
            "<|end_of_documents|>",
            "<|begin_of_documents|>\n(1)",
        )
    ]
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


def prorag_parse(d: Dialect, text: str, eos: bool) -> Action:
    """``</answer>`` in the turn answers (the first ``<answer>`` block, stripped; "" if none
    parses); ``</subquery>`` searches the first ``<subquery>`` block, stripped (none parses: the
    query-error observation); anything else (``</subanswer>``, EOS) continues with a new step."""
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
    """The first ``<answer>`` block, stripped (ProRAG's ``outcome_reward`` and inference)."""
    m = re.search(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
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


def r1_searcher_stage1(response: str) -> tuple[bool, bool]:
    """R1-Searcher's stage-1 reward terms (``reward_server_llama_stage1.py``) on the response:
    (retrieval well formed: the seven query/document tag counts equal and at least 1,
    format: no ``<think>``, one ``</think>``, one ``<answer>``, one ``</answer>``)."""
    s = response.strip()
    counts = {
        s.count(t)
        for t in (
            "<|begin_of_documents|>\n",
            "<|end_of_documents|>\n\n",
            "<|begin_of_query|>",
            "<|end_of_query|>",
            "<|begin_of_documents|>",
            "<|end_of_documents|>",
            "<|begin_of_documents|>\n(1)",
        )
    }
    retrieval = len(counts) == 1 and counts.pop() >= 1
    fmt = s.count("<think>") == 0 and s.count("</think>") == s.count("<answer>") == s.count("</answer>") == 1
    return retrieval, fmt
