"""``openai``: OpenAI-compatible ``/v1/completions`` (vLLM, SGLang, llama.cpp servers).

The prompt is sent as token ids (vLLM and SGLang accept a list of ints). Servers report the
matched stop differently, and this backend normalises them:

- SGLang: ``choices[i].matched_stop`` (a string or a token id);
- vLLM: ``choices[i].stop_reason`` (a string, a token id, or null for EOS); we also ask vLLM
  for ``include_stop_str_in_output`` and ``return_token_ids``;
- llama.cpp: neither; a ``stop`` finish whose text ends with one of our stop strings is taken as
  that string, otherwise as EOS (llama.cpp trims stop words, so this is a best guess: said here
  rather than hidden).

A trimmed stop string is re-appended so the text keeps it. Token ids come from the response when
the server returns them (vLLM ``token_ids``), else from encoding the text with the tokenizer
(exact for the harness' purposes only when the server's tokenizer agrees).

RL weight sync (``update_weights`` full weights from disk, ``update_lora_adapter``) works against
vLLM started with its development endpoints: :mod:`harness.backends.vllm_sync`.
"""

from __future__ import annotations

import os
from typing import Any

from harness.backends.base import BackendError, Completion, SamplingParams
from harness.backends.http_common import HTTPBackendBase, optional_sampling
from harness.backends.vllm_sync import VLLMWeightSync


class OpenAIBackend(VLLMWeightSync, HTTPBackendBase):
    """Client of an OpenAI-compatible ``/v1/completions`` server (see module docstring).

    ``url``: base URL(s), with or without ``/v1`` (several: round-robin). ``model``: tokenizer
    name or directory (default the embedded model). ``api_key``: default ``$OPENAI_API_KEY``.
    ``served_model``: the server's model name (default: the first it lists on ``/v1/models``).
    After :meth:`update_lora_adapter`, requests name the loaded adapter instead (``lora_name``).
    ``http``: :class:`~harness.backends.http_common.HTTPBackendBase`'s ``max_concurrency``,
    ``timeout``, ``retries`` and ``backoff``.
    """

    name = "openai"
    health_path = "/v1/models"

    def __init__(
        self,
        url: str | list[str],
        model: str | None = None,
        api_key: str | None = None,
        health_check: bool = True,
        tokenizer: Any = None,
        served_model: str | None = None,
        max_context: int | None = None,
        **http: Any,
    ) -> None:
        key = api_key or os.environ.get("OPENAI_API_KEY")
        urls = [url] if isinstance(url, str) else list(url)
        urls = [u.rstrip("/").removesuffix("/v1") for u in urls]  # accept base URLs with or without /v1
        headers = {"Authorization": f"Bearer {key}"} if key else None
        super().__init__(urls, headers=headers, **http)
        if health_check:
            self.check_health("/v1/models", hint="Start an OpenAI-compatible server (vLLM, SGLang, llama.cpp).")
        self.tokenizer = self.load_tokenizer(model, tokenizer)
        # The name the server knows the model by (defaults to what it lists first).
        self.served_model = served_model or (self._first_model() if health_check else None) or model or "default"
        self.max_context = self.context_limit(self.tokenizer, max_context, ask_server=health_check)

    def _first_model(self) -> str | None:
        models = self.served_models()
        return models[0].get("id") if models else None

    def payload(self, input_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.lora_name or self.served_model,
            "prompt": list(input_ids),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "include_stop_str_in_output": True,  # vLLM: keep the matched stop string
            "return_token_ids": True,  # vLLM: the generated ids
            **optional_sampling(params),
        }
        if params.logprobs:
            body["logprobs"] = 1
        return body

    async def agenerate(self, input_ids: list[int], params: SamplingParams) -> Completion:
        data = await self.post_json("/v1/completions", self.payload(input_ids, params))
        return self.parse(data, len(input_ids), params)

    async def _sample_n(self, input_ids: list[int], params: SamplingParams, n: int) -> list[Completion]:
        """``n`` samples in one request (the ``n`` of the completions API: ``n`` choices)."""
        data = await self.post_json("/v1/completions", {**self.payload(input_ids, params), "n": n})
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or len(choices) != n:
            raise BackendError(f"asked for n={n} choices, got {str(data)[:300]}")
        # Choices may come in any order; their "index" says which is which.
        order = sorted(range(n), key=lambda i: choices[i].get("index", i))
        return [self.parse(data, len(input_ids), params, index=i) for i in order]

    def parse(self, data: dict[str, Any], n_prompt: int, params: SamplingParams, index: int = 0) -> Completion:
        """Choice ``index`` of a completions response to a :class:`Completion` (module docstring)."""
        try:
            choice = data["choices"][index]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"malformed completions response: {str(data)[:300]}") from None
        text = choice.get("text") or ""
        fr = choice.get("finish_reason")
        matched: str | int | None = choice.get("matched_stop", choice.get("stop_reason"))
        if fr == "stop":
            reason = "stop"
            if matched is None:
                matched = next((s for s in params.stop if text.endswith(s)), None)
            if isinstance(matched, str) and not text.endswith(matched):
                text += matched  # the server trimmed it
        elif fr in ("length", "abort"):  # cut short: no stop matched
            reason, matched = fr, None
        else:
            raise BackendError(f"unexpected finish_reason {fr!r}")
        ids = choice.get("token_ids")
        from_server = ids is not None
        eos_like = {*params.stop_token_ids, self.tokenizer.eos_token_id} - {None}
        if from_server:
            ids = list(ids)
            # A server that trimmed the stop string from its ids too: add the string's tokens back.
            if isinstance(matched, str) and matched not in self.tokenizer.decode(ids):
                ids += self.tokenizer.encode(matched, add_special_tokens=False)
        else:
            # Approximation: re-encoding the text need not give the ids the server sampled (a
            # different merge), but decodes to the same text; exact when the server returns ids.
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        if reason == "stop" and not isinstance(matched, str):
            # EOS (vLLM's stop_reason null, llama.cpp's plain "stop"): matched is the token id.
            if matched is None:
                matched = ids[-1] if from_server and ids and ids[-1] in eos_like else self.tokenizer.eos_token_id
            if (not ids or ids[-1] != matched) and matched is not None:
                ids.append(int(matched))
        logprobs = None
        lp = choice.get("logprobs")
        if params.logprobs and isinstance(lp, dict) and lp.get("token_logprobs") is not None:
            logprobs = [float(x) if x is not None else 0.0 for x in lp["token_logprobs"]]
            # Tokens we added (a restored stop string, EOS) have no logprob from the server: 0.0.
            logprobs = (logprobs + [0.0] * len(ids))[: len(ids)]
        usage = data.get("usage") or {}
        return Completion(
            token_ids=list(ids),
            text=text,
            finish_reason=reason,  # type: ignore[arg-type]
            matched_stop=matched,
            logprobs=logprobs,
            prompt_tokens=int(usage.get("prompt_tokens", n_prompt)),
            # SGLang reports it; vLLM does not, so the version this client last pushed (or None).
            weight_version=(data.get("metadata") or {}).get("weight_version") or self.weight_version,
        )
