"""What the engine tier checks, on a backend talking to a real server, and how it starts one.

Parity with the in-process ``hf`` backend is checked under greedy decoding, both sides in
float32 (``ENGINE_ARGS``). Even so, the engines' CPU kernels (fused attention, different
matmul blocking) sum in another order than eager PyTorch, so two candidates whose logits tie
to ~1e-6 can swap and the continuations part from there. The tolerance is therefore stated
on what such a flip does and does not explain: every prompt must agree on its first
``PARITY_PREFIX`` tokens, and at least ``PARITY_MIN_EXACT`` of the prompts must agree exactly
(same token ids, finish reason and count). A protocol bug (a dropped stop token, an EOS not
reported, an off-by-one in the prompt) breaks every prompt, not one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.backends.base import Completion, SamplingParams
from harness.backends.vllm_sync import RL_ARGS as VLLM_RL_ARGS
from harness.backends.vllm_sync import RL_ENV as VLLM_RL_ENV
from harness.engines import EngineConfig, EngineProcess, engine_dir, engine_ready, launched

# float32 on both engines (their "auto" turns a float32 checkpoint into float16). SGLang on CPU
# otherwise sizes its KV pool from free RAM (~15 GB here); 32k tokens (1.5 GB) is plenty. vLLM
# reserves this share of RAM.
# vLLM runs as a training launch starts it (harness.backends.vllm_sync.RL_ARGS/RL_ENV): its RL
# endpoints (/collective_rpc, /pause, /reset_prefix_cache, /update_weight_version) exist only in
# its development mode, and its log-probs are of the sampling distribution only when asked.
ENGINE_ARGS = {
    "sglang": ["--dtype", "float32", "--max-total-tokens", "32768"],
    "vllm": ["--dtype", "float32", "--gpu-memory-utilization", "0.3", *VLLM_RL_ARGS],
}
ENGINE_ENV = {"sglang": {}, "vllm": dict(VLLM_RL_ENV)}

PARITY_PREFIX = 8
PARITY_MIN_EXACT = 0.75
N_PARITY_PROMPTS = 8


@contextlib.contextmanager
def serve(
    engine: str, model_dir: str, log_dir: Path, args: list[str] = (), env: dict[str, str] | None = None
) -> Iterator[EngineProcess]:
    """A real ``engine`` serving ``model_dir`` for the block (the test skips if its venv is missing);
    ``args``/``env`` add to ``ENGINE_ARGS``/``ENGINE_ENV``."""
    if not engine_ready(engine):  # type: ignore[arg-type]
        pytest.skip(f"no {engine} venv under {engine_dir()}: run scripts/build_engine_venvs.sh (make test-engines)")
    cfg = EngineConfig(
        device="cpu",
        args=[*ENGINE_ARGS[engine], *args],
        env={**ENGINE_ENV[engine], **(env or {})},
        health_timeout=900.0,
    )
    with launched(engine, model_dir, cfg, log_dir=log_dir) as proc:  # type: ignore[arg-type]
        yield proc


def run(coro):
    return asyncio.run(coro)


def chat_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def demo_prompts(tokenizer, n: int = N_PARITY_PROMPTS) -> list[list[int]]:
    """The research dialect's agent prompts for the first ``n`` demo questions."""
    from benchmarks.datasets import load_examples
    from pipelines.dialects import get_dialect

    dialect = get_dialect("research")
    return [dialect.prompt_ids(tokenizer, ex.question, chat=True) for ex in load_examples("demo", limit=n)]


def gen(backend, ids: list[int], **kw) -> Completion:
    return run(backend.agenerate(ids, SamplingParams(**kw)))


def gen_many(backend, prompts: list[list[int]], **kw) -> list[Completion]:
    return run(backend.agenerate_many(prompts, SamplingParams(**kw)))


def check_length_finish(backend) -> None:
    c = gen(backend, chat_ids(backend.tokenizer, "Write a long story about a dragon."), max_new_tokens=5)
    assert c.finish_reason == "length" and c.matched_stop is None
    assert len(c.token_ids) == 5
    assert c.text == backend.tokenizer.decode(c.token_ids, skip_special_tokens=True)


def check_eos_finish(backend) -> None:
    eos = backend.tokenizer.eos_token_id
    c = gen(backend, chat_ids(backend.tokenizer, "Say just the word: hello"), max_new_tokens=64)
    assert c.finish_reason == "stop", c
    assert c.matched_stop == eos and c.token_ids[-1] == eos  # EOS is a token of the response
    assert "hello" in c.text.lower()


def check_stop_string_kept(backend, hf_backend) -> None:
    """A stop string the greedy continuation is known to contain: generation stops there and
    the string stays at the end of the text and in the token ids (the agent's contract)."""
    ids = chat_ids(backend.tokenizer, "Count from 1 to 20, separated by commas.")
    free = gen(hf_backend, ids, max_new_tokens=40)
    assert "7" in free.text, free.text  # the stop we pick below must occur
    stop = "7"
    c = gen(backend, ids, max_new_tokens=40, stop=(stop,))
    assert c.finish_reason == "stop" and c.matched_stop == stop, c
    assert c.text.endswith(stop)
    assert backend.tokenizer.decode(c.token_ids, skip_special_tokens=True).endswith(stop)
    assert free.text.startswith(c.text)  # stopped at the first occurrence, nothing lost before it


