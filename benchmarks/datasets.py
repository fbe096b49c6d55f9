"""Benchmark datasets: a registry, loaders with strict errors, and where each split comes from.

Sources, in order:

1. ``data_dir`` (``--data-dir``) or ``$HARNESS_DATA_DIR``, in FlashRAG's layout
   ``DIR/<dataset>/<split>.jsonl``;
2. otherwise FlashRAG's published datasets on the Hugging Face hub
   (``RUC-NLPIR/FlashRAG_datasets``), downloaded once into the hub cache. Offline, this fails
   fast with one message saying how to supply the data.

``demo`` is shipped inside the package (``benchmarks/demo_data``, one ``<split>.jsonl`` each):
``test`` (the evaluated split), ``val`` (a training run's validation curve) and ``train``, over
one world whose splits share no supporting passage and no answer; and the demo as first shipped,
``test_v1`` and ``train_v1``, searched over its own smaller corpus so that its figures reproduce
(see ``benchmarks/demo_data/build_demo.py``).

Question files hold one JSON object a line: ``{"id", "question", "golden_answers", "metadata"}``.
A missing ``id`` becomes the 0-based line index; a string ``golden_answers`` becomes a list.
``limit`` takes the first N; ``sample`` takes a deterministic random subset (``seed``), kept in
file order; given both, the sample is drawn first and then cut to ``limit``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from huggingface_hub import hf_hub_download

from benchmarks.metrics import normalize_answer
from harness.hub import hub_problem
from harness.registry import Registry
from harness.textfiles import read_jsonl
from harness.types import Example

logger = logging.getLogger(__name__)

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"


class DatasetError(ValueError):
    """A dataset cannot be loaded; the message names the file (and line) or says what to do."""


@dataclass(frozen=True)
class DatasetSpec:
    """One benchmark: its splits (first = default eval split) and where its files live."""

    name: str
    splits: tuple[str, ...]
    description: str
    hub_name: str | None = None  # folder in the hub repo; None: not on the hub
    folder: str | None = None  # folder under a data dir (default: name)
    local_splits: tuple[str, ...] = ()  # extra splits found only in local data dirs
    corpora: dict[str, str] = field(default_factory=dict)  # split -> corpus file in the folder

    @property
    def default_split(self) -> str:
        return self.splits[0]

    @property
    def all_splits(self) -> tuple[str, ...]:
        return self.splits + tuple(s for s in self.local_splits if s not in self.splits)


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def _register(spec: DatasetSpec) -> None:
    DATASETS.register(spec.name, spec)


_register(
    DatasetSpec(
        "hotpotqa",
        ("dev", "train"),
        "HotpotQA multi-hop QA",
        hub_name="hotpotqa",
        local_splits=("dev_distractor1352", "train100"),
        corpora={"dev_distractor1352": "corpus_distractor1352.jsonl", "train100": "corpus_train100.jsonl"},
    )
)
_register(
    DatasetSpec(
        "2wikimultihopqa",
        ("dev", "train"),
        "2WikiMultiHopQA",
        hub_name="2wikimultihopqa",
        corpora={"dev": "corpus_6119.jsonl"},
    )
)
_register(
    DatasetSpec(
        "musique",
        ("dev", "train"),
        "MuSiQue (answerable)",
        hub_name="musique",
        local_splits=("train100",),
        corpora={"train100": "corpus_train100.jsonl"},
    )
)
_register(DatasetSpec("bamboogle", ("test",), "Bamboogle (two-hop, web-style)", hub_name="bamboogle"))
_register(DatasetSpec("nq", ("test", "dev", "train"), "Natural Questions", hub_name="nq"))
_register(DatasetSpec("triviaqa", ("test", "dev", "train"), "TriviaQA", hub_name="triviaqa"))
_register(DatasetSpec("popqa", ("test",), "PopQA", hub_name="popqa"))
_register(
    DatasetSpec(
        "r1searcher_subsets",
        ("hotpotqa_500", "2wiki_500", "musique_500", "bamboogle"),
        "R1-Searcher's fixed 500-question dev subsets (report cover-EM on these)",
        folder="r1searcher_eval_subsets",
    )
)
_register(
    DatasetSpec(
        "r1searcher_train",
        ("stage_1", "stage_2"),
        "R1-Searcher's RL training sets as published (data/training_set/stage_{1,2}.jsonl: idx, question, answer)",
        folder="r1searcher_training_set",
    )
)
_register(
    DatasetSpec(
        "demo",
        ("test", "val", "train", "test_v1", "train_v1"),
        "Shipped two-hop demo over a fictional world (val, train: disjoint questions for validation and "
        "training; test_v1, train_v1: the demo as first shipped)",
        corpora={"test_v1": "corpus_v1.jsonl", "train_v1": "corpus_v1.jsonl"},
    )
)
DEMO_CORPUS = "corpus.jsonl"  # the demo's corpus for a split its spec maps to no other


def get_spec(name: str) -> DatasetSpec:
    return DATASETS.get(name)


def demo_path(filename: str) -> Path:
    return Path(str(resources.files("benchmarks") / "demo_data" / filename))


def resolve_data_dir(data_dir: str | Path | None) -> Path | None:
    d = data_dir or os.environ.get("HARNESS_DATA_DIR")
    return Path(d) if d else None


def local_path(spec: DatasetSpec, split: str, data_dir: str | Path | None) -> Path | None:
    if spec.name == "demo":
        return demo_path(f"{split}.jsonl") if split in spec.splits else None
    d = resolve_data_dir(data_dir)
    return d / (spec.folder or spec.name) / f"{split}.jsonl" if d else None


def _check_split(spec: DatasetSpec, split: str, data_dir: str | Path | None) -> None:
    if split in spec.all_splits:
        return
    path = local_path(spec, split, data_dir)
    if path is not None and path.exists():  # a split the registry does not list, present locally
        return
    raise DatasetError(f"dataset {spec.name!r} has no split {split!r} (known: {', '.join(spec.all_splits)})")


def hub_download(spec: DatasetSpec, split: str) -> Path:
    """Fetch ``<name>/<split>.jsonl`` from FlashRAG's hub dataset; fail fast and clearly offline."""
    how = (
        f"supply it locally: --data-dir DIR (or HARNESS_DATA_DIR=DIR) with DIR/{spec.folder or spec.name}/{split}.jsonl"
    )
    if spec.hub_name is None:
        raise DatasetError(f"dataset {spec.name!r} split {split!r} is not on the hub; {how}")

    kwargs = {"repo_id": HUB_REPO, "repo_type": "dataset", "filename": f"{spec.hub_name}/{split}.jsonl"}
    try:  # a copy downloaded earlier needs no network
        return Path(hf_hub_download(**kwargs, local_files_only=True))
    except Exception:
        pass
    problem = hub_problem()  # one quick check, shared with harness.hub's index downloads
    if problem is None:
        try:
            return Path(hf_hub_download(**kwargs))
        except Exception as e:  # unknown file, HTTP error: one clear message
            problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    raise DatasetError(f"could not download {spec.name}/{split}.jsonl from the hub ({HUB_REPO}): {problem}; {how}")


