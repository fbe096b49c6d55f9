"""The generator backend protocol: token ids in, token ids out.

Every backend (``hf``, ``sglang``, ``openai``, ``scripted``) implements :meth:`Backend.agenerate`
for one request; callers run many requests concurrently and the backend batches what is in
flight. Each backend builds itself from a :class:`~harness.eval_config.BackendConfig`
(``from_config``) and, when it can serve a policy being trained, receives new weights through
``update_weights`` (:class:`WeightUpdate`). FlashRAG's string interface is an adapter in
``pipelines.flashrag_compat``, not part of the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from harness import safe_delete
from harness.backends.lockstep import Lockstep
from harness.errors import InfrastructureError
from harness.models import save_model_dir

logger = logging.getLogger(__name__)

FinishType = Literal["stop", "length", "abort"]


class BackendError(InfrastructureError):
    """A generation request failed for good (after any retries). Recorded on the item, not fatal."""

    kind = "backend"


@dataclass(frozen=True)
class SamplingParams:
    """What to generate. ``temperature == 0`` means greedy."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    logprobs: bool = False

    def with_(self, **kw: Any) -> SamplingParams:
        return replace(self, **kw)


@dataclass
class Completion:
    """One generation.

    ``token_ids`` are every token the model produced, the tokens of a matched stop string
    included, so appending them to the input gives exactly the model's context for a next turn.
    ``text`` is their decoding and therefore contains the matched stop string (never trimmed).
    ``finish_reason`` is ``stop`` (``matched_stop`` says which: a stop string, or a stop/EOS
    token id), ``length`` (hit ``max_new_tokens``) or ``abort`` (the server gave up).
    ``logprobs`` has one entry per token of ``token_ids`` when requested and known.
    """

    token_ids: list[int]
    text: str
    finish_reason: FinishType
    matched_stop: str | int | None = None
    logprobs: list[float] | None = None
    prompt_tokens: int = 0
    weight_version: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def stopped_on_string(self) -> bool:
        return self.finish_reason == "stop" and isinstance(self.matched_stop, str)

    @property
    def stopped_on_eos(self) -> bool:
        return self.finish_reason == "stop" and not isinstance(self.matched_stop, str)


@runtime_checkable
class Backend(Protocol):
    """What the agent loop needs from a generator."""

    name: str
    tokenizer: Any  # a Hugging Face tokenizer (PreTrainedTokenizerBase)
    max_context: int

    async def agenerate(self, input_ids: list[int], params: SamplingParams) -> Completion: ...

    def close(self) -> None: ...


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """Earliest occurrence (end index, stop string) of any stop string in ``text[start:]``."""
    best: tuple[int, str] | None = None
    for s in stops:
        if not s:
            continue
        i = text.find(s, start)
        if i >= 0 and (best is None or i + len(s) < best[0]):
            best = (i + len(s), s)
    return best


@dataclass(frozen=True)
class WeightUpdate:
    """New policy weights for a rollout backend (RL weight sync).

    ``weights``: the full state dict (or a safetensors file / directory for in-process loading).
    ``version``: the policy version (optimizer steps taken) the backend reports from now on.
    Engines that load from disk write the weights under ``scratch`` as a model directory, which
    needs ``model_config`` and ``tokenizer``.
    ``in_flight``: what happens to completions running when the update arrives: ``drain`` (they
    finish on the old weights first; new ones wait) or ``pause`` (they stop where they are and
    go on under the new weights, their KV recomputed by them from the input and the tokens
    generated so far: AReaL's interruptible generation, which resubmits an interrupted request
    with its output to a server whose cache the update flushed; each token's logprob is still the
    one of the weights that sampled it). Asynchronous RL asks for
    ``pause`` (``trainer.async.interrupt: continue``).
    """

    weights: Any
    version: int
    model_config: Any = None
    tokenizer: Any = None
    scratch: Path | None = None
    in_flight: Literal["drain", "pause"] = "drain"


