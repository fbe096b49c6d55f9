"""FlashRAG's own turn-synchronous reasoning pipelines against the harness agent in the same
dialect, on one backend, model, retriever and question set, greedy (a benchmark, not a test).

Pairs (``--pairs``):

- ``search_r1``: FlashRAG's ``SearchR1Pipeline`` vs the agent's ``search_r1`` dialect;
- ``r1_searcher``: FlashRAG's R1-Searcher ``ReasoningPipeline`` vs the agent's ``r1_searcher`` dialect.

FlashRAG's side gets the backend through the FlashRAG generator adapter
(``pipelines.flashrag_compat.FlashRAGGenerator``) and the retriever through ``FlashRAGRetriever``;
it generates every live item's turn in one call, so the slowest item gates each turn. The agent
runs every question concurrently, each at its own pace (continuous batching on ``hf``; the
engine's on SGLang/vLLM). Both get the same per-turn token budget and the same number of
generations (FlashRAG's ``max_retrieval_num`` is the agent's turns, its final turn included).

    PYTHONPATH=. .venv/bin/python scripts/perf/vs_flashrag.py --n 8 --repeats 2
    ... --backend sglang --launch                   # start SGLang from its venv, stop it after
    ... --backend sglang --url http://127.0.0.1:30000   # a server that is already running
    ... --backend openai --url http://127.0.0.1:8000    # vLLM's OpenAI server

Fairness: each side gets its own warm-up run before the timed rounds; the rounds go FlashRAG,
harness, harness, FlashRAG (A B B A, ``--repeats 2``; more repeats continue the pattern) and
medians are reported; before every run (warm-ups included) the engine's prefix cache is emptied
(SGLang ``POST /flush_cache``; vLLM ``POST /reset_prefix_cache``, which needs
``VLLM_SERVER_DEV_MODE=1``; the in-process ``hf`` backend keeps no cache between requests), so no
side runs on a cache the other warmed. Agreement is checked on EVERY round (FlashRAG's run of
round r against the agent's), and counted as a like-for-like figure only with
``--flashrag-prompt agent``, where both sides start from the same prompt text.

Workloads (``--workload``): ``uniform``: the first ``--n`` questions of ``--dataset/--split`` as
they come (on the demo every question takes about three turns); ``mixed``: first a selection pass
of the agent over ``--pool`` questions (untimed, before the warm-ups), then ``--n`` questions
drawn evenly across the number of searches the model made on them (0 to ``--max-turns``), so the
timed set mixes questions answered without a search with questions that search four times. The
turns-per-question distribution of each side is printed.

Beside questions/s each run prints generated tokens/s, turns and searches per question; then
how many predictions agree and, for each disagreement, the question and where the two runs first
part: the first turn (the prompts differ), a later turn (observation format or turn handling
differ) or only the prediction (answer extraction differs). The known protocol differences of
FlashRAG's ports are printed from ``pipelines.dialects.FLASHRAG_DIFFERENCES``. FlashRAG stays a
peer row: its agreement is reported, never required; the like-for-like turn-synchronous baseline,
same protocol on both sides, is the agent's own ``--schedule sync`` (``eval_vs_limit.py``).

The searching model for this comparison (SFT in the search_r1 dialect): ``scripts/perf/
search_model.py`` builds and caches one and prints its directory, to pass as ``--model``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import io
import logging
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.build import dataset_retriever
from benchmarks.datasets import load_examples
from benchmarks.metrics import normalize_answer
from harness.backends.base import SamplingParams
from harness.backends.hf import HFBackend
from harness.backends.openai import OpenAIBackend
from harness.backends.sglang import SGLangBackend
from harness.engines import EngineConfig, launched
from harness.eval_config import RetrieverConfig
from harness.types import Example
from pipelines.dialects import FLASHRAG_DIFFERENCES, get_dialect
from pipelines.flashrag_compat import (
    FlashRAGChatPrompt,
    FlashRAGGenerator,
    FlashRAGRetriever,
    safe_config,
    to_flashrag_dataset,
)
from pipelines.methods import build_method
from scripts.perf.engines import add_agent_options, add_engine_options

NOT_LIKE_FOR_LIKE = (
    "NOT LIKE-FOR-LIKE: the two sides run different protocol ports of the same dialect (FlashRAG's "
    "prompts, observation formats and parsing vs the originals the agent follows; listed below), so "
    "they generate different text and different token counts; with --flashrag-prompt own FlashRAG's "
    "prompts go through the tokenizer's chat template (as its PromptTemplate does for chat models), "
    "with --flashrag-prompt agent FlashRAG gets the agent's prompt string (no BOS added); the agent caps "
    "each document at --max-doc-tokens, FlashRAG does not."
)

PAIRS = ("search_r1", "r1_searcher")


@dataclass
class RunResult:
    """One timed run of one side."""

    wall_s: float
    preds: dict[str, str]
    turns: dict[str, list[str]]  # question id -> its generated texts, stripped, in order
    generated_tokens: int
    searches: int
    extra: dict[str, Any] = field(default_factory=dict)


class _CountingGenerator(FlashRAGGenerator):
    """The adapter, with the pipeline's per-turn budget and greedy decoding, that also records
    each call's outputs and token counts (FlashRAG's pipelines only see the texts)."""

    def __init__(self, backend: Any, max_new_tokens: int) -> None:
        super().__init__(backend, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
        self.calls: list[tuple[list[str], list[str]]] = []
        self.tokens = 0

    def generate(self, input_list: Any, return_scores: bool = False, **kw: Any) -> Any:
        prompts = [input_list] if isinstance(input_list, str) else list(input_list)
        # FlashRAG passes only ``stop``: the budget and greedy decoding come from our defaults.
        params = self.sampling({"stop": kw.get("stop")})
        ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        completions = self._run(self.backend.agenerate_many(ids, params))
        texts = [c.text for c in completions]
        self.tokens += sum(len(c.token_ids) for c in completions)
        self.calls.append((prompts, texts))
        return texts


class _AgentPrompt:
    """FlashRAG's prompt-template interface giving the agent's own prompt string for the dialect
    (``--flashrag-prompt agent``), so the two loops start from the same text."""

    def __init__(self, tokenizer: Any, dialect: str) -> None:
        self.tokenizer, self.dialect = tokenizer, get_dialect(dialect)

    def get_string(self, question: str, **_: Any) -> str:
        return self.dialect.render(question, self.tokenizer, chat=True)


def run_flashrag(pair: str, backend: Any, retriever: Any, examples: list[Example], args: argparse.Namespace):
    # deferred: flashrag imports torch and its own stack (seconds)
    from flashrag.pipeline import ReasoningPipeline, SearchR1Pipeline

    cls = SearchR1Pipeline if pair == "search_r1" else ReasoningPipeline
    # The agent's generations: max_turns search turns (+ one final turn for Search-R1).
    generations = args.max_turns + (1 if pair == "search_r1" else 0)
    generator = _CountingGenerator(backend, args.max_new_tokens)
    if args.flashrag_prompt == "agent":
        template: Any = _AgentPrompt(backend.tokenizer, pair)
    else:
        template = FlashRAGChatPrompt(backend.tokenizer, cls.user_prompt)
    config = safe_config()
    pipe = cls(
        config,
        prompt_template=template,
        max_retrieval_num=generations,
        retriever=FlashRAGRetriever(retriever, args.topk),
        generator=generator,
    )
    dataset = to_flashrag_dataset(examples, config)
    initial = {template.get_string(question=e.question): e.id for e in examples}
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints every turn
        out = pipe.run(dataset, do_eval=False)
    wall = time.perf_counter() - t0
    turns: dict[str, list[str]] = {e.id: [] for e in examples}
    for prompts, texts in generator.calls:
        for prompt, text in zip(prompts, texts, strict=True):
            qid = next(i for p, i in initial.items() if prompt.startswith(p))
            turns[qid].append(text.strip())
    preds = {str(item.id): str(item.pred) for item in out}
    searches = sum(int(item.retrieved_times) for item in out)
    reasons: dict[str, int] = {}
    for item in out:
        reasons[item.finish_reason] = reasons.get(item.finish_reason, 0) + 1
    return RunResult(wall, preds, turns, generator.tokens, searches, {"finish": reasons})


def run_harness(pair: str, backend: Any, retriever: Any, examples: list[Example], args: argparse.Namespace):
    options = {
        "max_turns": args.max_turns,
        "final_turn": pair == "search_r1",
        "max_new_tokens": args.max_new_tokens,
        "max_total_tokens": args.max_total_tokens,
        "max_doc_tokens": args.max_doc_tokens,
        "topk": args.topk,
        "temperature": 0.0,
        "max_concurrency": len(examples),
    }
    agent = build_method(pair, backend, retriever, options)
    t0 = time.perf_counter()
    trajs = agent.run_examples(examples)
    wall = time.perf_counter() - t0
    turns = {t.example_id: [s.text.strip() for s in t.segments if s.role == "model"] for t in trajs}
    reasons: dict[str, int] = {}
    for t in trajs:
        reasons[t.finish_reason] = reasons.get(t.finish_reason, 0) + 1
    errors = [t.error for t in trajs if t.error]
    if errors:
        raise SystemExit(f"harness agent failed on {len(errors)} item(s); first: {errors[0]}")
    return RunResult(
        wall,
        {t.example_id: t.prediction for t in trajs},
        turns,
        sum(t.generated_tokens for t in trajs),
        sum(len(t.searches) for t in trajs),
        {"finish": reasons},
    )


def where_they_part(a: RunResult, b: RunResult, qid: str) -> str:
    """Where FlashRAG's run (``a``) and the agent's (``b``) first differ for one question."""
    ta, tb = a.turns.get(qid, []), b.turns.get(qid, [])
    if not ta or not tb or ta[0] != tb[0]:
        return "first turn (prompt text differs)"
    for i, (x, y) in enumerate(zip(ta, tb, strict=False)):
        if x != y:
            return f"turn {i + 1} (observation format / turn handling differ)"
    if len(ta) != len(tb):
        return "number of turns (stop/parse rules or turn limit differ)"
    return "same generations, different prediction (answer extraction / no-answer value differ)"


def agreement(a: RunResult, b: RunResult) -> tuple[int, list[tuple[str, str]]]:
    """How many predictions agree (SQuAD-normalised), and each disagreement with where it starts."""
    same, why = 0, []
    for qid, pa in a.preds.items():
        if normalize_answer(pa) == normalize_answer(b.preds.get(qid, "")):
            same += 1
        else:
            why.append((qid, where_they_part(a, b, qid)))
    return same, why


def versions(args: argparse.Namespace, backend: Any) -> str:
    def v(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "absent"

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    return (
        f"pinned: flashrag_dev={v('flashrag_dev')} torch={v('torch')} transformers={v('transformers')} "
        f"harness@{commit or '?'} backend={args.backend}({type(backend).__name__}) model={args.model} "
        f"questions={args.n} max_turns={args.max_turns} max_new_tokens={args.max_new_tokens} topk={args.topk} "
        f"retriever=bm25({args.dataset}/{args.split} corpus) workload={args.workload} "
        f"flashrag_prompt={args.flashrag_prompt} batch_window_ms={args.batch_window_ms} greedy"
    )


def make_backend(args: argparse.Namespace, stack: contextlib.ExitStack) -> Any:
    if args.backend == "hf":
        return HFBackend(model=args.model, dtype=args.dtype, max_batch_size=args.n, threads=args.threads)
    url = args.url
    if args.launch:
        engine = "sglang" if args.backend == "sglang" else "vllm"
        extra = ["--dtype", args.dtype] + (["--max-total-tokens", "65536"] if engine == "sglang" else [])
        logs = stack.enter_context(tempfile.TemporaryDirectory())
        t0 = time.perf_counter()
        proc = stack.enter_context(launched(engine, args.model, EngineConfig(device="cpu", args=extra), log_dir=logs))
        print(f"{engine}: started in {time.perf_counter() - t0:.0f} s at {proc.url}", flush=True)
        url = proc.url
    if not url:
        raise SystemExit(f"--backend {args.backend} needs --url URL or --launch")
    if args.backend == "sglang":
        return SGLangBackend(url, model=args.model, max_concurrency=args.n, batch_window_ms=args.batch_window_ms)

    return OpenAIBackend(url, model=args.model, max_concurrency=args.n)


def flush_cache(backend: Any, args: argparse.Namespace) -> None:
    """Empty the engine's prefix cache so the next run starts cold (see module docstring)."""
    if args.backend == "hf":
        return  # in process: no KV is kept between requests
    path = "/flush_cache" if args.backend == "sglang" else "/reset_prefix_cache"
    for url in backend.sync_urls() if hasattr(backend, "sync_urls") else backend.urls:
        base = url[: -len("/v1")] if url.endswith("/v1") else url
        r = httpx.post(base + path, timeout=60.0)
        if r.status_code != 200:
            raise SystemExit(
                f"{base}{path} answered {r.status_code}: cannot start each run on a cold cache"
                + (" (vLLM needs VLLM_SERVER_DEV_MODE=1 for this route)" if args.backend == "openai" else "")
            )