def dataset_file(name: str, split: str | None = None, data_dir: str | Path | None = None) -> Path:
    """The question file for (name, split): local when present, else downloaded."""
    spec = get_spec(name)
    split = split or spec.default_split
    _check_split(spec, split, data_dir)
    path = local_path(spec, split, data_dir)
    if path is not None and path.exists():
        return path
    if path is not None and resolve_data_dir(data_dir) is not None:
        logger.info("%s not found locally; trying the hub", path)
    return hub_download(spec, split)


def read_examples(path: str | Path) -> list[Example]:
    """Parse a FlashRAG question file strictly; errors name the file and line. R1-Searcher's
    published training layout (``idx``, ``question``, ``answer``) reads as ``id``/``golden_answers``.

    ``golden_answers`` must be a non-empty list of strings (or numbers, kept as text); an empty
    list, ``null`` or a nested list is an error. Gold answers that SQuAD-normalise to the empty
    string (HotpotQA dev has two: "The The" and "!!!") are kept as they are and scored as FlashRAG
    scores them (an empty or all-article prediction then matches them under EM), but the loader
    logs a warning with their count and ids, so such items are known rather than silent.
    """
    path = Path(path)
    examples: list[Example] = []
    seen: dict[str, int] = {}
    if not path.is_file():
        raise DatasetError(f"{path}: cannot read (no such file)")
    try:
        for lineno, record in read_jsonl(path, DatasetError):
            d = _check_record(record, f"{path}:{lineno}")
            ex_id = str(d["id"]) if d.get("id") is not None else str(lineno - 1)
            if ex_id in seen:
                raise DatasetError(f"{path}:{lineno}: duplicate id {ex_id!r} (first on line {seen[ex_id]})")
            seen[ex_id] = lineno
            meta = d.get("metadata") or {}
            golds = tuple(str(g) for g in d["golden_answers"])
            examples.append(Example(ex_id, d["question"], golds, meta if isinstance(meta, dict) else {}))
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror})") from None
    if not examples:
        raise DatasetError(f"{path}: no questions (empty file)")
    _warn_empty_golds(path, examples)
    return examples


