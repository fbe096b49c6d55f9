"""Questions/s of the search agent on the in-process ``hf`` backend: continuous batching vs
batch-at-a-time, and FlashRAG's turn-synchronous ``SearchR1Pipeline`` on the same backend (a
benchmark, not a test).

The same model (the embedded SmolLM2 by default), questions (the shipped demo), BM25 retriever,
per-turn token budget and turn limit for all three; greedy decoding.

- ``continuous``: the agent (``simple_evaluate``, ``--concurrency`` items at once) with requests joining
  the running decode batch at every step boundary (the backend's default);
- ``batch-at-a-time``: the same, with ``backend.continuous = False`` (a new batch starts only
  when the running one has drained: the backend's behaviour before continuous batching);
- ``flashrag``: FlashRAG's ``SearchR1Pipeline.run`` (every turn of every question generated as
  one call; the slowest item gates each turn), its generator being the same backend.

    PYTHONPATH=. .venv/bin/python scripts/perf/hf_batching.py --n 16 --concurrency 8

Besides questions/s (wall clock), each run prints its process CPU seconds, the tokens generated,
the decode steps and the mean rows per step: on a shared machine wall clock is noisy, and these
say how much work each run did and how full its batches ran.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import tempfile
import time
from typing import Any

from benchmarks.build import dataset_retriever, simple_evaluate
from benchmarks.datasets import load_examples
from harness.backends.hf import HFBackend
from harness.config import from_dict
from harness.eval_config import EvalConfig, RetrieverConfig
from pipelines.flashrag_compat import (
    FlashRAGChatPrompt,
    FlashRAGGenerator,
    FlashRAGRetriever,
    safe_config,
    to_flashrag_dataset,
)


def agent_qps(backend: HFBackend, retriever: Any, args: argparse.Namespace, continuous: bool) -> tuple[float, dict]:
    backend.continuous = continuous
    with tempfile.TemporaryDirectory() as out:
        cfg = from_dict(
            EvalConfig,
            {
                "method": "search_r1",
                "dataset": {"name": "demo", "split": "test", "limit": args.n},
                "backend": {"kind": "hf", "max_batch_size": args.concurrency, "max_concurrency": args.concurrency},
                "retriever": {"kind": "bm25", "topk": args.topk},
                "agent": {"max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens, "temperature": 0.0},
                "out": out,
            },
        )
        t0 = time.perf_counter()
        res = simple_evaluate(cfg, backend=backend, retriever=retriever)
        wall = time.perf_counter() - t0
    backend.continuous = True
    return args.n / wall, {"wall_s": wall, "em": res.metrics["em"], "mean_searches": res.mean_searches}


class _Generator:
    """The backend as FlashRAG's generator, with the agent's per-turn budget."""

    def __init__(self, backend: HFBackend, max_new_tokens: int) -> None:
        self.generator, self.max_new_tokens = FlashRAGGenerator(backend), max_new_tokens

    def generate(self, prompts: list[str], **kw: Any) -> list[str]:
        return self.generator.generate(prompts, **{**kw, "max_tokens": self.max_new_tokens, "temperature": 0.0})


def flashrag_qps(backend: HFBackend, retriever: Any, args: argparse.Namespace) -> tuple[float, dict]:
    # deferred: flashrag imports torch and its own stack (seconds)
    from flashrag.pipeline import SearchR1Pipeline

    config = safe_config()
    examples = load_examples("demo", "test", limit=args.n)
    template = FlashRAGChatPrompt(backend.tokenizer, SearchR1Pipeline.user_prompt)
    pipe = SearchR1Pipeline(
        config,
        prompt_template=template,
        max_retrieval_num=args.max_turns + 1,  # the agent's turns: max_turns searches, then a final one
        retriever=FlashRAGRetriever(retriever, args.topk),
        generator=_Generator(backend, args.max_new_tokens),
    )
    dataset = to_flashrag_dataset(examples, config)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints every turn
        out = pipe.run(dataset, do_eval=False)
    wall = time.perf_counter() - t0
    answered = sum(1 for item in out if getattr(item, "finish_reason", "") == "Finished")
    return args.n / wall, {"wall_s": wall, "answered": answered}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--only",
        default="batch,continuous,flashrag",
        help="runs in this order, from continuous,batch,flashrag (repeat names to interleave repeats)",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    backend = HFBackend(model=args.model, max_batch_size=args.concurrency, threads=args.threads)
    retriever = dataset_retriever(RetrieverConfig(kind="bm25", topk=args.topk), "demo", "test")
    retriever.search(["warm up"], args.topk)  # numba compiles on first use; keep it out of the timing
    runs = [r.strip() for r in args.only.split(",") if r.strip()]
    all_qps: dict[str, list[float]] = {}
    for name in runs:
        steps, tokens, cpu = backend.steps_run, backend.tokens_generated, time.process_time()
        if name == "flashrag":
            q, info = flashrag_qps(backend, retriever, args)
        else:
            q, info = agent_qps(backend, retriever, args, continuous=name == "continuous")
        # Counts that do not depend on how busy the machine is: the work done and how full the batch ran.
        steps, tokens = backend.steps_run - steps, backend.tokens_generated - tokens
        info.update(
            cpu_s=time.process_time() - cpu,
            generated_tokens=tokens,
            decode_steps=steps,
            rows_per_step=tokens / max(1, steps),
        )
        all_qps.setdefault(name, []).append(q)
        extra = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
        print(f"{name}: questions={args.n} questions_per_s={q:.3f} {extra}", flush=True)
    # Medians over repeats: the machine may be shared, so single runs are noisy.
    qps = {k: float(statistics.median(v)) for k, v in all_qps.items()}
    print("median questions/s: " + " ".join(f"{k}={v:.3f}" for k, v in qps.items()))
    if "continuous" in qps and "flashrag" in qps:
        print(f"ratio continuous/flashrag = {qps['continuous'] / qps['flashrag']:.2f}")
    if "continuous" in qps and "batch" in qps:
        print(f"ratio continuous/batch-at-a-time = {qps['continuous'] / qps['batch']:.2f}")
    backend.close()


if __name__ == "__main__":
    main()
