"""RAG-R1's filtered RL training set (``harness data rag-r1-train``): 6,664 HotpotQA train questions
its SFT model could not already answer, published in inclusionAI/AgenticLearning at cfd8750
(``RAG-R1/data/RL/hotpotqa_train_filter_mq/train_data.json``: a JSON array of ``{question,
golden_answers}`` with one answer string each), converted to a FlashRAG question file (JSONL:
``id``, ``question``, ``golden_answers`` as a list) for ``data.file`` of ``rag_r1_ppo.yaml``.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

URL = (
    "https://raw.githubusercontent.com/inclusionAI/AgenticLearning/cfd875062d9f777fc9d193d99878f151bebfb1ae/"
    "RAG-R1/data/RL/hotpotqa_train_filter_mq/train_data.json"
)


def fetch(url: str = URL, timeout: float = 60.0) -> bytes:
    """The published file's bytes; a clear error when it cannot be downloaded (no network)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (a fixed https URL)
            return r.read()
    except OSError as e:
        raise RuntimeError(
            f"cannot download RAG-R1's training set from {url} ({e}); download it by hand and pass --source FILE"
        ) from None


def convert(raw: bytes | str, out: str | Path, where: str = "train_data.json") -> int:
    """Write RAG-R1's JSON array as FlashRAG JSONL at ``out``; returns the number of questions.
    Errors name the record at fault."""
    try:
        records = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    if not isinstance(records, list):
        raise ValueError(f"{where}: expected a JSON array of {{question, golden_answers}}")
    lines = []
    for i, r in enumerate(records):
        if not isinstance(r, dict) or not str(r.get("question", "")).strip():
            raise ValueError(f"{where}: record {i} has no question")
        gold = r.get("golden_answers")
        golds = [gold] if isinstance(gold, str) else gold
        if not golds or not all(isinstance(g, str | int | float) for g in golds):
            raise ValueError(f"{where}: record {i} has no golden_answers")
        lines.append(
            json.dumps({"id": f"rag_r1_{i}", "question": r["question"], "golden_answers": [str(g) for g in golds]})
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def rag_r1_train(out: str | Path, source: str | None = None) -> int:
    """Convert a local copy (``source``) or the downloaded file into ``out``."""
    if source:
        return convert(Path(source).read_bytes(), out, where=source)
    return convert(fetch(), out, where=URL)