# Longer than any model's context (128k tokens are about 500k characters of English; QA questions
# run to a few hundred): such a line is a broken file, refused at load, not after a tokenizer has
# spent a minute and gigabytes on it to end the item as context_overflow.
MAX_QUESTION_CHARS = 500_000


def _check_record(d: dict, where: str) -> dict:
    """One question record, checked; ``golden_answers`` is returned as a list."""
    q = d.get("question")
    if not isinstance(q, str) or not q.strip():
        raise DatasetError(f"{where}: missing or empty 'question'")
    if len(q) > MAX_QUESTION_CHARS:
        raise DatasetError(
            f"{where}: the question is {len(q):,} characters long, more than any model's context holds (at most "
            f"{MAX_QUESTION_CHARS:,}); is the file broken? Fix or remove that line"
        )
    golds = d.get("golden_answers")
    if golds is None and "answer" in d:  # R1-Searcher's training sets: {"idx", "question", "answer"}
        golds = d["answer"]
        if d.get("id") is None and d.get("idx") is not None:
            d["id"] = d["idx"]
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, list) or not golds:
        got = "an empty list" if golds == [] else "missing" if golds is None else type(golds).__name__
        raise DatasetError(f"{where}: 'golden_answers' must be a non-empty list of strings, got {got}")
    for k, g in enumerate(golds):
        if isinstance(g, bool) or not isinstance(g, str | int | float):
            raise DatasetError(f"{where}: 'golden_answers'[{k}] must be a string, got {json.dumps(g)}")
    d["golden_answers"] = golds
    return d


def _warn_empty_golds(path: Path, examples: list[Example]) -> list[str]:
    """Ids of the items with a gold answer that normalises to ""; logged as a warning when any."""
    ids = [e.id for e in examples if any(not normalize_answer(g) for g in e.answers)]
    if ids:
        shown = ", ".join(ids[:10]) + (f", ... ({len(ids) - 10} more)" if len(ids) > 10 else "")
        logger.warning(
            "%s: %d item(s) have a gold answer that normalises to the empty string (%s); they are scored as "
            "FlashRAG scores them (an empty or all-article prediction matches under EM)",
            path,
            len(ids),
            shown,
        )
    return ids


def examples_hash(examples: list[Example]) -> str:
    """The data hash of a question set (a run manifest's ``data_hash``): its ids, questions and
    gold answers, in order."""
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.id, e.question, list(e.answers)], ensure_ascii=False).encode())
    return h.hexdigest()[:16]


def select(examples: list[Example], limit: int | None = None, sample: int | None = None, seed: int = 0):
    """Deterministic subset: ``sample`` (random, file order kept), then ``limit`` (first N)."""
    if sample is not None:
        if sample < 0:
            raise DatasetError(f"--sample must be >= 0, got {sample}")
        if sample < len(examples):
            keep = sorted(random.Random(seed).sample(range(len(examples)), sample))
            examples = [examples[i] for i in keep]
    if limit is not None:
        if limit < 0:
            raise DatasetError(f"--limit must be >= 0, got {limit}")
        examples = examples[:limit]
    return examples


