"""Protocol-following SFT trajectories without a teacher (``harness data synthesize``).

For each question the gold decomposition gives the hops (:func:`gold_hops`): MuSiQue's
``question_decomposition`` (sub-questions, ``#k`` filled with earlier sub-answers, and the
supporting paragraph), Bamboogle's ``Q1/A1, Q2/A2``, HotpotQA's supporting-fact titles, 2Wiki's
``evidences`` triples, the demo's ``supporting_doc_ids``. Each hop is a REAL search through the
configured retriever; the turns are written in the dialect's own tags and parsed back with the
dialect's own ``parse_action`` (the query searched is the one the agent would search), the
observation is the dialect's ``observation_text`` of what came back. A trajectory is kept only
when every hop's search surfaced its gold paragraph (or, without one, its gold answer), and the
whole response passes the dialect's format check and yields the gold answer.

Records are JSON lines read by :func:`training.sft.sft_data.load_synth`: the dialect and question
(the prompt is rendered at training time with the policy's tokenizer) and the turns as
``{role: model | observation, text}``.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.build import dataset_retriever
from benchmarks.datasets import corpus_path, load_examples
from harness.eval_config import RetrieverConfig
from harness.models import load_tokenizer
from harness.retrieval.corpus import iter_corpus
from harness.types import Doc, Example
from pipelines.dialects import Dialect, resolve_dialect, synth_turns
from pipelines.search_agent import cap_doc

logger = logging.getLogger(__name__)


class NoDecomposition(ValueError):
    """The example's metadata holds no gold decomposition this module can follow."""


@dataclass(frozen=True)
class Hop:
    """One search of the gold path: the query, and what counts as surfacing its gold."""

    query: str
    gold_ids: frozenset[str] = frozenset()
    gold_titles: frozenset[str] = frozenset()
    answer: str | None = None  # the hop's own answer when the dataset gives one


@dataclass
class SynthStats:
    total: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason → count

    def summary(self) -> str:
        why = ", ".join(f"{k}: {v}" for k, v in self.dropped.most_common())
        return f"kept {self.kept} of {self.total}" + (f" (dropped: {why})" if why else "")


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())


def _maybe_json(v: Any) -> Any:
    if isinstance(v, str) and v[:1] in "[{":
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return ast.literal_eval(v)  # literals only (the metadata was written with repr)
    return v


def gold_hops(example: Example, titles: dict[str, str] | None = None) -> list[Hop]:
    """The hops of ``example``'s gold decomposition (see the module docstring).
    ``titles``: corpus id → title, for datasets whose gold is a list of document ids."""
    m = example.metadata or {}
    if "question_decomposition" in m:  # MuSiQue
        paras = {p.get("idx"): p for p in _maybe_json(m.get("paragraphs", []))}
        hops, answers = [], []
        for step in _maybe_json(m["question_decomposition"]):
            q = step["question"]
            for k, a in enumerate(answers, 1):
                q = q.replace(f"#{k}", a)
            para = paras.get(step.get("paragraph_support_idx"))
            title = frozenset({para["title"]}) if para else frozenset()
            hops.append(Hop(q.strip(), gold_titles=title, answer=step.get("answer")))
            answers.append(step.get("answer", ""))
        return hops
    if "Q1" in m:  # Bamboogle
        hops, k = [], 1
        while f"Q{k}" in m:
            a = _maybe_json(m.get(f"A{k}"))
            a = a[0] if isinstance(a, list) and a else a
            hops.append(Hop(str(m[f"Q{k}"]), answer=str(a) if a else None))
            k += 1
        return hops
    if "supporting_facts" in m:  # HotpotQA: one search per supporting title, in order
        seen: list[str] = []
        for fact in _maybe_json(m["supporting_facts"]):
            t = fact[0] if isinstance(fact, list | tuple) else fact
            if t not in seen:
                seen.append(t)
        return [Hop(t, gold_titles=frozenset({t})) for t in seen]
    if "evidences" in m:  # 2WikiMultihopQA: (subject, relation, object) triples
        return [Hop(f"{s} {r}".replace("_", " "), answer=str(o)) for s, r, o in _maybe_json(m["evidences"])]
    if "supporting_doc_ids" in m:  # the demo: the documents, in hop order
        titles = titles or {}
        missing = [i for i in m["supporting_doc_ids"] if i not in titles]
        if missing:
            raise NoDecomposition(f"{example.id}: supporting documents {missing} are not in the corpus")
        return [
            Hop(titles[i], gold_ids=frozenset({i}), gold_titles=frozenset({titles[i]})) for i in m["supporting_doc_ids"]
        ]
    raise NoDecomposition(
        f"{example.id}: no gold decomposition in metadata (have: {', '.join(sorted(m)) or 'nothing'}); "
        "need question_decomposition, Q1/A1, supporting_facts, evidences or supporting_doc_ids"
    )


