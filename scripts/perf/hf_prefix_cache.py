"""The ``hf`` backend's prefix KV cache, on and off, A B B A (a benchmark, not a test).

Two workloads, each run with reuse on (``reuse``: the budget the workload's config sets) and off
(``no-reuse``: ``prefix_cache_tokens=0``), alternating so a drift in the machine's load falls on
both sides; each run starts from an empty cache:

- ``eval``: the demo's evaluation of the ``research`` agent with ``configs/methods/demo_cpu.yaml``
  (what ``harness eval --method research --dataset demo -c configs/methods/demo_cpu.yaml --model
  MODEL`` runs), on the 39 questions of the demo as first shipped (``test_v1``, or ``test`` where
  the demo has no ``test_v1``). Every turn after the first re-sends the whole context.
- ``rollouts``: the rollouts of RL steps of the demo's GRPO recipe
  (``configs/train/smollm2_cpu_grpo_demo.yaml``: ``prompts_per_step`` prompts, ``n_samples`` = 8
  samples each sharing their prompt), collected as the trainer collects them
  (:func:`training.rl.rollout.collect`, the trainer's seeds and sampling), without the update.

    PYTHONPATH=. .venv/bin/python scripts/perf/hf_prefix_cache.py --model runs/demo/sft/model/final

``--model`` defaults to the demo's SFT model where ``harness demo`` has built it
(``runs/demo/sft/model/final``), else the untrained SmolLM2 (the script says which). Per run it
prints the wall time, the process CPU time (it swings less with the machine's load), the model
turns, the prompt tokens run through the model (``computed``) and taken from the cache
(``reused``), the tokens generated, the decode steps (``steps``: forwards of the running batch,
tokens / steps = rows a step) and ``admissions`` (step boundaries at which waiting requests were
prefilled), and EM (eval) or mean reward (rollouts); then the median speed-up per workload.
Greedy evaluation should score the same on both sides (token-exact reuse); sampled rollouts draw
the same seeds, so their tokens agree up to float noise.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.build import dataset_retriever, simple_evaluate
from benchmarks.datasets import get_spec
from harness.backends import build_backend
from harness.backends.base import SamplingParams
from harness.backends.hf import HFBackend
from harness.backends.hf_prefix import PrefixCache
from harness.config import compose, from_dict, load_yaml
from harness.eval_config import BackendConfig, EvalConfig
from harness.textfiles import read_jsonl
from pipelines.methods import build_method
from programs.demo.program import auto_threads
from training.build import rollout_backend
from training.config import TrainConfig
from training.examples import merged_corpus_dataset, train_examples
from training.rewards import build_reward
from training.rl.rollout import PromptSampler, collect
from training.validation import rollout_agent_options

METHODS_CONFIG = "configs/methods/demo_cpu.yaml"
RL_CONFIG = "configs/train/smollm2_cpu_grpo_demo.yaml"
SFT_MODEL = Path("runs/demo/sft/model/final")
DEFAULT_BUDGET = BackendConfig().prefix_cache_tokens


def _counts(backend: HFBackend) -> dict[str, int]:
    return {
        "computed": backend.prefill_computed,
        "reused": backend.prefill_reused,
        "generated": backend.tokens_generated,
        "steps": backend.steps_run,
        "admissions": backend.batches_run,
    }


def _measured(backend: HFBackend, reuse: bool, budget: int, work: Any) -> dict[str, Any]:
    """Run ``work()`` (-> turns, score) from an empty cache; its wall time and token counts."""
    backend.prefix_cache = PrefixCache(budget if reuse else 0)  # the worker reads it at its next admission
    before = _counts(backend)
    t0, cpu = time.perf_counter(), time.process_time()
    turns, score = work()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu
    after = _counts(backend)
    info = {k: after[k] - before[k] for k in after}
    peak = backend.prefix_cache.peak_tokens
    return {"wall_s": wall, "cpu_s": cpu, "turns": turns, "score": score, "peak_cached": peak, **info}


def eval_workload(args: argparse.Namespace, model: str) -> tuple[HFBackend, Any]:
    """The demo evaluation: its backend, and a run of it (a fresh run directory each time)."""
    split = args.split or ("test_v1" if "test_v1" in get_spec("demo").splits else "test")
    base = load_yaml(METHODS_CONFIG)
    data = {
        **base,
        "method": "research",
        "dataset": {"name": "demo", "split": split, "limit": args.limit},
        "backend": {**base.get("backend", {}), "model": model, "threads": args.threads},
    }
    first = from_dict(EvalConfig, {**data, "out": "unused"})
    backend = build_backend(first.backend)
    retriever = dataset_retriever(first.retriever, "demo", split)
    retriever.search(["warm up"], 3)  # numba compiles on first use; keep it out of the timing

    def run() -> tuple[int, float]:
        with tempfile.TemporaryDirectory() as out:
            cfg = from_dict(EvalConfig, {**data, "out": out})
            res = simple_evaluate(cfg, backend=backend, retriever=retriever)
            turns = sum(
                rec.get("n_turns", 0)
                for path in Path(out).glob("*/trajectories.jsonl")
                for _, rec in read_jsonl(path, tolerant=True)
            )
        return turns, float(res.metrics["em"])

    print(f"eval: research on demo/{split}, {METHODS_CONFIG}, model {model}", flush=True)
    return backend, run


def rollout_workload(args: argparse.Namespace, model: str) -> tuple[HFBackend, Any]:
    """The demo's GRPO rollouts of ``args.rl_steps`` steps, as the trainer collects them."""
    cfg = compose(TrainConfig, [RL_CONFIG], [f"model.path={model}", f"optim.threads={args.threads}", *args.rl])
    backend = rollout_backend(cfg)
    retriever = dataset_retriever(cfg.retriever, merged_corpus_dataset(cfg), cfg.data.split, cfg.data.data_dir)
    retriever.search(["warm up"], 3)
    agent = build_method(cfg.rollout.method, backend, retriever, rollout_agent_options(cfg))
    reward = build_reward(cfg.algo.reward)
    s = cfg.rollout.sampling  # as the trainer samples
    sampling = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p)
    examples = train_examples(cfg)

    def run() -> tuple[int, float]:
        sampler = PromptSampler(examples, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)  # the trainer's
        trajs = []
        for step in range(args.rl_steps):
            prompts = sampler.next(cfg.rollout.prompts_per_step)
            batch = collect(agent, prompts, cfg.rollout.n_samples, sampling, 0, seed=cfg.rollout_seed + step)
            trajs += batch.trajectories
        return sum(t.n_turns for t in trajs), statistics.mean(reward(t)[0] for t in trajs)

    r = cfg.rollout
    print(
        f"rollouts: {args.rl_steps} step(s) of {RL_CONFIG} ({r.prompts_per_step} prompts x {r.n_samples} samples, "
        f"temperature {r.sampling.temperature}, max_batch_size {r.backend.max_batch_size}), model {model}",
        flush=True,
    )
    return backend, run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help=f"default: {SFT_MODEL} if it exists, else smollm2-135m-instruct")
    p.add_argument("--only", default="eval,rollouts", help="workloads, from eval,rollouts")
    p.add_argument("--order", default="reuse,no-reuse,no-reuse,reuse", help="the sides in order (A B B A)")
    p.add_argument(
        "--budget",
        type=int,
        default=None,
        help="prefix_cache_tokens of the reuse side (default: the workload's config, else the backend's default)",
    )
    p.add_argument("--split", default=None, help="eval split (default: test_v1 where the demo has it, else test)")
    p.add_argument("--limit", type=int, default=None, help="eval: first N questions")
    p.add_argument("--rl-steps", type=int, default=1, help="rollouts: the prompts of this many RL steps")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: as harness demo chooses)")
    p.add_argument(
        "--rl",
        action="append",
        default=[],
        help="rollouts: an override of the RL recipe (repeatable), e.g. rollout.prompts_per_step=2",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads is None:
        args.threads, why = auto_threads()
        print(f"torch threads: {args.threads} ({why})", flush=True)
    model = args.model or (str(SFT_MODEL) if SFT_MODEL.is_dir() else "smollm2-135m-instruct")
    if args.model is None and not SFT_MODEL.is_dir():
        print(f"no SFT model at {SFT_MODEL} (harness demo builds it): the untrained SmolLM2 instead", flush=True)
    sides = [s.strip() for s in args.order.split(",") if s.strip()]
    if not set(sides) <= {"reuse", "no-reuse"}:
        raise SystemExit(f"--order: sides are reuse and no-reuse, got {args.order!r}")
    builders = {"eval": eval_workload, "rollouts": rollout_workload}
    for name in [w.strip() for w in args.only.split(",") if w.strip()]:
        if name not in builders:
            raise SystemExit(f"--only: workloads are {', '.join(builders)}, got {name!r}")
        backend, work = builders[name](args, model)
        budget = args.budget if args.budget is not None else backend.prefix_cache.budget or DEFAULT_BUDGET
        print(f"{name}: prefix_cache_tokens={budget} on the reuse side", flush=True)
        walls: dict[str, list[float]] = {}
        try:
            for side in sides:
                m = _measured(backend, side == "reuse", budget, work)
                walls.setdefault(side, []).append(m["wall_s"])
                context = m["computed"] + m["reused"]
                print(
                    f"{name} {side}: wall_s={m['wall_s']:.1f} cpu_s={m['cpu_s']:.1f} turns={m['turns']} "
                    f"context_tokens={context} "
                    f"computed={m['computed']} reused={m['reused']} ({m['reused'] / max(1, context):.0%}) "
                    f"generated={m['generated']} steps={m['steps']} admissions={m['admissions']} "
                    f"{'em' if name == 'eval' else 'mean_reward'}={m['score']:.3f} "
                    f"peak_cached_tokens={m['peak_cached']}",
                    flush=True,
                )
        finally:
            backend.close()
        if {"reuse", "no-reuse"} <= walls.keys():
            on, off = statistics.median(walls["reuse"]), statistics.median(walls["no-reuse"])
            print(f"{name}: median wall_s reuse={on:.1f} no-reuse={off:.1f} speed-up={off / on:.2f}x", flush=True)


if __name__ == "__main__":
    main()
