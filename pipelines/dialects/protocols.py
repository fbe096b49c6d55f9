"""Protocol pieces more than one seed system uses (each system's own are in its module).

Search-R1's document block (HARR's generator and ProRAG's inference write the same lines), the
last ``<answer>`` block of a response (Search-R1, RAG-R1's training loop, HARR), and RAG-R1's
evaluation's lack of a format check (HARR scores the answer only too).
"""

from __future__ import annotations

import re

from harness.types import Doc
from pipelines.dialects.base import Dialect, title_and_text


def search_r1_docs(docs: list[Doc]) -> str:
    """``_passages2string``: ``Doc i(Title: first line) rest`` per document, each line ended."""
    out = ""
    for i, doc in enumerate(docs, 1):
        title, text = title_and_text(doc)
        out += f"Doc {i}(Title: {title}) {text}\n"
    return out


def last_answer(d: Dialect, response: str) -> str | None:
    """The LAST ``<answer>`` block of the response, stripped: Search-R1's ``qa_em.extract_solution``
    with harness's fix (the prompt's example answer never counts). ``qa_em_answer`` on prompt +
    response is the original itself (metric profile ``search_r1``)."""
    matches = re.findall(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


def no_format_check(d: Dialect, response: str) -> tuple[bool, str]:
    """RAG-R1's evaluation script scores EM only: every response passes."""
    return True, "no format check (eval_multiquery.py scores EM only)"