def surfaced(hop: Hop, docs: list[Doc]) -> Doc | None:
    """The retrieved document that is the hop's gold: its id, its title, or (without either)
    one containing the hop's answer."""
    for d in docs:
        if d.id in hop.gold_ids or (hop.gold_titles and _norm(d.title) in {_norm(t) for t in hop.gold_titles}):
            return d
    if not hop.gold_ids and not hop.gold_titles and hop.answer:
        a = _norm(hop.answer)
        for d in docs:
            if a and a in _norm(d.contents):
                return d
    return None


# ---- rendering --------------------------------------------------------------------------------
def _first_sentence(doc: Doc) -> str:
    text = doc.text.strip()
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return (m.group(1) if m else text)[:200]


def _answer_block(d: Dialect, answer: str) -> str:
    inner = f"\\boxed{{{answer}}}" if d.boxed_answer else answer
    return f"{d.answer_open} {inner} {d.answer_close}"


def search_turn(d: Dialect, hop: Hop, i: int, prev: str | None) -> str:
    """The model turn that searches ``hop``, written as the dialect's system writes one
    (:attr:`pipelines.dialects.System.turns`)."""
    lead = f"I need to find: {hop.query}" if prev is None else f"I found that {prev}. Next I need: {hop.query}"
    return synth_turns(d.name).search(d, lead, f"{d.query_open} {hop.query} {d.query_close}")


def final_turn(d: Dialect, answer: str, prev: str | None) -> str:
    """The answering model turn, written as the dialect's system writes one."""
    lead = (f"I found that {prev}. " if prev else "") + f"So the answer is {answer}."
    return synth_turns(d.name).final(d, lead, _answer_block(d, answer))


@dataclass
class Synthesizer:
    """Builds one trajectory per example through ``retriever`` in ``dialect``'s protocol."""

    dialect: Dialect
    retriever: Any
    topk: int = 3
    tokenizer: Any = None  # caps documents as the agent does (None: uncapped)
    max_doc_tokens: int = 128
    titles: dict[str, str] = field(default_factory=dict)
    stats: SynthStats = field(default_factory=SynthStats)

    def _drop(self, why: str) -> None:
        self.stats.dropped[why] += 1

    def one(self, ex: Example) -> dict[str, Any] | None:
        """The record for ``ex``, or None (the reason is counted in ``stats``)."""
        self.stats.total += 1
        d = self.dialect
        try:
            hops = gold_hops(ex, self.titles)
        except NoDecomposition:
            self._drop("no gold decomposition")
            return None
        if not hops or not ex.answers:
            self._drop("no gold decomposition")
            return None
        turns: list[dict[str, str]] = []
        searches: list[dict[str, Any]] = []
        prev: str | None = None
        for i, hop in enumerate(hops):
            text = search_turn(d, hop, i, prev)
            action = d.parse_action(text, eos=False)
            # A turn must end where the agent's turn would: on a stop string, or (a dialect without
            # stop strings: tool_call) on the model's end of turn.
            stopped = not d.stops(True) or any(text.endswith(s) for s in d.stops(True))
            if action.kind != "search" or not action.queries or not stopped:
                self._drop("dialect does not parse the search turn")
                return None
            results = self.retriever.search(list(action.queries), self.topk)
            capped = (
                results
                if self.tokenizer is None
                else [[cap_doc(self.tokenizer, doc, self.max_doc_tokens) for doc in docs] for docs in results]
            )
            hit = next((h for docs in capped if (h := surfaced(hop, docs)) is not None), None)
            searches.append(
                {"query": list(action.queries), "doc_ids": [x.id for x in capped[0]], "gold": hit.id if hit else None}
            )
            if hit is None:
                self._drop("retrieval missed the gold")
                return None
            turns.append({"role": "model", "text": text})
            turns.append({"role": "observation", "text": d.observation_text(action.queries, capped)})
            fact = hop.answer or _first_sentence(hit)
            sub_answer = synth_turns(d.name).sub_answer
            if sub_answer is not None:  # ProRAG: (step subquery retrieval step subanswer) per hop
                sub = sub_answer(d, fact)
                if d.parse_action(sub, eos=False).kind != "continue":
                    self._drop("dialect does not parse the sub-answer turn")
                    return None
                turns += [{"role": "model", "text": sub}, {"role": "observation", "text": d.continue_text or ""}]
            prev = fact.rstrip(".")
        answer = ex.answers[0]
        final = final_turn(d, answer, prev)
        action = d.parse_action(final, eos=True)
        turns.append({"role": "model", "text": final})
        response = "".join(t["text"] for t in turns)
        got = action.answer if action.kind == "answer" and action.answer else d.extract_answer(response)
        ok, why = d.validate_format(response)
        if action.kind != "answer" or got is None or _norm(got) != _norm(answer) or not ok:
            self._drop(f"dialect check failed ({why if not ok else 'answer'})")
            return None
        self.stats.kept += 1
        return {
            "id": ex.id,
            "question": ex.question,
            "answers": list(ex.answers),
            "dialect": d.name,
            "chat": True,
            "few_shot": False,
            "turns": turns,
            "searches": searches,
            **({"chat_template": d.chat_template} if d.chat_template else {}),  # tool_call's template file
        }