def turn_histogram(r: RunResult) -> str:
    counts: dict[int, int] = {}
    for texts in r.turns.values():
        counts[len(texts)] = counts.get(len(texts), 0) + 1
    return ", ".join(f"{k}:{v}" for k, v in sorted(counts.items()))


def select_mixed(
    pair: str, backend: Any, retriever: Any, pool: list[Example], args: argparse.Namespace
) -> list[Example]:
    """``--n`` questions spread evenly over the number of searches the agent made on them (0 to
    ``--max-turns``), from one untimed agent pass over ``pool``."""
    probe = run_harness(pair, backend, retriever, pool, args)
    by_searches: dict[int, list[Example]] = {}
    for ex in pool:
        k = max(0, len(probe.turns.get(ex.id, [])) - 1)  # searches = turns - 1 (the last answers)
        by_searches.setdefault(min(k, args.max_turns), []).append(ex)
    print(
        f"[{pair}] selection pass over {len(pool)} questions: searches per question "
        + ", ".join(f"{k}:{len(v)}" for k, v in sorted(by_searches.items())),
        flush=True,
    )
    if len(by_searches) < 2:
        print(f"[{pair}] WARNING: the model made the same number of searches on every question: not mixed", flush=True)
    chosen: list[Example] = []
    buckets = [list(v) for _, v in sorted(by_searches.items())]
    while len(chosen) < args.n and any(buckets):
        for b in buckets:  # round-robin over the search counts
            if b and len(chosen) < args.n:
                chosen.append(b.pop(0))
    return chosen


