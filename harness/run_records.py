"""The typed records of a run directory: :class:`RunManifest`, :class:`ItemScore`, :class:`RunResults`.

Each record has one writer (``to_dict``, used only by :class:`~harness.runlog.RunDir`) and one
reader (``from_dict``), and carries ``schema_version``. Version 1 is the layout harness has
written since its first release; files written before the field existed have no
``schema_version`` and read as version 1. A file from a newer harness is refused with a message
that names both versions.

On disk an item score stays flat (``{"id", "sample_index", "em": ..., "f1": ..., "prediction",
...}``): metric values sit beside the bookkeeping fields, so any JSONL tool can read them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

RUN_SCHEMA_VERSION = 1


class RecordError(ValueError):
    """A run record cannot be read: a newer schema version, or a missing required field."""


def _version(d: dict[str, Any], kind: str, where: str) -> int:
    v = d.get("schema_version", 1)
    if not isinstance(v, int) or v < 1:
        raise RecordError(f"{where}: {kind} has an invalid schema_version {v!r}")
    if v > RUN_SCHEMA_VERSION:
        raise RecordError(
            f"{where}: {kind} schema version {v} was written by a newer harness; this one reads up to "
            f"version {RUN_SCHEMA_VERSION} (upgrade harness to read it)"
        )
    return v


def _require(d: dict[str, Any], keys: tuple[str, ...], kind: str, where: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise RecordError(f"{where}: {kind} lacks {', '.join(missing)}")


@dataclass
class RunManifest:
    """``manifest.json``: what was run, on what, with which code. Written once when a run starts.

    ``config`` is the resolved config that identifies the run (its hash decides whether a rerun
    resumes); ``execution`` holds the keys that only change how it runs (server URLs, concurrency,
    ``launch``), as they were when the run started; ``data_hash`` / ``index_id`` /
    ``corpus_hash`` identify the items and the search space; ``answerability`` says how many of
    the items that search space could answer (when known). Keys this version does not know
    are kept in ``extra`` and written back unchanged.
    """

    method: str
    dataset: str
    split: str
    config: dict[str, Any] = field(default_factory=dict)
    config_hash: str = ""
    execution: dict[str, Any] = field(default_factory=dict)  # how the run was first executed; not hashed
    method_kind: str = "agent"
    model: str | None = None
    backend: str | None = None
    retriever: str | None = None
    topk: int | None = None
    n_total: int = 0
    data_hash: str | None = None
    index_id: str | None = None
    corpus: str | None = None
    corpus_hash: str | None = None
    # The questions' in-corpus and retrievable shares on the run's index, when `harness index
    # check` recorded them (benchmarks.answerability.Answerability as a dict); None: unknown.
    answerability: dict[str, Any] | None = None
    # An agent's prompts went through the tokenizer's chat template (False: its base-model form,
    # asked for with agent.chat=false or forced by a tokenizer with no template); None: a baseline.
    chat_template: bool | None = None
    versions: dict[str, str] = field(default_factory=dict)
    git_revision: str | None = None
    started_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = RUN_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        return {**extra, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "manifest.json") -> RunManifest:
        version = _version(d, "manifest", where)
        _require(d, ("method", "dataset"), "manifest", where)
        known = {f.name for f in fields(cls)} - {"extra"}
        out = cls(**{k: v for k, v in d.items() if k in known})
        out.extra = {k: v for k, v in d.items() if k not in known}
        out.split = str(out.split or "")
        out.schema_version = version
        return out


@dataclass
class ItemScore:
    """One line of ``scores.jsonl``: the metrics of one (example, sample) and what explains them.

    ``error`` is set when the item failed (it then scores 0 on every metric); ``error_kind``
    says whether the failure was infrastructure (``retrieval``, ``backend``, ``timeout``:
    retried when the run is resumed) or something else.
    """

    id: str
    sample_index: int = 0
    metrics: dict[str, float | None] = field(default_factory=dict)
    prediction: str = ""
    finish_reason: str | None = None
    n_searches: int = 0
    generated_tokens: int = 0
    wall_time_s: float | None = None
    error: str | None = None
    error_kind: str | None = None
    schema_version: int = RUN_SCHEMA_VERSION

    @property
    def key(self) -> tuple[str, int]:
        return (self.id, self.sample_index)

    def metric(self, name: str) -> float | None:
        return self.metrics.get(name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        metrics = d.pop("metrics")
        return {"schema_version": d.pop("schema_version"), "id": d.pop("id"), **metrics, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "scores.jsonl") -> ItemScore:
        version = _version(d, "item score", where)
        _require(d, ("id",), "item score", where)
        known = {f.name for f in fields(cls)} - {"metrics"}
        out = cls(**{k: v for k, v in d.items() if k in known})
        out.id = str(out.id)
        out.metrics = {k: v for k, v in d.items() if k not in known}
        out.schema_version = version
        return out


#: What a run's results repeat from its manifest (same names), so that ``results.json`` says
#: what it measured.
RESULTS_FROM_MANIFEST = ("method", "dataset", "split", "model", "backend", "retriever", "topk")


@dataclass
class RunResults:
    """``results.json``: the aggregate of a run's scores (rewritten whenever the run ends).

    ``complete`` means every item of the selection was scored without an error; ``errors``
    counts failed items and ``error_kinds`` says what failed.
    """

    method: str | None = None
    dataset: str | None = None
    split: str | None = None
    model: str | None = None
    backend: str | None = None
    retriever: str | None = None
    topk: int | None = None
    n: int = 0
    n_total: int = 0
    complete: bool = False
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float | None] = field(default_factory=dict)
    # Items whose value of a metric is missing (None: e.g. a failed LLM-judge call), per metric;
    # the metric's mean is over the other items.
    missing: dict[str, int] = field(default_factory=dict)
    mean_searches: float | None = None
    mean_generated_tokens: float | None = None
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    finish_reasons: dict[str, int] = field(default_factory=dict)
    # Abstention and cost (benchmarks.evaluate.behaviour): abstention, tokens_per_correct,
    # searches_per_correct, and with `harness index check` data answerable_accuracy,
    # unanswerable_abstention, n_unanswerable; "correct" is correct_metric (the run's headline).
    # Empty in results written before these existed.
    correct_metric: str | None = None
    behaviour: dict[str, float | None] = field(default_factory=dict)
    schema_version: int = RUN_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "results.json") -> RunResults:
        version = _version(d, "results", where)
        known = {f.name for f in fields(cls)}
        out = cls(**{k: v for k, v in d.items() if k in known})
        out.schema_version = version
        return out