def corpus_titles(path: str | Path | None) -> dict[str, str]:
    """id → title of a FlashRAG corpus (first line of ``contents``)."""
    if path is None:
        return {}
    return {doc.id: doc.title for doc in iter_corpus(path)}


def synthesize(
    examples: list[Example],
    dialect: Dialect,
    retriever: Any,
    out: str | Path,
    topk: int = 3,
    tokenizer: Any = None,
    max_doc_tokens: int = 128,
    titles: dict[str, str] | None = None,
) -> SynthStats:
    """Write one record per kept example to ``out`` (JSONL); returns the counts."""
    s = Synthesizer(dialect, retriever, topk, tokenizer, max_doc_tokens, titles or {})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for ex in examples:
            rec = s.one(ex)
            if rec is not None:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    logger.info("synthesize %s: %s", dialect.name, s.stats.summary())
    return s.stats


def synthesize_split(
    dataset: str,
    dialect: str,
    out: str | Path,
    split: str | None = None,
    variant: str = "exact",
    limit: int | None = None,
    offset: int = 0,
    data_dir: str | None = None,
    retriever: Any = None,
    tokenizer: str | None = None,
    max_doc_tokens: int = 128,
    chat_template: str | None = None,
) -> tuple[str, SynthStats]:
    """``harness data synthesize``: :func:`synthesize` over a registered dataset's split (questions
    ``offset`` to ``offset + limit``), searched through ``retriever`` (a
    :class:`~harness.eval_config.RetrieverConfig`, default BM25 over the split's corpus); documents
    are capped to ``max_doc_tokens`` of ``tokenizer``'s model as the agent caps them;
    ``chat_template`` (a chat-template dialect's file) is named in each record for SFT. Returns
    the dialect's name and what was kept."""
    rcfg = retriever or RetrieverConfig()
    d = resolve_dialect(dialect, variant)
    d = d.with_chat_template(chat_template) if chat_template else d
    examples = load_examples(dataset, split, data_dir=data_dir)[offset:]
    examples = examples[:limit] if limit is not None else examples
    ret = dataset_retriever(rcfg, dataset, split, data_dir)
    needs_titles = any("supporting_doc_ids" in (e.metadata or {}) for e in examples)
    titles = corpus_titles(corpus_path(dataset, split, data_dir)) if needs_titles else {}
    tok = None
    if tokenizer:
        tok = load_tokenizer(tokenizer)
    return d.name, synthesize(examples, d, ret, out, rcfg.topk, tok, max_doc_tokens, titles)
