"""FlashRAG's baseline pipelines on harness backends and retrievers.

``naive`` (no retrieval), ``standard`` (retrieve then read), ``iter_retgen``, ``ircot``, ``flare``
and ``self_ask`` run through FlashRAG's own pipeline classes; only the generator (any harness
backend, through :class:`~pipelines.flashrag_compat.FlashRAGGenerator`) and the retriever
(through :class:`~pipelines.flashrag_compat.FlashRAGRetriever`) are ours.

Each item runs as its own one-item FlashRAG dataset on a worker thread, up to ``max_concurrency``
items at once, while the method's event loop serves their generation requests: the backend
batches requests from every running item, a finished item is streamed to the run directory at
once, and an exception fails only its own item (recorded on it). Every retrieval call an item
makes is recorded on its trajectory (queries, documents, scores, latency). Token ids in baseline
trajectories are the tokenizer's encoding of the prompt/output texts (FlashRAG works on
strings), flagged with ``metadata["token_exact"] = False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from harness.backends.base import SamplingParams
from harness.config import require_at_least
from harness.errors import error_kind
from harness.retrieval.base import Retriever
from harness.types import Example, Segment, Trajectory
from pipelines.flashrag_compat import FlashRAGGenerator, FlashRAGRetriever, safe_config, to_flashrag_dataset
from pipelines.method import ItemRunner, Method

logger = logging.getLogger(__name__)

# The one list of baselines, and the ones that never search (``pipelines.methods`` registers
# both; ``needs_retriever`` is read from that registry).
BASELINES = ("naive", "standard", "iter_retgen", "ircot", "flare", "self_ask")
WITHOUT_RETRIEVAL = frozenset({"naive"})


@dataclass(frozen=True)
class BaselineConfig:
    """Options of the FlashRAG baselines (defaults follow FlashRAG's examples)."""

    topk: int = 3
    max_new_tokens: int = 32
    max_input_len: int = 2048
    max_concurrency: int = 8  # items running at once (each on a worker thread)
    iter_num: int = 3  # iter_retgen
    max_iter: int = 2  # ircot / self_ask
    flare_threshold: float = 0.2
    flare_look_ahead: int = 32
    flare_max_generation_length: int = 64

    def __post_init__(self) -> None:
        require_at_least(self, 1, "topk", "max_new_tokens", "max_input_len", "max_concurrency", "iter_num", "max_iter")


def _build(name: str, config: Any, generator: Any, retriever: FlashRAGRetriever, opts: BaselineConfig) -> Any:
    # deferred: flashrag imports torch and its own stack (seconds)
    from flashrag import pipeline as fp

    common = {"generator": generator, "retriever": retriever}
    if name in ("naive", "standard"):
        return fp.SequentialPipeline(config, **common)
    if name == "iter_retgen":
        return fp.IterativePipeline(config, iter_num=opts.iter_num, **common)
    if name == "ircot":
        return fp.IRCOTPipeline(config, max_iter=opts.max_iter, **common)
    if name == "flare":
        return fp.FLAREPipeline(
            config,
            threshold=opts.flare_threshold,
            look_ahead_steps=opts.flare_look_ahead,
            max_generation_length=opts.flare_max_generation_length,
            **common,
        )
    if name == "self_ask":
        return fp.SelfAskPipeline(config, max_iter=opts.max_iter, **common)
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")


class _NoRetriever:
    index_id = "none"

    def search(self, queries: list[str], k: int) -> list:
        raise RuntimeError("this method was built without a retriever")


class FlashRAGBaseline(Method):
    """One FlashRAG baseline as a harness method (``pipelines.methods.Method``)."""

    def __init__(
        self,
        name: str,
        backend: Any,
        retriever: Retriever | None,
        options: BaselineConfig | None = None,
    ) -> None:
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")
        if name not in WITHOUT_RETRIEVAL and retriever is None:
            raise ValueError(f"baseline {name!r} needs a retriever")
        model_path = getattr(backend, "model_path", None)
        if model_path is None:
            raise ValueError(
                f"backend {backend.name!r} has no local model directory; FlashRAG's prompt templates "
                "read the model config from one"
            )
        self.name = name
        self.method = name
        self.backend = backend
        self.options = options or BaselineConfig()
        # FlashRAG builds its own retriever when given None; naive never searches, so it gets one
        # that refuses to.
        self.retriever = FlashRAGRetriever(retriever or _NoRetriever(), self.options.topk)
        self.config = safe_config(
            generator_model_path=str(model_path),
            generator_max_input_len=self.options.max_input_len,
            retrieval_topk=self.options.topk,
            generation_params={"max_tokens": self.options.max_new_tokens},
        )
        self.generator = FlashRAGGenerator(
            backend, SamplingParams(max_new_tokens=self.options.max_new_tokens, logprobs=name == "flare")
        )
        self.pipeline = _build(name, self.config, self.generator, self.retriever, self.options)

    # ---- the method protocol -----------------------------------------------------------------
    @property
    def max_concurrency(self) -> int:
        return self.options.max_concurrency

    @contextlib.asynccontextmanager
    async def item_runner(self) -> AsyncIterator[ItemRunner]:
        # FlashRAG's pipelines are synchronous: each item runs on a thread of a pool that lives
        # as long as the run.
        with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix=f"baseline-{self.name}") as pool:

            async def one(ex: Example, j: int, sampling: SamplingParams | None, version: int) -> Trajectory:
                return await self._arun_on(pool, ex, j, sampling, version)

            yield one

    async def arun(
        self,
        example: Example,
        sample_index: int = 0,
        sampling: SamplingParams | None = None,
        policy_version: int = 0,
    ) -> Trajectory:
        """One item on a worker thread. Never raises: errors are recorded on the trajectory."""
        return await self._arun_on(None, example, sample_index, sampling, policy_version)

    async def _arun_on(
        self, pool: Any, ex: Example, j: int, sampling: SamplingParams | None, policy_version: int
    ) -> Trajectory:
        loop = asyncio.get_running_loop()
        self.generator.loop = loop  # the worker threads' requests come back to this loop
        return await loop.run_in_executor(pool, self._run_item, ex, j, sampling, policy_version)

    # ---- one item ------------------------------------------------------------------------------
    def _run_item(self, ex: Example, j: int, sampling: SamplingParams | None, policy_version: int) -> Trajectory:
        with contextlib.redirect_stdout(io.StringIO()):  # FlashRAG prints progress lines
            dataset = to_flashrag_dataset([ex], self.config)
        error, kind = None, None
        t0 = time.perf_counter()
        with self.retriever.recording() as searches, self.generator.using(sampling):
            try:
                if self.name == "naive":
                    self.pipeline.naive_run(dataset, do_eval=False)
                else:
                    self.pipeline.run(dataset, do_eval=False)
            except Exception as e:  # the item carries the error; the run goes on
                logger.warning("%s failed on item %s: %s: %s", self.name, ex.id, type(e).__name__, e)
                error, kind = f"{type(e).__name__}: {e}", error_kind(e)
        traj = self._trajectory(ex, dataset[0], error, time.perf_counter() - t0)
        traj.error_kind, traj.sample_index, traj.policy_version = kind, j, policy_version
        traj.searches = searches
        traj.retrieval_time_s = sum(s.latency_s for s in searches)
        return traj

    def _trajectory(self, ex: Example, item: Any, error: str | None, wall: float) -> Trajectory:
        output = dict(getattr(item, "output", {}) or {})
        pred = "" if error else str(output.get("pred", "") or "")
        traj = Trajectory(
            example_id=ex.id,
            question=ex.question,
            answers=list(ex.answers),
            method=self.name,
            prediction=pred.strip(),
            response_text=pred,
            finish_reason="error" if error else "answer",
            error=error,
            wall_time_s=wall,
            metadata={"token_exact": False, "baseline": "flashrag"},
        )
        tok = self.backend.tokenizer
        prompt = output.get("prompt")
        if isinstance(prompt, str):
            ids = tok.encode(prompt, add_special_tokens=False)
            traj.segments.append(Segment("prompt", ids, prompt))
            traj.prompt_tokens = len(ids)
        if pred:
            ids = tok.encode(pred, add_special_tokens=False)
            traj.segments.append(Segment("model", ids, pred))
            traj.generated_tokens = len(ids)
            traj.n_turns = 1
        return traj
