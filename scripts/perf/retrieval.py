"""Retrieval quality and speed on real data (a benchmark script, not a test).

Builds BM25 and/or dense indexes over HotpotQA's ``corpus_distractor1352.jsonl`` (13,283
paragraphs) and asks the questions of ``dev_distractor1352.jsonl``. Prints, per index kind:

- build time (dense: with the corpus encoding rate) and index size on disk;
- load time and first-query time (numba compiles BM25's kernels on first use in a process);
- queries/s one query per call and in batches;
- answer recall@1/5/10: a gold answer, SQuAD-normalised, occurs as whole words in one of the
  top-k paragraphs. Yes/no questions are left out (the word "no" occurs everywhere);
- supporting-paragraph recall@5, for questions with ``supporting_facts``: the share of the
  gold paragraphs (those of ``metadata.context_doc_ids`` whose title is a supporting-fact title)
  found in the top 5, and the share of questions with every gold paragraph in the top 5.

    .venv/bin/python scripts/perf/retrieval.py [--kind bm25|dense|all] [--limit N] [--model NAME]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.answerability import contains
from benchmarks.metrics import normalize_answer
from harness.retrieval.corpus import iter_corpus
from harness.retrieval.index import build_index, load_index
from harness.textfiles import read_jsonl
from harness.types import Doc

KS = (1, 5, 10)


def read_questions(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [r for _, r in read_jsonl(path)]
    return rows[:limit] if limit else rows


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def supporting_ids(q: dict[str, Any], titles_by_id: dict[str, str]) -> set[str]:
    """Gold paragraph ids: the question's context paragraphs whose title is a supporting fact."""
    sf = q["metadata"].get("supporting_facts")
    if not sf:
        return set()
    titles = set(sf["title"]) if isinstance(sf, dict) else {t for t, _ in sf}
    return {d for d in q["metadata"].get("context_doc_ids", []) if titles_by_id.get(d) in titles}


def answer_hit(docs: list[Doc], golds: list[str]) -> bool:
    """A gold answer as whole words of a passage (the rule of ``harness index check``)."""
    texts = [normalize_answer(d.contents) for d in docs]
    return any(contains(t, g) for g in golds for t in texts)


def quality(questions: list[dict[str, Any]], results: list[list[Doc]], titles_by_id: dict[str, str]) -> dict:
    n_ans, hits = 0, dict.fromkeys(KS, 0)
    n_sp, sp_frac, sp_all = 0, 0.0, 0
    for q, docs in zip(questions, results, strict=True):
        golds = [normalize_answer(a) for a in q["golden_answers"]]
        golds = [g for g in golds if g]
        if golds and not set(golds) <= {"yes", "no"}:
            n_ans += 1
            for k in KS:
                hits[k] += answer_hit(docs[:k], golds)
        gold_ids = supporting_ids(q, titles_by_id)
        if gold_ids:
            found = gold_ids & {d.id for d in docs[:5]}
            n_sp += 1
            sp_frac += len(found) / len(gold_ids)
            sp_all += found == gold_ids
    out = {f"answer_recall@{k}": hits[k] / max(n_ans, 1) for k in KS}
    out.update(answer_questions=n_ans, sp_recall_at_5=sp_frac / max(n_sp, 1), sp_all_at_5=sp_all / max(n_sp, 1))
    out["sp_questions"] = n_sp
    return out


def speed(retriever: Any, queries: list[str], batch_size: int, k: int) -> tuple[float, float, list[list[Doc]]]:
    """Queries/s one at a time and in batches; returns the batched results for scoring."""
    t0 = time.perf_counter()
    for q in queries:
        retriever.search([q], k)
    single = len(queries) / (time.perf_counter() - t0)
    results: list[list[Doc]] = []
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch_size):
        results.extend(retriever.search(queries[i : i + batch_size], k))
    batched = len(queries) / (time.perf_counter() - t0)
    return single, batched, results


def run_kind(kind: str, args: argparse.Namespace, questions: list[dict], titles_by_id: dict, tmp: Path) -> None:
    out = tmp / kind
    opts: dict[str, Any] = {"faiss_kind": args.faiss} if kind == "dense" else {}
    t0 = time.perf_counter()
    manifest = build_index(args.corpus, kind, out, model=args.model if kind == "dense" else None, **opts)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    retriever = load_index(out)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    retriever.search(["warm up query"], args.k)
    first_s = time.perf_counter() - t0
    queries = [q["question"] for q in questions]
    single, batched, results = speed(retriever, queries, args.batch_size, args.k)
    q = quality(questions, results, titles_by_id)

    label = kind if kind == "bm25" else f"dense ({manifest['model']}, {manifest['dim']}-d, faiss {args.faiss})"
    print(f"\n== {label}: {manifest['num_docs']} paragraphs, {len(questions)} questions")
    rate = f" ({manifest['num_docs'] / build_s:.0f} docs/s)" if kind == "dense" else ""
    print(f"build            {build_s:8.1f} s{rate}")
    print(f"size on disk     {dir_size(out) / 2**20:8.1f} MiB (index files + docs.jsonl copy)")
    print(f"load             {load_s:8.2f} s   first query {first_s:.2f} s")
    print(f"queries/s        {single:8.1f} single   {batched:.1f} batched (batch {args.batch_size}, k={args.k})")
    for k in KS:
        print(f"answer recall@{k:<2} {q[f'answer_recall@{k}']:8.3f}   (n={q['answer_questions']}, yes/no left out)")
    sp, sp_all, n_sp = q["sp_recall_at_5"], q["sp_all_at_5"], q["sp_questions"]
    print(f"sp recall@5      {sp:8.3f}   all gold in top 5: {sp_all:.3f} (n={n_sp})")


def main() -> None:
    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=str(here.parents[3] / "shared" / "data"))
    p.add_argument("--kind", choices=["bm25", "dense", "all"], default="all")
    p.add_argument("--limit", type=int, default=None, help="Number of questions (default: all 1,352).")
    p.add_argument("--model", default=None, help="Dense encoder (default all-MiniLM-L6-v2).")
    p.add_argument("--faiss", choices=["flat", "hnsw"], default="flat")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch threads for the encoder.")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each build step at DEBUG
    logging.getLogger("harness.retrieval.encoders").setLevel(logging.INFO)  # encoding progress
    if args.threads:
        # deferred: torch costs ~1.4 s at import
        import torch

        torch.set_num_threads(args.threads)

    data = Path(args.data_dir) / "hotpotqa"
    args.corpus = data / "corpus_distractor1352.jsonl"
    questions = read_questions(data / "dev_distractor1352.jsonl", args.limit)
    titles_by_id = {doc.id: doc.title for doc in iter_corpus(args.corpus)}
    kinds = ["bm25", "dense"] if args.kind == "all" else [args.kind]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            run_kind(kind, args, questions, titles_by_id, Path(tmp))


if __name__ == "__main__":
    main()
