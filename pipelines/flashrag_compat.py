"""Glue between harness parts and FlashRAG's pipeline API.

- :func:`safe_config` builds a FlashRAG ``Config`` without its side effects: no
  ``CUDA_VISIBLE_DEVICES`` change, no global RNG seeding, no output folder, no tiktoken-based
  metric (REFERENCE §5). The environment and RNG states are restored afterwards.
- :class:`FlashRAGGenerator` gives any harness backend FlashRAG's generator interface
  (``generate(list[str], **kw) -> list[str]``), keeping the matched stop string in the text.
- :class:`FlashRAGRetriever` adapts a harness retriever to FlashRAG's ``search``/``batch_search``
  and records every call (queries, documents, scores, latency) for the item that made it.
- :func:`pipeline_base` is FlashRAG's ``BasicPipeline``, the base class of the search agent.
- :func:`to_flashrag_dataset` / :func:`from_flashrag_dataset` convert examples.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import os
import random
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from harness.backends.base import SamplingParams, run_sync
from harness.retrieval.base import Retriever
from harness.types import Example, SearchRecord

# Metrics FlashRAG may compute without network access (its default list has input_tokens,
# which downloads a tiktoken file).
SAFE_METRICS = ["em", "f1", "acc"]


@contextlib.contextmanager
def _no_global_side_effects():
    """Restore os.environ and the global RNG states after FlashRAG code runs."""
    # deferred: torch costs ~1.4 s at import
    import torch

    env = dict(os.environ)
    py_state = random.getstate()
    np_state = np.random.get_state()
    torch_state = torch.random.get_rng_state()
    try:
        yield
    finally:
        for k in set(os.environ) - set(env):
            del os.environ[k]
        for k, v in env.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)


def safe_config(**overrides: Any) -> Any:
    """A FlashRAG ``Config`` with its side effects switched off (see module docstring)."""
    with _no_global_side_effects():
        # deferred: flashrag imports torch and its own stack (seconds)
        from flashrag.config import Config

        base = {
            "gpu_id": None,  # None: Config leaves CUDA_VISIBLE_DEVICES alone
            "disable_save": True,  # no timestamped output folder
            "save_dir": os.devnull,
            "save_metric_score": False,
            "save_intermediate_data": False,
            "metrics": list(SAFE_METRICS),
            "framework": "hf",
            "generator_model": "harness",
            "retrieval_method": "harness",
            "save_retrieval_cache": False,
            "use_retrieval_cache": False,
            "refiner_name": None,
            "use_fid": False,
        }
        base.update(overrides)
        with contextlib.redirect_stdout(io.StringIO()):  # Config prints notes ("Index is empty!!")
            return Config(config_dict=base)


def to_flashrag_dataset(examples: Sequence[Example], config: Any = None) -> Any:
    # deferred: flashrag imports torch and its own stack (seconds)
    from flashrag.dataset import Dataset

    data = [
        {"id": e.id, "question": e.question, "golden_answers": list(e.answers), "metadata": e.metadata}
        for e in examples
    ]
    if not data:
        raise ValueError("no examples to run")
    with contextlib.redirect_stdout(io.StringIO()):  # Dataset() prints a line on construction
        return Dataset(config=config, data=data)


def from_flashrag_dataset(dataset: Any) -> list[Example]:
    return [
        Example(
            id=str(item.id),
            question=item.question,
            answers=tuple(item.golden_answers),
            metadata=dict(getattr(item, "metadata", {}) or {}),
        )
        for item in dataset
    ]


# FlashRAG passes generation options under several names (HF, vLLM and OpenAI spellings).
_MAX_TOKEN_KEYS = ("max_new_tokens", "max_tokens", "max_length")


class FlashRAGGenerator:
    """A harness backend behind FlashRAG's generator interface: prompts (strings) in, texts out.

    ``params`` are this method's own defaults (a baseline's ``max_new_tokens``, FLARE's
    logprobs); FlashRAG's keyword arguments override them per call. The shared backend is never
    mutated. Texts keep the matched stop string at their end (FlashRAG's reasoning pipelines rely
    on it). ``tokenizer`` and ``model_path`` are the backend's (FLARE and FlashRAG's prompt
    templates read them).

    When ``loop`` is set (a method running items on worker threads while its event loop runs),
    requests are submitted to that loop, so the backend sees every item's requests together and
    batches them; otherwise each call runs its own loop.
    """

    def __init__(self, backend: Any, params: SamplingParams | None = None) -> None:
        self.backend = backend
        self.params = params or SamplingParams(max_new_tokens=64)
        self.tokenizer = backend.tokenizer
        self.model_path = getattr(backend, "model_path", None)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._local = threading.local()

    @contextlib.contextmanager
    def using(self, sampling: SamplingParams | None) -> Iterator[None]:
        """On this thread, sample with ``sampling``'s temperature, top-p/k, seed and logprobs
        (an RL rollout's) while the method keeps its own token limit. ``None``: the defaults."""
        previous = getattr(self._local, "params", None)
        if sampling is not None:
            p = self.params
            self._local.params = p.with_(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                seed=sampling.seed,
                logprobs=p.logprobs or sampling.logprobs,
            )
        try:
            yield
        finally:
            self._local.params = previous

    def sampling(self, kw: dict[str, Any]) -> SamplingParams:
        """The sampling parameters of one call: the defaults, overridden by FlashRAG's keywords."""
        params = getattr(self._local, "params", None) or self.params
        for key in _MAX_TOKEN_KEYS:
            if kw.get(key) is not None:
                params = params.with_(max_new_tokens=int(kw[key]))
                break
        stop = kw.get("stop")
        if stop:
            params = params.with_(stop=tuple([stop] if isinstance(stop, str) else stop))
        if kw.get("temperature") is not None:
            params = params.with_(temperature=float(kw["temperature"]))
        if kw.get("do_sample") is False:
            params = params.with_(temperature=0.0)
        if kw.get("top_p") is not None:
            params = params.with_(top_p=float(kw["top_p"]))
        if kw.get("return_scores") or kw.get("logprobs"):
            params = params.with_(logprobs=True)
        return params

    def generate(self, input_list: Sequence[str] | str, return_scores: bool = False, **kw: Any) -> Any:
        """FlashRAG's generator call; with ``return_scores=True`` also per-token probabilities."""
        if isinstance(input_list, str):
            input_list = [input_list]
        params = self.sampling({**kw, "return_scores": return_scores})
        ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in input_list]
        completions = self._run(self.backend.agenerate_many(ids, params))
        texts = [c.text for c in completions]
        if return_scores:
            return texts, [[math.exp(lp) for lp in (c.logprobs or [])] for c in completions]
        return texts

    def _run(self, coro: Any) -> Any:
        loop = self.loop
        if loop is not None and loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:  # a worker thread: hand the requests to the method's loop
                return asyncio.run_coroutine_threadsafe(coro, loop).result()
        return run_sync(coro)


