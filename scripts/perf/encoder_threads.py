"""Query-encoder cost per query: one at a time, batches of 32 (padded to the longest) and
length-sorted chunks of 8 and 4, with 1 and 2 torch threads (a benchmark, not a test).

    PYTHONPATH=. .venv/bin/python scripts/perf/encoder_threads.py [--batches 3] [--repeats 1]

The shipped MiniLM encodes random batches of 32 HotpotQA dev questions (``../shared/data``);
each mode runs the same batches, interleaved, and the medians over repeats are printed in
milliseconds of wall clock per query (on a shared machine, read them next to the load average).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from harness.retrieval.encoders import Encoder
from scripts.perf.loadgen import questions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", default="1,2")
    args = p.parse_args()
    enc = Encoder()
    qs = questions()
    rng = random.Random(0)
    lens = sorted(len(enc.tokenizer(q)["input_ids"]) for q in qs[:400])
    print(f"query tokens: mean {statistics.mean(lens):.1f} p50 {lens[200]} p90 {lens[360]} max {lens[-1]}")
    batches = [rng.sample(qs, 32) for _ in range(args.batches)]

    def run(bs: int) -> float:
        t0 = time.perf_counter()
        enc.batch_size = max(bs, 1)
        for b in batches:
            if bs == 1:
                for q in b:
                    enc.encode([q], kind="query")
            else:
                enc.encode(b, kind="query")  # sorted by length, cut into calls of ``bs``
        return (time.perf_counter() - t0) / (len(batches) * 32) * 1e3

    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        res: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for bs in (1, 32, 8, 4):
                res.setdefault("single" if bs == 1 else f"batch{bs}", []).append(run(bs))
        print(
            f"threads={threads} ms/query: " + " ".join(f"{k}={statistics.median(v):.2f}" for k, v in res.items()),
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