def check_logprobs(backend) -> None:
    c = gen(backend, chat_ids(backend.tokenizer, "Name a colour."), max_new_tokens=12, logprobs=True)
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
    assert all(lp <= 1e-4 and math.isfinite(lp) for lp in c.logprobs)
    # Greedy picks the most likely token; its probability cannot be tiny on a 49k vocabulary.
    assert max(c.logprobs) > math.log(0.05)


def check_sampled_logprobs_temperature(backend, model_dir: Path, scaled: bool) -> None:
    """Sampled at temperature 0.7, the server's logprob of each token is of softmax(logits / 0.7)
    when ``scaled`` (what the trainer scores: SGLang's default, vLLM's ``processed_logprobs``), else
    of the raw logits (vLLM's default ``raw_logprobs``). Either way one of the two, to 1e-2, and not
    the other."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = chat_ids(backend.tokenizer, "Tell me a random fact about the ocean.")
    c = gen(backend, ids, max_new_tokens=16, temperature=0.7, seed=5, logprobs=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids + c.token_ids])).logits[0, len(ids) - 1 : -1].float()  # [n, V]
    picked = torch.tensor(c.token_ids)[:, None]

    def gap(t: float) -> float:
        ours = torch.log_softmax(logits / t, -1).gather(1, picked)[:, 0]
        return (ours - torch.tensor(c.logprobs)).abs().max().item()

    same, other = (gap(0.7), gap(1.0)) if scaled else (gap(1.0), gap(0.7))
    assert same < 1e-2 < other, (same, other)


def check_n_samples(backend) -> None:
    ids = chat_ids(backend.tokenizer, "Tell me a random fact about the ocean.")
    outs = run(backend.agenerate_n(ids, SamplingParams(max_new_tokens=24, temperature=1.0, logprobs=True), n=4))
    assert len(outs) == 4
    for c in outs:
        assert c.token_ids and c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
    assert len({tuple(c.token_ids) for c in outs}) >= 2  # sampled, not four copies


def parity_report(engine_out: list[Completion], hf_out: list[Completion]) -> tuple[list[int], list[int]]:
    """(indices that agree exactly, indices that part before PARITY_PREFIX tokens)."""
    exact, early = [], []
    for i, (e, h) in enumerate(zip(engine_out, hf_out, strict=True)):
        if e.token_ids == h.token_ids and e.finish_reason == h.finish_reason:
            exact.append(i)
        k = min(PARITY_PREFIX, len(h.token_ids), len(e.token_ids))
        if e.token_ids[:k] != h.token_ids[:k]:
            early.append(i)
    return exact, early


def check_greedy_parity(backend, hf_backend) -> None:
    prompts = demo_prompts(backend.tokenizer)
    kw = dict(max_new_tokens=48, stop=("</search>", "</answer>"))
    engine_out = gen_many(backend, prompts, **kw)
    hf_out = gen_many(hf_backend, prompts, **kw)
    exact, early = parity_report(engine_out, hf_out)
    detail = "\n".join(
        f"{i}: {e.finish_reason} {e.text!r}\n   hf {h.finish_reason} {h.text!r}"
        for i, (e, h) in enumerate(zip(engine_out, hf_out, strict=True))
        if i not in exact
    )
    print(f"greedy parity with hf: {len(exact)}/{len(prompts)} prompts token-identical; {len(early)} part early")
    assert not early, f"prompts {early} differ within {PARITY_PREFIX} tokens:\n{detail}"
    assert len(exact) >= PARITY_MIN_EXACT * len(prompts), f"only {len(exact)}/{len(prompts)} exact:\n{detail}"
    for i in exact:  # where the tokens agree, the reported counts and stops agree too
        assert engine_out[i].matched_stop == hf_out[i].matched_stop
        assert len(engine_out[i].token_ids) == len(hf_out[i].token_ids)


def check_agent_on_demo(backend, n: int = 3) -> list:
    """THE search agent through this backend on a few demo questions, with real BM25."""
    from benchmarks.build import dataset_retriever
    from benchmarks.datasets import load_examples
    from harness.eval_config import RetrieverConfig
    from pipelines.search_agent import AgentConfig, SearchAgent

    examples = load_examples("demo", limit=n)
    retriever = dataset_retriever(RetrieverConfig(kind="bm25"), "demo")
    agent = SearchAgent(backend, retriever, "research", AgentConfig(max_turns=2, max_new_tokens=64, few_shot=True))
    trajs = agent.run_examples(examples)
    assert len(trajs) == n
    for t in trajs:
        assert t.error is None and t.finish_reason != "error", (t.finish_reason, t.error)
        assert t.generated_tokens > 0 and len(t.token_ids) == len(t.loss_mask)
        assert t.response_text  # the decoded response the scorer reads
    return trajs


def processes_with(fragment: str) -> list[int]:
    """Pids whose command line contains ``fragment`` (arguments joined by spaces)."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fragment in cmd:
            found.append(int(pid))
    return found
