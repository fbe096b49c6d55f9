"""How answerable each question is on the corpus an index searches (``harness index check``).

Two shares per question set, both upper bounds on what a reader over that index can score:

- **in corpus**: a gold answer (or alias) occurs anywhere in the corpus;
- **retrievable**: it occurs in the top-k passages the index returns for the question itself.

"Occurs" means: the answer, normalised as the EM metric normalises it
(:func:`benchmarks.metrics.normalize_answer`), is a run of whole tokens of the passage normalised
the same way (``" beatles "`` in ``" … by beatles in 1965 "``). Whole tokens, not substrings, so
the answer ``1`` is not found in ``1990``. Two kinds of question have no span to look for:

- a gold answer ``yes`` or ``no`` (HotpotQA's comparison questions): the word needs no passage,
  so these count as answerable in both shares (an upper bound stays an upper bound), and their
  number is reported;
- every gold answer normalises to nothing (HotpotQA dev has ``"The The"`` and ``"!!!"``): these
  count as not found, and their number is reported.

The corpus scan streams the corpus file once for every question set checked together, holding
only the normalised answers still unfound (memory flat in corpus size); ``workers`` processes
scan byte ranges of the file in parallel. Results go to ``answerability.json`` beside the index,
one entry per question set keyed by its data hash (:func:`benchmarks.datasets.examples_hash`,
the manifest's ``data_hash``), with a per-question record, so a run over any subset of the
checked questions (``--limit``, ``--sample``) can record its own shares
(:func:`known_answerability`).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.datasets import examples_hash, get_spec, load_examples
from benchmarks.fmt import pct
from benchmarks.metrics import normalize_answer
from harness.fsutil import write_json_atomic
from harness.retrieval.corpus import byte_ranges, iter_range
from harness.retrieval.index import corpus_file, load_index, read_manifest
from harness.types import Example

logger = logging.getLogger(__name__)

STORE = "answerability.json"
STORE_VERSION = 1
NOT_SPANS = frozenset({"yes", "no"})  # answers that are a verdict, not a passage's words
# Per-question kinds in the store: a span to look for, a yes/no verdict, no locatable answer.
SPAN, YES_NO, EMPTY = "s", "y", "e"


def answer_keys(answers: Iterable[str]) -> tuple[str, ...]:
    """The gold answers as the metric normalises them: non-empty, each once, in order."""
    return tuple(dict.fromkeys(k for a in answers if (k := normalize_answer(a))))


def question_kind(keys: Sequence[str]) -> str:
    """:data:`YES_NO` when a gold answer is yes/no, :data:`EMPTY` when none is left, else :data:`SPAN`."""
    if any(k in NOT_SPANS for k in keys):
        return YES_NO
    return SPAN if keys else EMPTY


def contains(normalised_text: str, key: str) -> bool:
    """Whether ``key`` (normalised) is a run of whole tokens of ``normalised_text``."""
    return f" {key} " in f" {normalised_text} "


class AnswerScanner:
    """Finds which of many normalised answers occur in a stream of passages.

    Per passage: normalise it (the metric's normaliser) and split it into tokens; intersect the
    tokens with the answers' first tokens (one C-level set operation; most passages stop here);
    then, at each token that begins an answer still unfound, a one-token answer is a set lookup,
    and a longer one is joined and looked up only when the next token is also that of some answer
    (so common first tokens such as "john" or "1" cost a lookup, not a join per answer). A found
    answer leaves the set. Memory: the answers, never the passages.
    """

    def __init__(self, keys: Iterable[str]) -> None:
        self.active: set[str] = set(keys)
        self.firsts: set[str] = set()
        self.multi: dict[str, dict[str, set[int]]] = {}  # first -> second token -> lengths
        for k in self.active:
            toks = k.split(" ")
            self.firsts.add(toks[0])
            if len(toks) > 1:
                self.multi.setdefault(toks[0], {}).setdefault(toks[1], set()).add(len(toks))
        self.found: set[str] = set()
        self.rows = 0

    def feed(self, contents: str) -> None:
        self.rows += 1
        if not self.active:
            return
        toks = normalize_answer(contents).split(" ")
        hits = self.firsts.intersection(toks)
        if not hits:
            return
        active, multi, found = self.active, self.multi, self.found
        last = len(toks) - 1
        for i, t in enumerate(toks):
            if t not in hits:
                continue
            if t in active:
                active.discard(t)
                found.add(t)
            nexts = multi.get(t)
            if nexts and i < last and (lengths := nexts.get(toks[i + 1])):
                for n in lengths:
                    run = " ".join(toks[i : i + n])
                    if run in active:
                        active.discard(run)
                        found.add(run)


def _scan_range(path: str, start: int, end: int, keys: list[str]) -> tuple[set[str], int]:
    """One worker's share of :func:`scan_corpus` (module level: it runs in another process)."""
    scanner = AnswerScanner(keys)
    for _, contents in iter_range(path, start, end):
        scanner.feed(contents)
    return scanner.found, scanner.rows


@dataclass
class ScanResult:
    """Which answers a corpus holds, how many rows were read, and how long it took."""

    found: set[str]
    rows: int
    seconds: float


def scan_corpus(path: str | Path, keys: Iterable[str], workers: int = 1) -> ScanResult:
    """Stream the corpus at ``path`` once and return the normalised answers among ``keys`` it
    contains. ``workers`` > 1 scans that many byte ranges in parallel processes."""
    keys = sorted(set(keys))
    t0 = time.perf_counter()
    if workers <= 1:
        scanner = AnswerScanner(keys)
        for _, contents in iter_range(path):
            scanner.feed(contents)
        return ScanResult(scanner.found, scanner.rows, time.perf_counter() - t0)

    found: set[str] = set()
    rows = 0
    # spawn: the parent may hold threads (torch, faiss) that a forked child must not inherit.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_scan_range, str(path), a, b, keys) for a, b in byte_ranges(path, workers)]
        for fut in futures:
            f, n = fut.result()
            found |= f
            rows += n
    return ScanResult(found, rows, time.perf_counter() - t0)


def first_hit_ranks(
    retriever: Any, examples: Sequence[Example], keys: Sequence[tuple[str, ...]], k: int, batch: int = 64
) -> list[int]:
    """Per question, the 1-based rank of the first of its top-``k`` passages that holds a gold
    answer (0: none does), searching with the question itself."""
    ranks = []
    for i in range(0, len(examples), batch):
        chunk = examples[i : i + batch]
        results = retriever.search([e.question for e in chunk], k)
        for docs, ks in zip(results, keys[i : i + batch], strict=True):
            rank = 0
            for r, d in enumerate(docs[:k], 1):
                text = normalize_answer(d.contents)
                if any(contains(text, key) for key in ks):
                    rank = r
                    break
            ranks.append(rank)
    return ranks


@dataclass
class Answerability:
    """The two shares of one question set on one index (fractions in 0..1) and their basis."""

    dataset: str
    split: str
    n: int
    in_corpus: float
    retrievable: float | None  # None: not known at this k (checked with a smaller k)
    topk: int
    yes_no: int  # counted as answerable in both shares
    unlocatable: int  # no gold answer left after normalisation: counted as not found
    data_hash: str  # of the checked question set (the entry's key)
    index_id: str
    index_kind: str = ""
    num_docs: int = 0
    # Ids of the questions whose answer is nowhere in the corpus (not in_corpus; yes/no answers
    # count as found): what abstention on unanswerable questions is scored over
    # (benchmarks.evaluate.behaviour).
    unanswerable: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(items: Sequence[Sequence[Any]], topk: int) -> tuple[float, float | None, int, int]:
    """(in-corpus share, retrievable share at ``topk``, yes/no count, unlocatable count) of
    per-question records ``[digest, in_corpus, rank, kind]``."""
    n = len(items) or 1
    yes_no = sum(1 for it in items if it[3] == YES_NO)
    empty = sum(1 for it in items if it[3] == EMPTY)
    in_corpus = sum(1 for it in items if it[3] == YES_NO or it[1]) / n
    retrievable = sum(1 for it in items if it[3] == YES_NO or 0 < it[2] <= topk) / n
    return in_corpus, retrievable, yes_no, empty


def not_in_corpus(ids: Sequence[str], items: Sequence[Sequence[Any]]) -> list[str]:
    """The ids whose per-question record ``[digest, in_corpus, rank, kind]`` has no answer in the
    corpus (a yes/no answer counts as found, as in :func:`summarize`)."""
    return [i for i, it in zip(ids, items, strict=True) if it[3] != YES_NO and not it[1]]


def _store_path(index_dir: str | Path) -> Path:
    return Path(index_dir) / STORE


def read_store(index_dir: str | Path, index_id: str | None = None) -> dict[str, Any]:
    """``answerability.json`` of an index (an empty store when there is none, or when it was
    written for another index: ``index_id`` given and different)."""
    p = _store_path(index_dir)
    empty = {"schema_version": STORE_VERSION, "index_id": index_id, "datasets": {}}
    if not p.is_file():
        return empty
    try:
        store = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: malformed answerability file ({e}); delete it and check again") from None
    if not isinstance(store, dict) or not isinstance(store.get("datasets"), dict):
        raise ValueError(f"{p}: not an answerability file (no 'datasets' object)")
    if store.get("schema_version", 1) > STORE_VERSION:
        raise ValueError(f"{p}: written by a newer harness (schema {store['schema_version']})")
    if index_id is not None and store.get("index_id") != index_id:
        logger.warning("%s was written for index %s, not %s: ignored", p, store.get("index_id"), index_id)
        return empty
    return store


@dataclass
class CheckReport:
    """What :func:`check_index` found: one :class:`Answerability` per question set, the scan's
    rows and time, and where the results were written."""

    results: list[Answerability]
    scan_rows: int
    scan_seconds: float
    retrieval_seconds: float
    path: Path


def check_index(
    index_dir: str | Path,
    datasets: Sequence[str],
    split: str | None = None,
    topk: int = 5,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    workers: int = 1,
    retriever: Any = None,
    examples: dict[str, list[Example]] | None = None,
    say: Callable[[str], None] = logger.info,
) -> CheckReport:
    """Check every question of each dataset's split (``split``, else the dataset's default)
    against the index at ``index_dir`` and record the results beside it (see the module
    docstring). The corpus is scanned once for all the datasets together.

    ``retriever``: the index already loaded (else loaded here); ``examples``: question sets
    already loaded, by dataset name (else read with :func:`benchmarks.datasets.load_examples`,
    first ``limit``). Raises ``ValueError`` (bad arguments, unknown dataset) or
    :class:`~harness.retrieval.index.IndexLoadError`.
    """
    if topk < 1:
        raise ValueError(f"--topk must be >= 1, got {topk}")
    if not datasets:
        raise ValueError("no dataset to check (--dataset NAME)")
    manifest = read_manifest(index_dir)
    sets: dict[str, tuple[str, list[Example]]] = {}
    for name in datasets:
        s = split or get_spec(name).default_split
        exs = (examples or {}).get(name) or load_examples(name, s, data_dir=data_dir, limit=limit)
        sets[name] = (s, exs)
    keys = {name: [answer_keys(e.answers) for e in exs] for name, (_, exs) in sets.items()}

    retriever = retriever or load_index(index_dir)
    t0 = time.perf_counter()
    ranks = {name: first_hit_ranks(retriever, sets[name][1], keys[name], topk) for name in sets}
    retrieval_seconds = time.perf_counter() - t0
    spans = {k for ks in keys.values() for q in ks if question_kind(q) == SPAN for k in q}
    corpus = corpus_file(index_dir)
    say(f"scanning {corpus} for {len(spans)} distinct answers ({workers} worker{'s' * (workers > 1)})")
    scan = scan_corpus(corpus, spans, workers)

    store = read_store(index_dir, manifest["index_id"])
    store.update(
        index_id=manifest["index_id"],
        kind=manifest["kind"],
        corpus_sha256=manifest["corpus_sha256"],
        num_docs=manifest["num_docs"],
    )
    results = []
    for name, (s, exs) in sets.items():
        items = {}
        for e, ks, rank in zip(exs, keys[name], ranks[name], strict=True):
            kind = question_kind(ks)
            found = kind == SPAN and any(k in scan.found for k in ks)
            items[e.id] = [examples_hash([e]), int(found), rank if kind == SPAN else 0, kind]
        in_corpus, retrievable, yes_no, empty = summarize(list(items.values()), topk)
        data_hash = examples_hash(exs)
        res = Answerability(
            name, s, len(exs), in_corpus, retrievable, topk, yes_no, empty, data_hash,
            manifest["index_id"], manifest["kind"], manifest["num_docs"],
            not_in_corpus(list(items), list(items.values())),
        )  # fmt: skip
        dropped = ("data_hash", "index_id", "index_kind", "num_docs", "unanswerable")  # the items hold them
        store["datasets"][data_hash] = {
            **{k: v for k, v in res.to_dict().items() if k not in dropped},
            "match": "normalize_answer (benchmarks.metrics), whole tokens; yes/no counted as found",
            "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "items": items,
        }
        results.append(res)
    store["scan"] = {"rows": scan.rows, "seconds": round(scan.seconds, 2), "workers": workers}
    path = _store_path(index_dir)
    write_json_atomic(path, store)
    return CheckReport(results, scan.rows, scan.seconds, retrieval_seconds, path)


def known_answerability(
    index_dir: str | Path | None, index_id: str | None, examples: Sequence[Example], topk: int | None
) -> Answerability | None:
    """The shares of ``examples`` on the index, when ``harness index check`` recorded every one
    of them (same id, question and answers) for this index; else None. The retrievable share is
    None when the check used a smaller k than ``topk``."""
    if index_dir is None or index_id is None or not examples or not _store_path(index_dir).is_file():
        return None
    try:
        store = read_store(index_dir, index_id)
    except ValueError as e:
        logger.warning("%s", e)
        return None
    data_hash = examples_hash(list(examples))
    entries = store["datasets"]
    # The entry of exactly these questions first, then any entry that holds them all.
    for key in sorted(entries, key=lambda k: k != data_hash):
        entry = entries[key]
        items = entry.get("items") or {}
        picked = [items.get(e.id) for e in examples]
        if any(it is None or it[0] != examples_hash([e]) for it, e in zip(picked, examples, strict=True)):
            continue
        k = topk or entry["topk"]
        in_corpus, retrievable, yes_no, empty = summarize(picked, k)
        return Answerability(
            entry["dataset"], entry["split"], len(examples), in_corpus,
            retrievable if k <= entry["topk"] else None, k, yes_no, empty, data_hash, index_id,
            store.get("kind", ""), int(store.get("num_docs", 0)), not_in_corpus([e.id for e in examples], picked),
        )  # fmt: skip
    return None


def retriever_index_dir(retriever: Any) -> Path | None:
    """The index directory behind a retriever (through the query cache), when it has one."""
    inner = getattr(retriever, "inner", retriever)
    d = getattr(inner, "index_dir", None)
    return Path(d) if d is not None else None


def answerability_line(a: Answerability | dict[str, Any]) -> str:
    """``of these questions, X% have their answer somewhere in the corpus, Y% in the top-k for
    the question`` (what replication cards print under the paper's numbers)."""
    d = a.to_dict() if isinstance(a, Answerability) else a
    top = "unknown" if d.get("retrievable") is None else f"{pct(d['retrievable'])}%"
    line = (
        f"of these {d['n']} questions, {pct(d['in_corpus'])}% have their answer somewhere in the corpus, "
        f"{top} in the top-{d['topk']} for the question"
    )
    notes = []
    if d.get("yes_no"):
        notes.append(f"{d['yes_no']} yes/no answers counted as found")
    if d.get("unlocatable"):
        notes.append(f"{d['unlocatable']} with no answer left after normalisation counted as missing")
    return line + (f" ({'; '.join(notes)})" if notes else "")


def beats_corpus(score: float | None, a: Answerability | dict[str, Any] | None) -> bool:
    """Whether a score (0..1) is above the in-corpus share: some answers cannot have come from
    the corpus, so the model answers those from memory."""
    if score is None or a is None:
        return False
    d = a.to_dict() if isinstance(a, Answerability) else a
    return score > d["in_corpus"] + 1e-9


def check_lines(report: CheckReport) -> list[str]:
    """What ``harness index check`` prints: both shares per question set, then the scan's cost."""
    out = []
    for a in report.results:
        extra = []
        if a.yes_no:
            extra.append(f"{a.yes_no} yes/no counted as found")
        if a.unlocatable:
            extra.append(f"{a.unlocatable} with no locatable answer")
        out.append(
            f"{a.dataset} {a.split} ({a.n} questions) on {a.index_kind} index {a.index_id} ({a.num_docs} passages): "
            f"in corpus {pct(a.in_corpus)}%, retrievable top-{a.topk} {pct(a.retrievable)}%"
            + (f" ({'; '.join(extra)})" if extra else "")
            + f"; data hash {a.data_hash}"
        )
    out.append(
        f"corpus scan: {report.scan_rows} passages in {report.scan_seconds:.1f} s; retrieval "
        f"{report.retrieval_seconds:.1f} s; written to {report.path}"
    )
    return out


def answerability_short(a: Answerability | dict[str, Any]) -> str:
    """``answerable: 97.0% in corpus, 61.2% top-5`` (what ``harness report`` shows beside EM)."""
    d = a.to_dict() if isinstance(a, Answerability) else a
    top = "–" if d.get("retrievable") is None else pct(d["retrievable"])
    return f"answerable: {pct(d['in_corpus'])}% in corpus, {top}% top-{d['topk']}"
