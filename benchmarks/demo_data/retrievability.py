"""How findable the demo's supporting passages are with BM25, the retriever the demo agent searches.

A two-hop question is learnable only when the searches an agent can make surface its two
passages. Per split and template, the share of questions whose

- ``question → hop 1``: first supporting passage is in the top k for the question text;
- ``question → both``: two supporting passages are both in the top k for the question text (a
  comparison names both entities; a bridge question names only the first);
- ``title → hop 2``: second supporting passage is in the top k for its own title, the second
  search ``harness data synthesize`` writes (the bridge entity the first passage names, or the
  second entity compared).

Each split is searched over its own corpus (``benchmarks.datasets.corpus_path``), as the agent
searches it. Run from the repo root::

    python -m scripts.demo_retrievability --split test,val,train,test_v1,train_v1
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks.datasets import corpus_path, load_examples
from benchmarks.demo_summary import question_template
from harness.retrieval.bm25 import BM25Retriever, build_bm25
from harness.retrieval.corpus import iter_corpus, read_corpus
from harness.types import Example

MEASURES = ("question → hop 1", "question → both", "title → hop 2")
Shares = dict[str, dict[str, dict[str, dict[int, float]]]]  # split → template → measure → k → share


def template_of(example: Example) -> str:
    """The question's template: v2 questions name theirs in metadata; v1 ones by their wording."""
    return example.metadata.get("template") or question_template(example.question)


def hop_hits(examples: list[Example], retriever, titles: dict[str, str], k: int) -> dict[str, list[bool]]:
    """Per measure (:data:`MEASURES`), one hit or miss per example, in order."""
    top = [{d.id for d in docs} for docs in retriever.search([e.question for e in examples], k)]
    hop2 = [e.metadata["supporting_doc_ids"][1] for e in examples]
    by_title = [{d.id for d in docs} for docs in retriever.search([titles[i] for i in hop2], k)]
    out: dict[str, list[bool]] = {m: [] for m in MEASURES}
    for e, got, second, got2 in zip(examples, top, hop2, by_title, strict=True):
        first = e.metadata["supporting_doc_ids"][0]
        out["question → hop 1"].append(first in got)
        out["question → both"].append(first in got and second in got)
        out["title → hop 2"].append(second in got2)
    return out


def bm25_over(corpus: Path, workdir: Path):
    """A BM25 retriever over ``corpus``, its index built in ``workdir``."""
    docs = read_corpus(corpus)
    build_bm25(docs, workdir)
    return BM25Retriever(workdir, docs, index_id=f"bm25:{corpus}")


def retrievability(splits: list[str], ks: tuple[int, ...] = (3, 5)) -> Shares:
    """split → template (and ``all``) → measure → k → share of its questions."""
    result: Shares = {}
    retrievers: dict[Path, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for split in splits:
            examples = load_examples("demo", split)
            corpus = corpus_path("demo", split)
            if corpus not in retrievers:
                retrievers[corpus] = bm25_over(corpus, Path(tmp) / str(len(retrievers)))
            titles = {doc.id: doc.title for doc in iter_corpus(corpus)}
            groups: dict[str, list[int]] = defaultdict(list)
            for i, e in enumerate(examples):
                groups[template_of(e)].append(i)
            groups["all"] = list(range(len(examples)))
            table: dict[str, dict[str, dict[int, float]]] = {g: {m: {} for m in MEASURES} for g in groups}
            for k in ks:
                hits = hop_hits(examples, retrievers[corpus], titles, k)
                for g, rows in groups.items():
                    for m in MEASURES:
                        table[g][m][k] = sum(hits[m][i] for i in rows) / len(rows)
            result[split] = table
    return result


def markdown(result: Shares, ks: tuple[int, ...] = (3, 5)) -> str:
    """One table per split: a row per template, a column per measure and k (percent)."""
    head = " | ".join(f"{m} @{k}" for m in MEASURES for k in ks)
    lines = []
    for split, table in result.items():
        lines += [f"### {split}", "", f"| template | {head} |", "|---|" + "---|" * (len(MEASURES) * len(ks))]
        for g in [*sorted(t for t in table if t != "all"), "all"]:
            cells = " | ".join(f"{100 * table[g][m][k]:.0f}" for m in MEASURES for k in ks)
            lines.append(f"| {g} | {cells} |")
        lines.append("")
    return "\n".join(lines)
