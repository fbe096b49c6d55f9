"""Shared types: what flows between datasets, retrievers, backends, pipelines, training and reports.

Everything here is plain data. ``to_dict``/``from_dict`` give the JSON forms written to run
directories; ``TRAJECTORY_SCHEMA_VERSION`` is bumped whenever a field changes meaning.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

TRAJECTORY_SCHEMA_VERSION = 1

Role = Literal["prompt", "model", "observation"]
# "paused": the loop stopped between steps on request (SearchAgent.arun's max_steps; MCTS resumes it).
FinishReason = Literal["answer", "eos_without_answer", "max_turns", "max_tokens", "context_overflow", "error", "paused"]
FINISH_REASONS: tuple[str, ...] = (
    "answer",
    "eos_without_answer",
    "max_turns",
    "max_tokens",
    "context_overflow",
    "error",
    "paused",
)


@dataclass(frozen=True)
class Example:
    """One benchmark question. ``answers`` are the gold answers (FlashRAG's ``golden_answers``)."""

    id: str
    question: str
    answers: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.answers),
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class Doc:
    """A retrieved passage. ``score`` is the retriever's own score (higher is better)."""

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        """FlashRAG corpus form: title on the first line, text after it."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    @classmethod
    def from_contents(cls, id: str, contents: str, score: float = 0.0) -> Doc:
        """Split FlashRAG's ``contents`` at its first newline. The title is kept as written, quotes
        included: wiki-18's titles are quoted (``"Paris"``) and Search-R1's and FlashRAG's prompts
        show them so, so ``contents`` round-trips exactly."""
        title, sep, text = contents.partition("\n")
        if not sep:
            return cls(id=str(id), title="", text=title, score=score)
        return cls(id=str(id), title=title.rstrip("\r"), text=text, score=score)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Segment:
    """A run of token ids with one loss-mask role.

    ``prompt`` and ``observation`` segments get loss mask 0; ``model`` segments get 1.
    ``logprobs`` (one per token) is set for model segments when the backend reports them.
    ``text`` is the decoded form, for people; the ids are the truth.
    """

    role: Role
    token_ids: list[int]
    text: str = ""
    logprobs: list[float] | None = None
    # The policy version (optimizer steps) whose weights wrote a model segment, as the backend
    # reported it; None where unknown. An asynchronous RL run mixes versions within a trajectory.
    version: int | None = None

    @property
    def loss_mask(self) -> list[int]:
        return [1 if self.role == "model" else 0] * len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        d = {"role": self.role, "token_ids": self.token_ids, "text": self.text, "logprobs": self.logprobs}
        if self.version is not None:  # written only where known: evaluation records stay as they were
            d["version"] = self.version
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        return cls(
            role=d["role"],
            token_ids=list(d["token_ids"]),
            text=d.get("text", ""),
            logprobs=d.get("logprobs"),
            version=d.get("version"),
        )


@dataclass
class SearchRecord:
    """One retrieval call made by the agent (or a baseline)."""

    turn: int
    query: str
    doc_ids: list[str]
    scores: list[float]
    latency_s: float
    docs: list[Doc] = field(default_factory=list)
    error: str | None = None
    # A stochastic retriever's sampling record (state text, candidate ids, sampled ids, log-prob):
    # see harness.retrieval.stochastic. None for deterministic retrievers and older runs.
    sample: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: it would deep-copy docs
        d["doc_ids"], d["scores"], d["sample"] = list(self.doc_ids), list(self.scores), copy.deepcopy(self.sample)
        d["docs"] = [doc.to_dict() for doc in self.docs]
        return d

    @classmethod
    def from_docs(
        cls, turn: int, query: str, docs: list[Doc], latency_s: float, sample: dict[str, Any] | None = None
    ) -> SearchRecord:
        """The record of one query that returned ``docs`` (their ids and scores, as floats)."""
        return cls(
            turn=turn,
            query=query,
            doc_ids=[doc.id for doc in docs],
            scores=[float(doc.score) for doc in docs],
            latency_s=latency_s,
            docs=list(docs),
            sample=sample,
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchRecord:
        return cls(
            turn=d["turn"],
            query=d["query"],
            doc_ids=list(d["doc_ids"]),
            scores=list(d["scores"]),
            latency_s=d["latency_s"],
            docs=[Doc(**x) for x in d.get("docs", [])],
            error=d.get("error"),
            sample=d.get("sample"),
        )


@dataclass
class Trajectory:
    """Everything one pipeline did for one example: the record evaluation, training and reports share."""

    example_id: str
    question: str
    answers: list[str]
    method: str
    segments: list[Segment] = field(default_factory=list)
    searches: list[SearchRecord] = field(default_factory=list)
    prediction: str = ""
    response_text: str = ""
    finish_reason: FinishReason = "error"
    n_turns: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    observation_tokens: int = 0
    wall_time_s: float = 0.0
    generation_time_s: float = 0.0
    retrieval_time_s: float = 0.0
    error: str | None = None
    error_kind: str | None = None  # harness.errors.error_kind of ``error``: retrieval / backend / timeout / other
    policy_version: int = 0
    sample_index: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    schema_version: int = TRAJECTORY_SCHEMA_VERSION

    @property
    def token_ids(self) -> list[int]:
        """All ids in order: exactly what the model was fed (plus its last generation)."""
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [m for s in self.segments for m in s.loss_mask]

    def to_dict(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict: asdict deep-copies every segment and search only
        # for them to be replaced below (40% of an evaluation's CPU outside the engine, profiled).
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["answers"] = list(self.answers)
        d["metadata"] = copy.deepcopy(self.metadata)
        d["segments"] = [s.to_dict() for s in self.segments]
        d["searches"] = [s.to_dict() for s in self.searches]
        return d

    @classmethod
    def of(cls, example: Example, method: str, **fields: Any) -> Trajectory:
        """A trajectory of ``example`` (its id, question and gold answers) by ``method``; ``fields``
        set the rest (``sample_index``, ``policy_version``, ``metadata``, ...)."""
        return cls(
            example_id=example.id, question=example.question, answers=list(example.answers), method=method, **fields
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        version = d.get("schema_version", TRAJECTORY_SCHEMA_VERSION)
        if version > TRAJECTORY_SCHEMA_VERSION:
            raise ValueError(
                f"trajectory schema version {version} is newer than this harness supports "
                f"({TRAJECTORY_SCHEMA_VERSION}); upgrade harness"
            )
        d["segments"] = [Segment.from_dict(s) for s in d.get("segments", [])]
        d["searches"] = [SearchRecord.from_dict(s) for s in d.get("searches", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})
