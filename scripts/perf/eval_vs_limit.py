"""How close ``harness eval`` comes to what the engine itself can do with the same work, and what
the schedule alone gains with the protocol held fixed (a benchmark, not a test).

Three measurements on one real SGLang server, the same questions, greedy:

- ``async``: ``harness eval`` as it runs (``benchmarks.build.simple_evaluate``: the search_r1
  agent, BM25, the run directory written and scored item by item), each question at its own pace,
  ``--concurrency`` questions in flight;
- ``sync``: the same evaluation with ``schedule="sync"`` (``--schedule sync``): questions in waves
  of the concurrency, turn k of a wave released only when every question of the wave has finished
  turn k-1. Same dialect, prompts, stops and parsing, so under greedy decoding it should predict
  exactly what ``async`` predicts; the script counts the agreement;
- ``replay``: the engine's limit for that work. Every model call of the ``async`` run is recorded
  by a wrapper around the backend (:class:`RecordingBackend`: each call's input ids and the
  number of tokens the engine generated for it), then replayed against the same server as ONE
  batched ``/generate``: every call at once, each with ``max_new_tokens`` = its recorded length
  and ``ignore_eos``, turn dependencies ignored.

Why the replay is an upper bound on the generated tokens/s any scheduler could get from this
engine for this workload:

- it is the same work: the same prompts, the same number of generated tokens per call (checked:
  the script counts the calls whose ``completion_tokens`` differ from the recording);
- nothing waits on anything but the engine: no turn waits for the previous one, for a search or
  for the client; every call is queued at t=0, so the engine can batch as many as its own limits
  (``max_running_requests``, KV tokens; printed from its log) allow, from the first step;
- it gets the prefix-cache hits any schedule could have, and no more. A call's input can be found
  in SGLang's radix cache only as far as it agrees with a sequence (input and output) of a call
  that could have run before it: any call of another question, or an earlier turn of its own
  question (a later turn needs this call's answer first). For each call that reachable prefix is
  the longest common prefix with those sequences (:func:`reachable_hits`; at least the hit the
  agent's call got, should the engine have found more). An untimed warm-up pass prefills exactly
  those prefixes (``max_new_tokens`` 0), and the timed call finds no more than its own: the token
  right after it is replaced by a marker, a token id that no recorded sequence has at that
  position (:func:`plan_replay`). Without the marker turn k would find its whole input in turn
  k+1's warm-up, and the replay would skip prefilling the retrieved documents, work no scheduler
  can skip (the first version of this script did that: its limit did less work than the agent).
  A marker changes one token's value, not the length of anything, so the engine does the same
  work. The script prints the agent's cached tokens, the reachable ones and the replay's
  (SGLang's ``meta_info.cached_tokens``), and counts the calls whose replay hit differs from the
  plan;
- it does less besides: no stop strings to check, no client-side work (tokenization, retrieval,
  scoring, run-directory writes), which on this CPU shares the cores with the engine.

So the replay can overstate what is reachable (it assumes the engine's throughput does not fall
with a deeper queue), never understate it.

Workloads, as ``vs_flashrag.py`` defines them: ``uniform``: the first ``--n`` questions of
``--dataset/--split``; ``mixed``: an untimed selection pass of the agent over ``--pool`` questions,
then ``--n`` questions drawn evenly across the number of searches the model made (0 to
``--max-turns``). Rounds alternate A B B A: odd rounds ``async, sync, replay``, even rounds
``replay, sync, async`` (the replay of round r uses the latest ``async`` recording); medians of the
rounds are reported. One untimed question runs first (both schedules run the same code), and the engine's prefix cache
is emptied (``/flush_cache``) before every run and every replay's warm-up.

The model: ``scripts/perf/search_model.py`` builds a SmolLM2 that searches in the search_r1
dialect (pass its folder as ``--model``).

    PYTHONPATH=. .venv/bin/python scripts/perf/eval_vs_limit.py --launch \\
        --model runs/perf/search_model/sft/final --workload uniform --n 32 --concurrency 16
    ... --workload mixed --dataset hotpotqa --split dev_distractor1352 --data-dir ../shared/data \\
        --max-turns 4 --n 24 --pool 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import shlex
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.build import build_eval, dataset_retriever, simple_evaluate
from benchmarks.datasets import load_examples
from harness.backends.base import Completion, SamplingParams
from harness.backends.hf_prefix import common_prefix
from harness.backends.sglang import SGLangBackend
from harness.engines import EngineConfig, detect_device, launched
from harness.eval_config import BackendConfig, DatasetConfig, EvalConfig, RetrieverConfig
from harness.runlog import RunDir
from scripts.perf.engines import add_agent_options, add_engine_options
from scripts.perf.vs_flashrag import select_mixed

logger = logging.getLogger("eval_vs_limit")

SIDES = ("async", "sync")


@dataclass(frozen=True)
class Call:
    """One recorded model call: its input ids, the number of tokens the engine generated for it,
    the prefix-cache hit the engine reported (None when the backend does not say) and the
    generated ids themselves (what the engine's cache holds after the input)."""

    input_ids: tuple[int, ...]
    generated: int
    cached: int | None = None
    output_ids: tuple[int, ...] = ()


class RecordingBackend:
    """A backend that records every ``agenerate`` (:class:`Call`) and otherwise is ``inner``.

    The generated length is what the engine produced: the completion's tokens less any the
    client appended because the server had dropped them (``meta["restored_tokens"]``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[Call] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def agenerate(self, input_ids: list[int], params: SamplingParams) -> Completion:
        comp = await self.inner.agenerate(input_ids, params)
        generated = len(comp.token_ids) - int(comp.meta.get("restored_tokens") or 0)
        cached = comp.meta.get("cached_tokens")
        hit = None if cached is None else int(cached)
        self.calls.append(Call(tuple(input_ids), generated, hit, tuple(comp.token_ids[:generated])))
        return comp


def reachable_hits(calls: list[Call]) -> list[int]:
    """For each call, the longest prefix of its input that any schedule could find in the prefix
    cache: its longest common prefix with the sequence (input + output) of every call that could
    have run before it. Excluded are the call itself and every call whose input starts with its
    input (a later turn of the same question, which needs this call's answer first). At least
    the hit the engine reported for the agent's call."""
    inputs = [np.asarray(c.input_ids, dtype=np.int64) for c in calls]
    seqs = [np.asarray(c.input_ids + c.output_ids, dtype=np.int64) for c in calls]
    hits = []
    for i, c in enumerate(calls):
        n = len(c.input_ids)
        best = c.cached or 0
        for j, (other, seq) in enumerate(zip(calls, seqs, strict=True)):
            if j != i and other.input_ids[:n] != c.input_ids:
                best = max(best, common_prefix(inputs[i], seq))
        hits.append(min(best, n))
    return hits


@dataclass(frozen=True)
class ReplayPlan:
    """What the replay sends: each call's input with a marker right after its reachable prefix,
    its recorded length, and the distinct prefixes the untimed warm-up puts in the cache."""

    inputs: list[list[int]]
    lengths: list[int]
    hits: list[int]  # the prefix of each input the warm-up caches (reachable_hits)
    warm: list[list[int]]


def plan_replay(calls: list[Call]) -> ReplayPlan:
    """The replay of ``calls`` with each call's cache hit held to its reachable prefix.

    The token at position ``hits[i]`` of call i is replaced by a marker: a token id that no
    recorded sequence has at that position and no other call uses as a marker, drawn from the ids
    the recording holds (so it is one the model's tokenizer produces). No warm-up prefix and no
    other replayed input then agrees with call i beyond its reachable prefix, while its own
    warm-up (the tokens before the marker) gives it exactly that prefix."""
    if not calls:
        raise ValueError("nothing to replay: no model call was recorded")
    hits = reachable_hits(calls)
    seqs = [c.input_ids + c.output_ids for c in calls]
    pool = sorted({t for s in seqs for t in s}, reverse=True)
    used: set[int] = set()
    inputs = []
    for c, h in zip(calls, hits, strict=True):
        ids = list(c.input_ids)
        if h < len(ids):
            taken = {s[h] for s in seqs if len(s) > h} | used
            marker = next((t for t in pool if t not in taken), None)
            if marker is None:
                raise ValueError(f"no token id left to mark position {h} of a {len(ids)}-token call")
            used.add(marker)
            ids[h] = marker
        inputs.append(ids)
    warm = sorted({tuple(ids[:h]) for ids, h in zip(inputs, hits, strict=True) if h > 0})
    return ReplayPlan(inputs, [c.generated for c in calls], hits, [list(w) for w in warm])


def generate_payload(inputs: list[list[int]], lengths: list[int]) -> dict[str, Any]:
    """One batched SGLang ``/generate``: each input with exactly its length of new tokens
    (``ignore_eos``; 0: prefill only, which leaves the input in the prefix cache)."""
    if not inputs:
        raise ValueError("nothing to send: no input")
    return {
        "input_ids": inputs,
        "sampling_params": [{"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0} for n in lengths],
        "return_logprob": [False] * len(inputs),
    }


@dataclass
class Replay:
    wall_s: float
    tokens: int  # completion tokens the engine reported
    mismatched: int  # calls whose completion_tokens differ from the recorded length
    cached: int  # the prefix-cache hits the engine reported over the timed calls
    planned: int  # the reachable hits the warm-up gave them (sum of ReplayPlan.hits)
    off_plan: int  # calls whose reported hit is not their planned one (a full input counts as all but 1)


def replay(url: str, calls: list[Call], in_flight: int | None = None) -> Replay:
    """Warm the prefix cache with each call's reachable prefix (untimed, :func:`plan_replay`),
    then the timed replay: one batched ``/generate`` of every call, or (``in_flight``) one request
    per call with at most that many outstanding, longest first (see :func:`main`'s ``--capped``)."""

    plan = plan_replay(calls)
    with httpx.Client(timeout=None) as client:
        flush_cache(url)
        if plan.warm:
            client.post(url + "/generate", json=generate_payload(plan.warm, [0] * len(plan.warm))).raise_for_status()
        t0 = time.perf_counter()
        if in_flight is None:
            r = client.post(url + "/generate", json=generate_payload(plan.inputs, plan.lengths))
            r.raise_for_status()
            answers = r.json()
        else:
            answers = asyncio.run(_replay_capped(url, plan, in_flight))
        wall = time.perf_counter() - t0
    if not isinstance(answers, list) or len(answers) != len(calls):
        raise SystemExit(f"the replay of {len(calls)} calls got {type(answers).__name__} back")
    got = [int(a["meta_info"]["completion_tokens"]) for a in answers]
    hit = [int(a["meta_info"].get("cached_tokens") or 0) for a in answers]
    # An engine recomputes at least one token, so a wholly reachable input is a hit of all but 1.
    expected = [min(h, len(ids) - 1) for h, ids in zip(plan.hits, plan.inputs, strict=True)]
    return Replay(
        wall,
        sum(got),
        sum(g != c.generated for g, c in zip(got, calls, strict=True)),
        sum(hit),
        sum(plan.hits),
        sum(h != e for h, e in zip(hit, expected, strict=True)),
    )


async def _replay_capped(url: str, plan: ReplayPlan, in_flight: int) -> list[dict[str, Any]]:

    gate = asyncio.Semaphore(in_flight)
    n = len(plan.inputs)
    order = sorted(range(n), key=lambda i: -plan.lengths[i])  # longest first: the shortest tail
    out: list[dict[str, Any]] = [{}] * n
    async with httpx.AsyncClient(timeout=None) as client:

        async def one(i: int) -> None:
            async with gate:
                body = generate_payload([plan.inputs[i]], [plan.lengths[i]])
                r = await client.post(url + "/generate", json={k: v[0] for k, v in body.items()})
                r.raise_for_status()
                out[i] = r.json()

        await asyncio.gather(*(one(i) for i in order))
    return out


def flush_cache(url: str) -> None:
    """Empty SGLang's prefix cache so the next run starts cold."""

    r = httpx.post(url + "/flush_cache", timeout=60.0)
    if r.status_code != 200:
        raise SystemExit(f"{url}/flush_cache answered {r.status_code}: cannot start each run on a cold cache")


@dataclass
class EvalRun:
    side: str
    wall_s: float
    cpu_s: float  # this process's CPU time during the run (the agent, retrieval, scoring, writes)
    preds: dict[str, str]
    calls: list[Call]
    turns: dict[str, int] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(c.generated for c in self.calls)


def run_eval(side: str, args: argparse.Namespace, backend: Any, retriever: Any, examples: list, out: Path) -> EvalRun:
    """One ``harness eval`` of ``examples`` (a fresh run directory under ``out``) with ``side``'s schedule."""

    cfg = EvalConfig(
        method="search_r1",
        dataset=DatasetConfig(name=args.dataset, split=args.split, data_dir=args.data_dir),
        backend=BackendConfig(kind="sglang", model=args.model, url=[args.url]),
        retriever=RetrieverConfig(kind="bm25", topk=args.topk),
        agent=agent_options(args),
        out=str(Path(tempfile.mkdtemp(dir=out))),
        schedule=side,
    )
    recording = RecordingBackend(backend)
    run = build_eval(cfg, backend=recording, retriever=retriever, examples=examples)
    scores: list[Any] = []
    flush_cache(args.url)
    c0, t0 = time.process_time(), time.perf_counter()
    simple_evaluate(cfg, run=run, on_item=scores.append)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    failed = [s for s in scores if s.error]
    if failed:
        raise SystemExit(f"{side}: {len(failed)} item(s) failed; first: {failed[0].error}")

    turns = {t.example_id: t.n_turns for t in RunDir(run.run_dir).trajectories()}
    return EvalRun(side, wall, cpu, {s.id: s.prediction for s in scores}, recording.calls, turns)


def agent_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_turns": args.max_turns,
        "final_turn": True,
        "max_new_tokens": args.max_new_tokens,
        "max_total_tokens": args.max_total_tokens,
        "max_doc_tokens": args.max_doc_tokens,
        "temperature": 0.0,
        "max_concurrency": args.concurrency,
    }


def engine_limits(log_path: Path) -> str:
    """``max_running_requests`` and ``max_total_num_tokens`` as the engine's log states them."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "unknown"
    found = {k: re.findall(rf"{k}=(\d+)", text) for k in ("max_running_requests", "max_total_num_tokens")}
    return " ".join(f"{k}={v[-1]}" for k, v in found.items() if v) or "unknown"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def histogram(turns: dict[str, int]) -> str:
    counts: dict[int, int] = {}
    for k in turns.values():
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{k}:{v}" for k, v in sorted(counts.items()))


def same_work(a: list[Call], b: list[Call]) -> bool:
    """Whether two recordings are the same calls (in any order)."""
    key = lambda c: (c.input_ids, c.generated)  # noqa: E731
    return sorted(map(key, a)) == sorted(map(key, b))


def report(tag: str, runs: dict[str, list[EvalRun]], replays: list[Replay], n: int) -> None:
    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    qps = {s: med([n / r.wall_s for r in runs[s]]) for s in SIDES}
    tps = {s: med([r.tokens / r.wall_s for r in runs[s]]) for s in SIDES}
    limit = med([p.tokens / p.wall_s for p in replays])
    for s in SIDES:
        last = runs[s][-1]
        print(
            f"[{tag}] {s:6s} median questions/s={qps[s]:.3f} generated tokens/s={tps[s]:.1f} "
            f"({tps[s] / limit:.0%} of the replay limit) calls={len(last.calls)} tokens={last.tokens} "
            f"client CPU/wall={med([r.cpu_s / r.wall_s for r in runs[s]]):.2f} "
            f"turns per question (turns:questions)={histogram(last.turns)} rounds={len(runs[s])}"
        )
    print(
        f"[{tag}] replay median generated tokens/s={limit:.1f} (the limit) rounds={len(replays)} "
        f"calls whose length differed from the recording={max(p.mismatched for p in replays)}"
    )
    agent_cached = med([sum(c.cached or 0 for c in r.calls) for r in runs["async"]])
    prompt = sum(len(c.input_ids) for c in runs["async"][-1].calls)
    off = max(p.off_plan for p in replays)
    print(
        f"[{tag}] prefix cache over {prompt} input tokens: the agent (async) hit {agent_cached:.0f}, "
        f"reachable by any schedule {replays[-1].planned}, the timed replays hit {min(p.cached for p in replays)} "
        f"(min over rounds); calls whose replay hit was not their reachable prefix: {off}"
        + ("" if off == 0 else " (the replay did not do exactly the work any schedule must: see the docstring)")
    )
    print(f"[{tag}] async/sync questions/s (medians) = {qps['async'] / qps['sync']:.2f}x")
    for r, (a, b) in enumerate(zip(runs["async"], runs["sync"], strict=True)):
        agree = sum(a.preds[q] == b.preds.get(q) for q in a.preds)
        print(
            f"[{tag}] round {r + 1}: async and sync predictions identical {agree}/{n}; "
            f"same model calls: {same_work(a.calls, b.calls)}"
        )
    stable = {s: all(r.preds == runs[s][0].preds for r in runs[s]) for s in SIDES}
    print(f"[{tag}] each side's predictions identical across rounds: {stable}")
    frac = tps["async"] / limit
    print(
        f"[{tag}] goals: agent tokens/s >= 90% of the replay limit: {'met' if frac >= 0.9 else 'NOT met'} "
        f"({frac:.0%}); agent >= 1.0x sync in questions/s: "
        f"{'met' if qps['async'] >= qps['sync'] else 'NOT met'} ({qps['async'] / qps['sync']:.2f}x)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_options(p, model="runs/perf/search_model/sft/final", engine="SGLang (CPU)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request (a CPU engine is slow)")
    p.add_argument(
        "--omp-bind",
        default=None,
        help="--launch: SGLANG_CPU_OMP_THREADS_BIND for the engine (e.g. 0: one OpenMP thread on core 0; "
        "by default SGLang takes every core, whose OpenMP barriers stall on a CPU shared with other jobs)",
    )
    p.add_argument("--kv-tokens", type=int, default=65536, help="--launch: SGLang's --max-total-tokens (KV cache)")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=detect_device(),
        help="--launch: where SGLang runs (default: cuda when nvidia-smi is on PATH, else cpu)",
    )
    p.add_argument(
        "--engine-args",
        default="",
        help="--launch: more SGLang server arguments, as one string; give it with '=' "
        "(--engine-args=--enable-mixed-chunk: a prefill that arrives while others decode runs in their decode step)",
    )
    p.add_argument("--dataset", default="demo")
    p.add_argument("--split", default="test")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--workload", choices=("uniform", "mixed"), default="uniform")
    p.add_argument("--pool", type=int, default=None, help="mixed: questions of the selection pass (default 4 x --n)")
    p.add_argument("--n", type=int, default=32, help="questions")
    p.add_argument("--concurrency", type=int, default=16, help="questions in flight (sync: the wave size)")
    p.add_argument("--repeats", type=int, default=2, help="rounds (2: A B B A)")
    p.add_argument(
        "--capped",
        action="store_true",
        help="also replay with at most --concurrency calls in flight (as many as the agent can have), longest "
        "first: what the engine gives at the agent's concurrency (an estimate, not a bound: the order matters)",
    )
    add_agent_options(p)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    print(f"load average at start: {loadavg()}", flush=True)
    pool_n = (args.pool or 4 * args.n) if args.workload == "mixed" else args.n
    pool = load_examples(args.dataset, args.split, data_dir=args.data_dir, limit=pool_n)
    retriever = dataset_retriever(RetrieverConfig(kind="bm25", topk=args.topk), args.dataset, args.split, args.data_dir)
    retriever.search(["warm up"], args.topk)  # numba compiles on first use
    with contextlib.ExitStack() as stack:
        limits = "unknown"
        if args.launch:
            logs = stack.enter_context(tempfile.TemporaryDirectory())
            extra = ["--dtype", args.dtype, "--max-total-tokens", str(args.kv_tokens), *shlex.split(args.engine_args)]
            t0 = time.perf_counter()
            env = {"SGLANG_CPU_OMP_THREADS_BIND": args.omp_bind} if args.omp_bind else {}
            ecfg = EngineConfig(device=args.device, args=extra, env=env)
            proc = stack.enter_context(launched("sglang", args.model, ecfg, logs))
            print(f"sglang: started in {time.perf_counter() - t0:.0f} s at {proc.url}", flush=True)
            args.url, limits = proc.url, engine_limits(proc.log_path)
        if not args.url:
            raise SystemExit("give --url URL (a running SGLang) or --launch")
        backend = SGLangBackend(args.url, model=args.model, max_concurrency=args.concurrency, timeout=args.timeout)
        stack.callback(backend.close)
        out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="eval_vs_limit-")))
        examples = pool[: args.n]
        if args.workload == "mixed":
            flush_cache(args.url)
            examples = select_mixed("search_r1", backend, retriever, pool, args)
        n = len(examples)
        tag = args.workload
        print(
            f"engine: SGLang {args.device if args.launch else '(given --url)'} {args.dtype} model={args.model} "
            f"{limits} omp_bind={args.omp_bind} "
            f"engine_args={args.engine_args!r}; workload={tag} "
            f"{args.dataset}/{args.split} questions={n} concurrency={args.concurrency} max_turns={args.max_turns} "
            f"max_new_tokens={args.max_new_tokens} greedy method=search_r1 retriever=bm25 top{args.topk}",
            flush=True,
        )
        # One untimed question through the whole path first (weights, kernels, the retriever); the
        # two schedules run the same code, so one warm-up serves both.
        run_eval("async", args, backend, retriever, examples[:1], out)
        runs: dict[str, list[EvalRun]] = {s: [] for s in SIDES}
        replays: list[Replay] = []
        capped: list[Replay] = []
        for r in range(args.repeats):
            order = ["async", "sync", "replay"] if r % 2 == 0 else ["replay", "sync", "async"]
            for what in order:
                if what == "replay":
                    if not runs["async"]:
                        continue  # nothing recorded yet (cannot happen with this order)
                    for cap in (None, args.concurrency) if args.capped else (None,):
                        rep = replay(args.url, runs["async"][-1].calls, cap)
                        (replays if cap is None else capped).append(rep)
                        print(
                            f"[{tag}] round {r + 1} replay{'' if cap is None else f' capped at {cap}'} "
                            f"wall_s={rep.wall_s:.1f} tokens={rep.tokens} tokens/s={rep.tokens / rep.wall_s:.1f} "
                            f"cached={rep.cached} (reachable {rep.planned}, off plan {rep.off_plan}) load={loadavg()}",
                            flush=True,
                        )
                    continue
                res = run_eval(what, args, backend, retriever, examples, out)
                runs[what].append(res)
                print(
                    f"[{tag}] round {r + 1} {what:6s} wall_s={res.wall_s:.1f} questions/s={n / res.wall_s:.3f} "
                    f"tokens={res.tokens} tokens/s={res.tokens / res.wall_s:.1f} calls={len(res.calls)} "
                    f"client_cpu_s={res.cpu_s:.1f} load={loadavg()}",
                    flush=True,
                )
        report(tag, runs, replays, n)
        if capped:
            cap = statistics.median(p.tokens / p.wall_s for p in capped)
            agent = statistics.median(x.tokens / x.wall_s for x in runs["async"])
            print(
                f"[{tag}] replay capped at {args.concurrency} calls in flight (longest first): median generated "
                f"tokens/s={cap:.1f}; the agent's tokens/s is {agent / cap:.0%} of it"
            )
    print(f"load average at end: {loadavg()}", flush=True)


if __name__ == "__main__":
    main()
