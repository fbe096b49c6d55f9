"""Agent throughput on real data with the embedded model (a benchmark, not a test).

Runs the search agent on N questions of HotpotQA ``dev_distractor1352`` over its paragraph
corpus (BM25), with the in-process ``hf`` backend, and prints questions/s, generated tokens/s
and the share of wall time spent in generation, retrieval and everything else.

    .venv/bin/python scripts/perf/eval_throughput.py --n 50 [--method research] [--data-dir ../shared/data]

Generation and retrieval times are summed per item while items overlap, so the shares are of
the summed per-item time (they say where an item waits), next to the end-to-end wall clock.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from benchmarks.build import build_eval, simple_evaluate
from harness.backends import build_backend
from harness.config import from_dict
from harness.eval_config import EvalConfig
from harness.runlog import RunDir


def main() -> None:
    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--method", default="research")
    p.add_argument("--data-dir", default=str(here.parents[3] / "shared" / "data"))
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory() as out:
        cfg = from_dict(
            EvalConfig,
            {
                "method": args.method,
                "dataset": {
                    "name": "hotpotqa",
                    "split": "dev_distractor1352",
                    "limit": args.n,
                    "data_dir": args.data_dir,
                },
                "backend": {"kind": "hf", "max_batch_size": args.max_batch_size, "threads": args.threads},
                "retriever": {"kind": "bm25", "topk": 3},
                "agent": {"max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens},
                "out": out,
            },
        )
        t_setup = time.perf_counter()
        backend = build_backend(cfg.backend)
        run = build_eval(cfg, backend=backend)
        run.retriever.search(["warm up"], 3)  # numba compiles on first use; keep it out of the timing
        setup = time.perf_counter() - t_setup

        t0 = time.perf_counter()
        results = simple_evaluate(cfg, run=run)
        wall = time.perf_counter() - t0
        trajs = RunDir(Path(out) / f"{args.method}-hotpotqa-dev_distractor1352").trajectories()
        backend.close()

    gen_tokens = sum(t.generated_tokens for t in trajs)
    gen_time = sum(t.generation_time_s for t in trajs)
    ret_time = sum(t.retrieval_time_s for t in trajs)
    item_time = sum(t.wall_time_s for t in trajs)
    other = max(0.0, item_time - gen_time - ret_time)
    print(f"method={args.method} questions={len(trajs)} batch={args.max_batch_size} setup_s={setup:.1f}")
    print(f"wall_s={wall:.1f} questions_per_s={len(trajs) / wall:.3f} generated_tokens_per_s={gen_tokens / wall:.1f}")
    print(f"generated_tokens={gen_tokens} mean_searches={results.mean_searches:.2f} EM={results.metrics['em']:.3f}")
    print(
        "share_of_item_time: "
        f"generation={gen_time / item_time:.1%} retrieval={ret_time / item_time:.1%} overhead={other / item_time:.1%}"
    )


if __name__ == "__main__":
    main()
