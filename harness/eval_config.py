"""The typed configuration of ``harness eval`` (composed from ``-c`` files, flags and overrides).

Every field can be set in YAML or with ``key.path=value`` on the command line, e.g.
``agent.max_turns=2 backend.max_batch_size=4 retriever.topk=5``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.backends.dtype import DTYPES
from harness.config import require_at_least, require_positive
from harness.engines import EngineConfig

DEFAULT_MODEL = "smollm2-135m-instruct"
# A name that becomes part of a run directory's name (a label, a split): no path separator, no
# leading dot, so a run never lands outside --out (``--split ../../x``) or hidden.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@=-]*")


def check_run_name(value: str | None, key: str) -> None:
    """Refuse a ``key`` value that could not name part of a run directory (see :data:`_NAME`)."""
    if value is not None and not _NAME.fullmatch(value):
        raise ValueError(f"{key} {value!r}: use letters, digits and _ . + @ = - (it names a run directory)")


@dataclass(frozen=True)
class DatasetConfig:
    name: str = "demo"
    split: str | None = None
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    data_dir: str | None = None

    def __post_init__(self) -> None:
        require_at_least(self, 1, "limit", "sample")
        check_run_name(self.split, "split")


@dataclass(frozen=True)
class BackendConfig:
    kind: Literal["hf", "sglang", "openai", "scripted"] = "hf"
    model: str = DEFAULT_MODEL
    url: list[str] = field(default_factory=list)
    max_concurrency: int = 16
    timeout: float = 120.0
    retries: int = 3
    max_batch_size: int = 8  # hf: rows per forward; sglang: requests per batched /generate
    # sglang: requests that become ready within this many ms go out as one batched /generate
    # (SGLang takes lists of input_ids); 0 (the default) sends each request on its own: the
    # batched form is tested against a stand-in only, not yet against a real SGLang server.
    batch_window_ms: float = 0.0
    threads: int | None = None
    # hf: the generation dtype (harness.backends.dtype): float32, bfloat16, float16, or auto
    # (bf16 on a CPU with AMX-BF16 or AVX512-BF16, where hf loads its weights, else fp32). A
    # training's rollout backend generates in the policy's dtype unless this asks for a lower one.
    dtype: str = "float32"
    # hf: tokens of KV kept for reuse by requests that start with tokens already run (the next
    # turn of a trajectory, the other samples of a GRPO group); least recently used out first,
    # 0 turns reuse off. 16k tokens hold 16 concurrent agent trajectories of 1k tokens; for
    # SmolLM2-135M in float32 (30 layers x 2 x 3 KV heads x 64 x 4 bytes = 46 KB a token)
    # that is 0.75 GB at most (docs/performance.md).
    prefix_cache_tokens: int = 16384
    script: str | None = None  # scripted backend: JSONL script file
    # Start the engine for this backend (sglang → SGLang, openai → vLLM) serving ``model``, use
    # it, and stop it when the run ends or fails; ``url`` is then ignored.
    launch: bool = False
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"backend.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        require_at_least(self, 1, "max_concurrency", "max_batch_size", "threads")
        require_at_least(self, 0, "retries", "batch_window_ms", "prefix_cache_tokens")
        require_positive(self, "timeout")


@dataclass(frozen=True)
class RetrieverConfig:
    kind: Literal["bm25", "dense", "harr", "http", "memory"] = "bm25"
    index: str | None = None  # a built index directory
    corpus: str | None = None  # build (and cache) an index over this corpus when no index is given
    model: str | None = None  # dense encoder
    # dense/harr: a trained query encoder (retriever RL's RUN/encoder, or a LoRA adapter dir) over
    # the index's fixed document vectors; harr also renders the history-aware state it trained on.
    encoder: str | None = None
    url: str | None = None  # http retriever
    api: Literal["search_r1", "flashrag", "r1_searcher"] = "search_r1"
    timeout: float = 30.0  # http: seconds per attempt
    retries: int = 3  # http: extra attempts after a connection error, timeout or 5xx
    topk: int = 3
    faiss_gpu: bool | None = None  # dense: put the FAISS index on the GPU(s) (None: when faiss sees one)
    faiss_shard: bool = True  # with several GPUs, shard the index across them (else replicate)

    def __post_init__(self) -> None:
        require_at_least(self, 1, "topk")
        require_at_least(self, 0, "retries")
        require_positive(self, "timeout")


@dataclass(frozen=True)
class EvalConfig:
    method: str = "research"
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    # Options of the agent loop (pipelines.search_agent.AgentConfig) and of the baselines
    # (pipelines.baselines.flashrag_methods.BaselineConfig); validated by the method builder.
    agent: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    metrics: list[str] = field(default_factory=lambda: ["em", "f1", "acc", "cover_em"])
    # The paper whose metric set ``metrics`` is (benchmarks.profiles), recorded for reports.
    metric_profile: str = "default"
    # The LLM judge of the ``judge`` metric (benchmarks.judge.JudgeConfig options: url, model,
    # api_key_env, prompt, temperature, max_tokens, ...); validated when the run is built.
    judge: dict[str, Any] = field(default_factory=dict)
    # Trajectories per question (``--n-samples K``; RFT samples K and keeps the good ones). Sample
    # j of every question decodes with seed ``agent.seed + j``, so a rerun (and a resumed run)
    # reproduces each (question, sample). K > 1 needs sampling: ``agent.temperature > 0``.
    # ``results.json`` means every metric over all K samples of every question (mean@K); reports
    # average each question's samples first (the bootstrap resamples questions, not samples).
    n_samples: int = 1
    out: str = "runs"
    # How reports, tables and the run directory name this run (default: the method). Names a
    # variant the method alone does not tell apart, e.g. ``research+sft`` for the research agent
    # on a fine-tuned checkpoint: the run dir is ``<label>-<dataset>-<split>`` and the manifest's
    # ``method`` is the label, while ``config.method`` keeps the method that was run.
    label: str | None = None
    # After this many items in a row failed for an infrastructure reason (retriever or backend
    # down), pause, check the servers' health, and stop the run (exit 1) when they are still
    # down, instead of failing every remaining item after its retries. 0: never stop.
    stop_after_failures: int = 5
    # How the items are scheduled (``--schedule``; ``pipelines.method.SCHEDULES``): ``async``, each
    # question at its own pace; ``sync``, waves of the concurrency with a barrier between turns (the
    # turn-synchronous baseline; agent methods only). It changes the order of work, not the result.
    schedule: Literal["async", "sync"] = "async"

    def __post_init__(self) -> None:
        require_at_least(self, 1, "n_samples")
        require_at_least(self, 0, "stop_after_failures")
        check_run_name(self.label, "label")

    @property
    def name(self) -> str:
        """The run's name in reports: the label, else the method."""
        return self.label or self.method
