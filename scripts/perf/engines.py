"""Agent questions/s through the ``hf``, ``sglang`` and ``vllm`` backends at several concurrencies
(a benchmark, not a test), so the gain from the engines' continuous batching is visible.

    .venv/bin/python scripts/perf/engines.py [--backends hf,sglang,vllm] [--concurrency 1,8] [--n 16]

The research agent runs greedy on the first N ``demo`` questions with real BM25 (few-shot
prompt, 2 search turns, 64 new tokens per turn). SGLang and vLLM are started from the venvs
``scripts/build_engine_venvs.sh`` builds (``make engines``), once each, and stopped at the end;
each serves the embedded SmolLM2 in ``--dtype`` (float32 by default, as ``hf`` runs). ``hf``'s
batch size is set to the concurrency, so all three get the same number of requests in flight.
Engine start-up is reported separately and is not in the throughput. Each line is one timed run
after one warm-up request; the machine's other load is not controlled, so compare lines of one
invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
import time

from benchmarks.build import dataset_retriever
from benchmarks.datasets import load_examples
from harness.backends.hf import HFBackend
from harness.backends.openai import OpenAIBackend
from harness.backends.sglang import SGLangBackend
from harness.engines import EngineConfig, engine_ready, launched
from harness.eval_config import RetrieverConfig
from harness.models import resolve_model
from pipelines.methods import build_method


def add_engine_options(p: argparse.ArgumentParser, model: str, engine: str) -> None:
    """The options of a script that talks to an inference engine (``engine`` names it in the
    help): a running server's ``--url`` or ``--launch``, the ``--model`` and its ``--dtype``."""
    p.add_argument("--url", default=None, help=f"a running {engine} server")
    p.add_argument("--launch", action="store_true", help=f"start {engine} from its venv and stop it after")
    p.add_argument("--model", default=model)
    p.add_argument("--dtype", default="float32")


def add_agent_options(p: argparse.ArgumentParser) -> None:
    """The Search-R1 agent's shape in the engine comparisons: turns, tokens per turn, context,
    document length and documents per search."""
    p.add_argument("--max-turns", type=int, default=2, help="search turns (Search-R1 adds a final turn)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="per turn")
    p.add_argument("--max-total-tokens", type=int, default=4096)
    p.add_argument("--max-doc-tokens", type=int, default=512)
    p.add_argument("--topk", type=int, default=3)


def make_backends(name: str, model: str, dtype: str, concurrency: int, stack: contextlib.ExitStack, logs: str):
    """A factory ``c -> backend`` for one backend kind (starting its engine once), and start-up seconds."""
    t0 = time.perf_counter()
    if name == "hf":
        return (lambda c: HFBackend(model=model, dtype=dtype, max_batch_size=c, threads=None)), 0.0
    engine = {"sglang": "sglang", "vllm": "vllm"}[name]
    if not engine_ready(engine):  # type: ignore[arg-type]
        raise SystemExit(f"no {engine} venv: run `make engines` first")
    args = ["--dtype", dtype] + (["--max-total-tokens", "65536"] if engine == "sglang" else [])
    proc = stack.enter_context(launched(engine, model, EngineConfig(device="cpu", args=args), log_dir=logs))  # type: ignore[arg-type]
    startup = time.perf_counter() - t0
    if engine == "sglang":
        return (lambda c: SGLangBackend(proc.url, model=model, max_concurrency=c)), startup

    return (lambda c: OpenAIBackend(proc.url, model=model, max_concurrency=c)), startup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="hf,sglang,vllm")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--n", type=int, default=16, help="demo questions per run")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    model = resolve_model("smollm2-135m-instruct")
    examples = load_examples("demo", limit=args.n)
    retriever = dataset_retriever(RetrieverConfig(kind="bm25"), "demo")
    retriever.search(["warm up"], 3)  # numba compiles on first use
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"questions={len(examples)} max_new_tokens={args.max_new_tokens} dtype={args.dtype}")
    for name in args.backends.split(","):
        with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as logs:
            factory, startup = make_backends(name, model, args.dtype, max(levels), stack, logs)
            if startup:
                print(f"{name}: engine start-up {startup:.0f} s")
            base = None
            for c in levels:
                backend = factory(c)
                options = {
                    "max_turns": 2,
                    "max_new_tokens": args.max_new_tokens,
                    "few_shot": True,
                    "max_concurrency": c,
                }
                agent = build_method("research", backend, retriever, options)
                agent.run_examples(examples[:1])  # warm-up
                t0 = time.perf_counter()
                trajs = agent.run_examples(examples)
                wall = time.perf_counter() - t0
                backend.close()
                tokens = sum(t.generated_tokens for t in trajs)
                errors = sum(t.error is not None for t in trajs)
                qps = len(trajs) / wall
                base = base or qps
                print(
                    f"{name:6s} concurrency={c:<3d} wall_s={wall:7.1f} questions_per_s={qps:.3f} "
                    f"generated_tokens_per_s={tokens / wall:6.1f} searches={sum(len(t.searches) for t in trajs)} "
                    f"errors={errors} speedup_vs_c{levels[0]}={qps / base:.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