class FlashRAGChatPrompt:
    """FlashRAG's prompt-template interface (``get_string``) for a pipeline's ``user_prompt`` in the
    model's chat template, as FlashRAG's ``PromptTemplate`` renders it for chat models (without
    reading a FlashRAG model config)."""

    def __init__(self, tokenizer: Any, user_prompt: str) -> None:
        self.tokenizer, self.user_prompt = tokenizer, user_prompt

    def get_string(self, question: str, **_: Any) -> str:
        messages = [{"role": "user", "content": self.user_prompt.format(question=question)}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class FlashRAGRetriever:
    """A harness :class:`Retriever` with FlashRAG's retriever interface.

    FlashRAG pipelines call ``search(query, num=None, return_score=False)`` and
    ``batch_search(queries, num=None, return_score=False)`` and read ``contents`` (title on the
    first line) from each result dict. Inside :meth:`recording` (one item on one thread), every
    call is recorded as :class:`~harness.types.SearchRecord` s, so a baseline's trajectory shows
    the searches it really made; ``turn`` counts the item's retrieval calls.
    """

    def __init__(self, retriever: Retriever, topk: int) -> None:
        self.retriever = retriever
        self.topk = topk
        self._local = threading.local()

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[SearchRecord]]:
        """Record this thread's calls into the yielded list until the block ends."""
        calls: list[SearchRecord] = []
        self._local.calls, self._local.turn = calls, 0
        try:
            yield calls
        finally:
            self._local.calls = None

    @staticmethod
    def _as_dict(doc: Any) -> dict[str, Any]:
        return {"id": doc.id, "title": doc.title, "text": doc.text, "contents": doc.contents, "score": doc.score}

    def batch_search(self, query: list[str] | str, num: int | None = None, return_score: bool = False, **_: Any):
        if isinstance(query, str):
            return self.search(query, num=num, return_score=return_score)
        t0 = time.perf_counter()
        results = self.retriever.search(list(query), num or self.topk)
        latency = time.perf_counter() - t0
        self._record(list(query), results, latency)
        dicts = [[self._as_dict(d) for d in docs] for docs in results]
        if return_score:
            return dicts, [[d.score for d in docs] for docs in results]
        return dicts

    def _record(self, queries: list[str], results: list[list[Any]], latency: float) -> None:
        calls = getattr(self._local, "calls", None)
        if calls is None or not queries:
            return
        turn = self._local.turn
        self._local.turn += 1
        for q, docs in zip(queries, results, strict=True):
            calls.append(SearchRecord.from_docs(turn, q, docs, latency / len(queries)))

    def search(self, query: str, num: int | None = None, return_score: bool = False, **_: Any):
        out = self.batch_search([query], num=num, return_score=return_score)
        if return_score:
            return out[0][0], out[1][0]
        return out[0]


def pipeline_base() -> type:
    """FlashRAG's ``BasicPipeline`` (imported here, the one place that knows where it lives)."""
    # deferred: flashrag imports torch and its own stack (seconds)
    from flashrag.pipeline import BasicPipeline

    return BasicPipeline
