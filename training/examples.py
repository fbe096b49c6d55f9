"""A recipe's training questions and the dataset whose corpus they search (every trainer kind)."""

from __future__ import annotations

from benchmarks.datasets import load_examples, load_merged_examples, read_examples
from harness.types import Example
from training.config import TrainConfig


def train_examples(cfg: TrainConfig) -> list[Example]:
    """The training questions: ``data.file``, else ``data.dataset``'s split (several datasets
    merged), at most ``data.limit`` (of each dataset)."""
    d = cfg.data
    if d.file:
        return read_examples(d.file)[: d.limit] if d.limit else read_examples(d.file)
    if isinstance(d.dataset, str):
        return load_examples(d.dataset, d.split, data_dir=d.data_dir, limit=d.limit)
    return load_merged_examples(d.dataset, d.split, data_dir=d.data_dir, limit=d.limit)


def first_dataset(cfg: TrainConfig) -> str:
    """The dataset named first in ``data.dataset`` (validation runs on it)."""
    d = cfg.data.dataset
    return d if isinstance(d, str) else d[0]


def merged_corpus_dataset(cfg: TrainConfig) -> str:
    """The dataset whose corpus the retriever uses. A merged training set has no single dataset
    corpus: it needs a shared one (an http retriever, or ``retriever.corpus`` / ``index``)."""
    d, r = cfg.data.dataset, cfg.retriever
    if isinstance(d, str) or len(d) == 1:
        return first_dataset(cfg)
    if r.kind in ("http", "memory") or r.corpus or r.index:
        return d[0]
    raise ValueError(
        f"data.dataset={list(d)} merges datasets with different local corpora: give the retriever a "
        "shared corpus (retriever.kind=http, or retriever.corpus / retriever.index)"
    )
