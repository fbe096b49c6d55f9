"""The generator backend protocol: token ids in, token ids out.

Every backend (``hf``, ``sglang``, ``openai``, ``scripted``) implements :meth:`Backend.agenerate`
for one request; callers run many requests concurrently and the backend batches what is in
flight. :class:`BackendBase` adds FlashRAG's generator interface (``generate(list[str], **kw)``)
on top, keeping the matched stop string in the returned text, so FlashRAG's own pipelines run on
any of our backends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

FinishType = Literal["stop", "length", "abort"]


class BackendError(RuntimeError):
    """A generation request failed for good (after any retries). Recorded on the item, not fatal."""


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

    def generate(self, input_list: Sequence[str] | str, **kw: Any) -> Any: ...

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


# FlashRAG passes generation options under several names (HF, vLLM and OpenAI spellings).
_FLASHRAG_MAX_TOKEN_KEYS = ("max_new_tokens", "max_tokens", "max_length")


class BackendBase:
    """Shared plumbing: FlashRAG's ``generate(list[str], **kw)`` on top of ``agenerate``.

    Subclasses set ``name``, ``tokenizer``, ``max_context`` and implement ``agenerate``.
    """

    name = "base"
    tokenizer: Any = None
    max_context: int = 2048
    default_params = SamplingParams(max_new_tokens=64)

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

    # ---- FlashRAG's generator interface ------------------------------------------------------
    def flashrag_params(self, kw: dict[str, Any]) -> SamplingParams:
        params = self.default_params
        for key in _FLASHRAG_MAX_TOKEN_KEYS:
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
        """FlashRAG's generator call: prompts (strings) in, texts out.

        The matched stop string is kept at the end of each text (FlashRAG's reasoning pipelines
        rely on it). With ``return_scores=True`` it also returns per-token probabilities.
        """
        if isinstance(input_list, str):
            input_list = [input_list]
        params = self.flashrag_params({**kw, "return_scores": return_scores})
        ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in input_list]
        completions = run_sync(self.agenerate_many(ids, params))
        texts = [c.text for c in completions]
        if return_scores:
            scores = [[math.exp(lp) for lp in (c.logprobs or [])] for c in completions]
            return texts, scores
        return texts


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