def load_examples(
    name: str,
    split: str | None = None,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[Example]:
    """Load (and select from) a registered dataset split."""
    return select(read_examples(dataset_file(name, split, data_dir)), limit=limit, sample=sample, seed=seed)


def load_merged_examples(
    names: list[str] | tuple[str, ...],
    split: str | None = None,
    data_dir: str | Path | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Several datasets' split as one training set (Search-R1 trains on NQ + HotpotQA train).

    ``limit`` applies to each dataset. Ids become ``"<dataset>/<id>"`` (ids repeat across
    datasets) and ``metadata["dataset"]`` names the source."""
    if not names:
        raise ValueError("data.dataset: an empty list of datasets")
    out: list[Example] = []
    for name in names:
        for ex in load_examples(name, split, data_dir=data_dir, limit=limit):
            out.append(replace(ex, id=f"{name}/{ex.id}", metadata={**ex.metadata, "dataset": name}))
    return out


def corpus_path(
    name: str, split: str | None = None, data_dir: str | Path | None = None, warn: bool = True
) -> Path | None:
    """The retrieval corpus that goes with a dataset split, when one is known locally.

    A split's registered corpus is used when present; otherwise the folder's only
    ``corpus*.jsonl`` is a fallback, with a warning that names it (it may belong to another
    split: pass ``retriever.corpus=FILE`` or ``--index`` to choose explicitly).
    """
    spec = get_spec(name)
    if spec.name == "demo":
        return demo_path(spec.corpora.get(split or spec.default_split, DEMO_CORPUS))
    d = resolve_data_dir(data_dir)
    if d is None:
        return None
    folder = d / (spec.folder or spec.name)
    split = split or spec.default_split
    if split in spec.corpora and (folder / spec.corpora[split]).exists():
        return folder / spec.corpora[split]
    found = sorted(folder.glob("corpus*.jsonl")) if folder.is_dir() else []
    if len(found) != 1:
        return None
    if warn:
        logger.warning(
            "%s split %r has no registered corpus: falling back to %s, the only corpus in %s "
            "(choose one with retriever.corpus=FILE or --index)",
            spec.name,
            split,
            found[0].name,
            folder,
        )
    return found[0]


def describe_sources(data_dir: str | Path | None = None) -> list[dict[str, str]]:
    """For ``harness datasets``: every (dataset, split), where it would be read from, its corpus.

    A split that only exists locally reads ``local: --data-dir DIR with DIR/<folder>/<split>.jsonl``
    when no data folder is given (it was never looked for), ``not found: PATH`` when one is."""
    rows = []
    d = resolve_data_dir(data_dir)
    for name in DATASETS.names():
        spec = get_spec(name)
        for split in spec.all_splits:
            local = local_path(spec, split, data_dir)
            if spec.name == "demo":
                source = f"packaged ({_count_lines(demo_path(f'{split}.jsonl'))} questions, "
                source += f"{_count_lines(corpus_path(name, split))} passages)"
            elif local is not None and local.exists():
                source = str(local)
            elif spec.hub_name and split in spec.splits:
                source = f"hub: {HUB_REPO}/{spec.hub_name}/{split}.jsonl"
            elif d is None:
                source = f"local: --data-dir DIR with DIR/{spec.folder or spec.name}/{split}.jsonl"
            else:
                source = f"not found: {local}"
            corpus = corpus_path(name, split, data_dir, warn=False)
            rows.append({"dataset": name, "split": split, "source": source, "corpus": str(corpus) if corpus else "-"})
    return rows


def data_dir_hint(data_dir: str | Path | None = None) -> str | None:
    """What ``harness datasets`` says under its table when no data folder is given (None when one is)."""
    if resolve_data_dir(data_dir) is not None:
        return None
    return (
        "No data folder given (--data-dir DIR or HARNESS_DATA_DIR=DIR): the splits marked 'local' are read from "
        "DIR/<dataset>/<split>.jsonl, FlashRAG's layout (the folder of its FlashRAG_datasets download); the demo "
        "is packaged and the 'hub' splits download on first use"
    )


def _count_lines(path: Path) -> int:
    """Records in a JSONL file (non-blank lines): counted, so a description never goes stale."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())