def report(pair: str, runs: dict[str, list[RunResult]], n: int, like_for_like: bool) -> None:
    med = {}
    for side, rs in runs.items():
        qps = statistics.median(n / r.wall_s for r in rs)
        tps = statistics.median(r.generated_tokens / r.wall_s for r in rs)
        last = rs[-1]
        turns = sum(len(t) for t in last.turns.values()) / n
        med[side] = qps
        print(
            f"[{pair}] {side:8s} median questions/s={qps:.3f} generated tokens/s={tps:.1f} "
            f"turns/question={turns:.2f} searches/question={last.searches / n:.2f} "
            f"turns per question (count:questions)={turn_histogram(last)} "
            f"finish={last.extra.get('finish')} runs={len(rs)}"
        )
    print(f"[{pair}] ratio harness/flashrag questions/s (medians) = {med['harness'] / med['flashrag']:.2f}x")
    counted = "" if like_for_like else " (NOT counted as agreement: --flashrag-prompt own runs different protocols)"
    for r, (fl, ha) in enumerate(zip(runs["flashrag"], runs["harness"], strict=True)):
        same, why = agreement(fl, ha)
        print(f"[{pair}] round {r + 1}: predictions agree {same}/{n}{counted}")
        for qid, where in why:
            print(
                f"[{pair}]   {qid}: flashrag={fl.preds.get(qid)!r} harness={ha.preds.get(qid)!r}; "
                f"they first part at the {where}"
            )
    stable = all(r.preds == rs[0].preds for rs in runs.values() for r in rs)
    print(f"[{pair}] each side's predictions identical across rounds: {stable}")
    print(f"[{pair}] FlashRAG's port differs from the original protocol the agent runs:")
    for d in FLASHRAG_DIFFERENCES.get(pair, ()):
        print(f"[{pair}]   - {d}")
    print(
        f"[{pair}] FlashRAG is a peer row: its agreement is reported, not required (the protocols differ, "
        "so its questions/s does not compare schedules); the like-for-like turn-synchronous baseline is "
        "the agent's own --schedule sync (scripts/perf/eval_vs_limit.py)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", default=",".join(PAIRS), help=f"from {','.join(PAIRS)}")
    p.add_argument("--backend", choices=("hf", "sglang", "openai"), default="hf")
    add_engine_options(p, model="smollm2-135m-instruct", engine="SGLang (--backend sglang) or vLLM/OpenAI (openai)")
    p.add_argument("--threads", type=int, default=1, help="hf: torch threads (1 is faster on a shared 2-core VM)")
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=0.0,
        help="sglang: the agent's requests ready within this window go out as one batched /generate (0: off)",
    )
    p.add_argument(
        "--flashrag-prompt",
        choices=("own", "agent"),
        default="own",
        help="FlashRAG's side: its pipeline's own prompt, or the agent's prompt string for the dialect",
    )
    p.add_argument("--dataset", default="demo")
    p.add_argument("--split", default="test")
    p.add_argument("--data-dir", default=None, help="where the benchmark data lives (default: the harness's)")
    p.add_argument("--workload", choices=("uniform", "mixed"), default="uniform")
    p.add_argument("--pool", type=int, default=None, help="mixed: questions of the selection pass (default 4 x --n)")
    p.add_argument("--n", type=int, default=8, help="questions")
    p.add_argument("--repeats", type=int, default=2, help="rounds per pair (2: A B B A)")
    add_agent_options(p)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    pairs = [x.strip() for x in args.pairs.split(",") if x.strip()]
    for x in pairs:
        if x not in PAIRS:
            raise SystemExit(f"--pairs: unknown {x!r}; choose from {', '.join(PAIRS)}")

    print(NOT_LIKE_FOR_LIKE, flush=True)
    pool_n = (args.pool or 4 * args.n) if args.workload == "mixed" else args.n
    pool = load_examples(args.dataset, args.split, data_dir=args.data_dir, limit=pool_n)
    rcfg = RetrieverConfig(kind="bm25", topk=args.topk)
    retriever = dataset_retriever(rcfg, args.dataset, args.split, args.data_dir)
    retriever.search(["warm up"], args.topk)  # numba compiles on first use; keep it out of the timing
    with contextlib.ExitStack() as stack:
        backend = make_backend(args, stack)
        args.n = min(args.n, len(pool))
        print(versions(args, backend), flush=True)
        for pair in pairs:
            examples = pool[: args.n]
            if args.workload == "mixed":
                flush_cache(backend, args)
                examples = select_mixed(pair, backend, retriever, pool, args)
            n = len(examples)
            runs: dict[str, list[RunResult]] = {"flashrag": [], "harness": []}
            sides = (("flashrag", run_flashrag), ("harness", run_harness))
            for _side, fn in sides:  # each side its own warm-up (weights, kernels, its code paths)
                flush_cache(backend, args)
                fn(pair, backend, retriever, examples[:1], args)
            for r in range(args.repeats):  # A B, then B A: a load trend on the machine hits both sides alike
                for side, fn in sides if r % 2 == 0 else sides[::-1]:
                    flush_cache(backend, args)
                    res = fn(pair, backend, retriever, examples, args)
                    runs[side].append(res)
                    print(
                        f"[{pair}] round {r + 1} {side:8s} wall_s={res.wall_s:.1f} "
                        f"questions/s={n / res.wall_s:.3f} tokens={res.generated_tokens} "
                        f"turns per question={turn_histogram(res)}",
                        flush=True,
                    )
            report(pair, runs, n, args.flashrag_prompt == "agent")
        backend.close()


if __name__ == "__main__":
    main()