def export_model_dir(update: WeightUpdate, engine: str, explicit_head: bool = False) -> Path:
    """The model directory a server loads ``update`` from: ``update.weights`` itself when it is a
    path, else the state dict saved as ``<scratch>/weights-v<version>`` (config and tokenizer beside it).

    ``explicit_head``: with tied embeddings, also write ``lm_head.weight`` (a copy of the
    embedding) instead of leaving it out as checkpoints usually do. vLLM 0.32's in-place reload
    keeps the head's previous tensor when the file has no head ("ParallelLMHead: Failed to load
    weights"), so the head would lag the embedding by one version."""
    if isinstance(update.weights, str | Path):
        return Path(update.weights)  # already a model directory the servers can read
    if update.scratch is None or update.model_config is None:
        raise ValueError(f"{engine} weight sync needs a scratch directory and the model config")
    weights = dict(update.weights)
    if explicit_head and getattr(update.model_config, "tie_word_embeddings", False):
        emb = weights.get("model.embed_tokens.weight")
        if emb is not None:
            weights["lm_head.weight"] = emb.detach().clone()  # own storage: safetensors refuses shared
    out = update.scratch / f"weights-v{update.version}"
    return save_model_dir(weights, out, update.tokenizer, update.model_config, keep_head=explicit_head)


def prune_exports(update: WeightUpdate, keep: Path) -> None:
    """Delete the older ``weights-v*`` copies under ``update.scratch``: the servers now serve ``keep``."""
    if update.scratch is None:
        return
    for old in update.scratch.glob("weights-v*"):
        if old != keep:
            safe_delete.remove(old, kind="model", why="pruning older weight exports")


class BackendBase:
    """Shared plumbing. Subclasses set ``name``, ``tokenizer``, ``max_context`` and implement
    ``agenerate`` and ``from_config``; trainable ones implement ``update_weights``."""

    name = "base"
    tokenizer: Any = None
    max_context: int = 2048

    # ---- the protocol -----------------------------------------------------------------------
    async def agenerate(self, input_ids: list[int], params: SamplingParams) -> Completion:
        raise NotImplementedError

    def close(self) -> None:
        """Release servers, threads or models. Safe to call twice."""

    async def agenerate_many(self, inputs: list[list[int]], params: SamplingParams) -> list[Completion]:
        return list(await asyncio.gather(*(self.agenerate(ids, params) for ids in inputs)))

    async def agenerate_n(self, input_ids: list[int], params: SamplingParams, n: int) -> list[Completion]:
        """``n`` samples of one prompt (a GRPO group); see :meth:`_sample_n`."""
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        return await self._sample_n(input_ids, params, n)

    async def _sample_n(self, input_ids: list[int], params: SamplingParams, n: int) -> list[Completion]:
        """Servers that take ``n`` in one request (SGLang, vLLM) override this so the prompt is
        prefilled once; here, ``n`` requests, with seeds ``seed, seed+1, ...`` when a seed is set
        so the samples differ."""
        seeded = [params if params.seed is None else params.with_(seed=params.seed + i) for i in range(n)]
        return list(await asyncio.gather(*(self.agenerate(input_ids, p) for p in seeded)))

    @contextlib.contextmanager
    def lockstep(self, clients: int, concurrency: int) -> Iterator[Lockstep]:
        """Run ``clients`` coroutines (at most ``concurrency`` at once) in lockstep, so the batches
        they share do not depend on timing (:mod:`harness.backends.lockstep`). Only the in-process
        backend can: a server batches its requests as it will, so here the block just runs."""
        yield Lockstep(clients, concurrency)

    # ---- building and weight sync ----------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: Any) -> BackendBase:
        """Build from a :class:`~harness.eval_config.BackendConfig`."""
        raise NotImplementedError(f"backend {cls.name!r} cannot be built from a config")

    def check(self) -> None:
        """Preflight: raise :class:`BackendError` when the backend cannot answer (in-process: nothing to do)."""

    def update_weights(self, update: WeightUpdate) -> None:
        """Serve ``update``'s weights from now on, tagged with its version (RL weight sync)."""
        raise NotImplementedError(f"weight sync into a {self.name!r} backend is not implemented")


def run_sync(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, even when an event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller's thread
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
