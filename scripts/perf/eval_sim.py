"""Evaluation throughput at cluster scale, by simulation: the REAL agent loop against a stand-in
engine with the cost model of a continuous-batching GPU server, on a simulated clock.

What is real: the agent (``pipelines.search_agent`` built by ``build_method``: prompts, the
token-level loop, stop handling, searches, the bounded-concurrency scheduler), its retriever call
(an in-memory retriever), and the turn structure of the questions: how many turns each takes
and how many tokens each turn generates and each observation inserts. Two sources (``--turns``):

- ``smollm2``: real trajectories of this harness (``trajectories.jsonl`` of run directories given
  with ``--runs``; the demo's SmolLM2-135M runs: short turns, ~44 generated tokens);
- ``r1searcher-7b``: a released 7B search agent's own evaluation outputs: R1-Searcher's
  Qwen-2.5-7B-Base RL model on its 500-question HotpotQA dev subset (RUCAIBox/R1-Searcher,
  ``data/eval_results/hotpotqa_qwen.jsonl``, which keeps every generated turn and the inserted
  documents), cut into turns and counted in Qwen2.5 tokens: ``eval_sim_r1searcher7b_hotpotqa.json``
  beside this script, whose header names the commit and says how it was derived (1 to 5 turns,
  ~99 generated tokens a turn, ~576 tokens of documents after each search).

What is a MODEL, not a measurement: the engine. ``SimEngine`` runs continuous batching on an
event clock (no sleeping: a run of thousands of questions takes seconds of wall time):

- each engine step takes ``a + b·B + c·ΣC + p·P`` seconds, where B is the number of running
  sequences, ΣC their total context in tokens, P the prefill tokens admitted in the step;
- a request joins at the next step when it fits (``--max-running`` sequences, ``--kv-tokens`` of
  KV cache; its prefill is limited to ``--prefill-chunk`` tokens per step), produces its first
  token in the step that prefills it and one token per step after;
- the prefix of a follow-up turn is assumed cached (SGLang's radix cache; vLLM's prefix cache), so
  only the new tokens (the last turn's output and the observation) are prefilled, on both sides;
- a search takes ``--retrieval-s`` of simulated time (a batched retrieval server).

The constants (defaults) are derived for a 7B model (Qwen2.5-7B: 7.6e9 parameters, 28 layers,
4 KV heads of 128) in bf16 on one H100 SXM (3.35 TB/s HBM3, 989 TFLOPS dense bf16, NVIDIA's
data sheet): ``a`` = 7 ms (15 GB of weights read per step, 4.5 ms at full bandwidth, plus
scheduling/launch overhead); ``b`` = 25 µs per sequence (2 x 7.6e9 FLOPs per token at ~60% of
peak); ``c`` = 20 ns per context token (57 KB of KV per token at ~85% of the bandwidth); ``p`` =
25 µs per prefill token; 850,000 KV tokens (80 GB x 0.88 less weights and activations). As a
check against a published SGLang figure: sgl-project/sglang issue #1639 (a maintainer's run,
2,000 ShareGPT prompts, Llama-3-8B-class model on H100, 2024-10) reports 10,897 output tok/s and
24,023 total tok/s with ~227 input and ~188 output tokens per request. This model at batch 256
and 400 tokens of context gives 16.6k output tok/s while decoding, and with the prefill of that
mix (about a third of the time at 25 µs/token) about 11k output tok/s: the same order. It is a
model: use it to compare schedules, not to predict a GPU's seconds. Every constant is an option.

Two schedules over the same agent code:

- ``agent``: the agent's own scheduling: each question sends its next turn as soon as its own
  previous turn and search are done; ``--concurrency`` questions in flight, a new one starts as
  one finishes.
- ``sync`` (turn-synchronous, what FlashRAG's reasoning pipelines do: one generate call per turn
  for the whole batch): questions run in waves of ``--concurrency``; turn k of a wave is released
  to the engine only when every question of the wave has finished turn k-1 (plus one retrieval
  for all), and the next wave starts when the wave is done. The barrier is applied by the
  stand-in engine; the agent code is the same.

Workloads: ``uniform``: each question replays one real trajectory's turns as they are (the demo's
research+sft run: 3 turns each; the 7B run: 1 to 5). ``mixed``: each question makes 0 to 4
searches (uniformly, mean 2, as in the issue's "0 to 4 searches"), each turn's generated and
observation lengths drawn from the real trajectories' turns at that position, search and answer
turns alike (the last position for later turns; the answer turn's observation set to 0). So a
search turn past the positions where real searches happen gets an answer turn's length and
inserts nothing (SmolLM2: every 3rd and 4th search; the 7B: most 3rd and 4th searches):
``uniform`` over the 7B's real trajectories has no such artefact. The question count defaults to
HotpotQA dev's (``--data-dir``), else 4 x the largest concurrency.

The engine's capacity for the same work, two ways:

- a bound (``least_seconds``): summed over a run, ``b·B`` is b per generated token, ``c·ΣC``
  depends only on each turn's own context, and ``p·P`` only on the prefill tokens, all the same
  for any schedule of this work (every turn with the context and prefix-cache hit it has in the
  agent's run); what a schedule changes is the number of steps (``a`` each) and the idle time.
  No schedule takes fewer steps than the longest turn generates tokens, than the generated
  tokens over ``--max-running``, or than the KV a turn holds times its steps, summed, over
  ``--kv-tokens``; nor less than no idle time. That least time gives an upper bound on
  generated tokens/s: a schedule's "capacity used" is its tokens/s over it.
- a replay (``saturated``): every turn of every question sent to the engine at once, turn order,
  searches and retrieval ignored, longest generation first, packed as the engine packs any
  request (first come first served within ``--max-running``, ``--kv-tokens`` and the prefill
  chunk): how close the engine itself comes to the bound with no turn dependencies.

    PYTHONPATH=. .venv/bin/python scripts/perf/eval_sim.py \\
        --runs runs/demo/eval/research+sft-demo-test --data-dir ../shared/data

prints, per turn source, workload and concurrency, questions/s, generated tokens/s, capacity
used and the engine's idle fraction for both schedules (medians are not needed: the simulation
is deterministic for a seed).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import heapq
import json
import logging
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.backends.base import BackendBase, Completion, SamplingParams
from harness.retrieval.memory import InMemoryRetriever
from harness.textfiles import read_jsonl
from harness.types import Doc, Example
from pipelines.methods import build_method

logger = logging.getLogger("eval_sim")

DEFAULT_RUNS = ("runs/demo/eval/research+sft-demo-test", "tests/fixtures/runs/research-demo-test")
R1SEARCHER_7B = Path(__file__).resolve().with_name("eval_sim_r1searcher7b_hotpotqa.json")
TURN_SOURCES = ("smollm2", "r1searcher-7b")


# ---- the workload --------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """One real trajectory's token counts: the prompt, then per turn (generated, observation after)."""

    prompt: int
    turns: tuple[tuple[int, int], ...]


def read_shapes(run_dirs: list[Path]) -> list[Shape]:
    """The turn structure of every trajectory in the run directories (errors and empty ones skipped)."""
    shapes = []
    for d in run_dirs:
        path = d / "trajectories.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{d}: no trajectories.jsonl (give run directories of `harness eval`)")
        for _, t in read_jsonl(path, tolerant=True):
            if t.get("error"):
                continue
            segs = t["segments"]
            prompt = sum(len(s["token_ids"]) for s in segs if s["role"] == "prompt")
            turns: list[list[int]] = []
            for s in segs:
                if s["role"] == "model":
                    turns.append([len(s["token_ids"]), 0])
                elif s["role"] == "observation" and turns:
                    turns[-1][1] += len(s["token_ids"])
            if turns:
                shapes.append(Shape(prompt, tuple((g, o) for g, o in turns)))
    if not shapes:
        raise ValueError(f"no usable trajectories in {', '.join(map(str, run_dirs))}")
    return shapes


def read_turn_file(path: Path) -> list[Shape]:
    """The shapes of a turn file like ``eval_sim_r1searcher7b_hotpotqa.json``: its ``questions``
    are ``[prompt tokens, [[generated, observation after], ...]]``, the last turn observing nothing."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        questions = data["questions"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a turn file with a 'questions' list ({e})") from e
    shapes = []
    for i, q in enumerate(questions):
        try:
            prompt, turns = q
            turns = tuple((int(g), int(o)) for g, o in turns)
            ok = int(prompt) > 0 and turns and all(g > 0 and o >= 0 for g, o in turns) and turns[-1][1] == 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                f"{path}: question {i} is {q!r}; want [prompt > 0, [[generated > 0, observation >= 0], ...]] "
                "with an answer turn (observation 0) last"
            )
        shapes.append(Shape(int(prompt), turns))
    if not shapes:
        raise ValueError(f"{path}: no questions")
    return shapes


def plan(shapes: list[Shape], n: int, workload: str, rng: random.Random) -> list[Shape]:
    """``n`` questions' shapes: real ones replayed (uniform) or 0-4 searches from real turns (mixed)."""
    if workload == "uniform":
        return [rng.choice(shapes) for _ in range(n)]
    by_pos: dict[int, list[tuple[int, int]]] = {}
    for s in shapes:
        for i, turn in enumerate(s.turns):
            by_pos.setdefault(i, []).append(turn)
    last = max(by_pos)
    out = []
    for _ in range(n):
        searches = rng.randint(0, 4)
        turns = [rng.choice(by_pos[min(i, last)]) for i in range(searches + 1)]
        turns[-1] = (turns[-1][0], 0)  # the answer turn inserts nothing after it
        out.append(Shape(rng.choice(shapes).prompt, tuple(turns)))
    return out


# ---- the stand-in engine ---------------------------------------------------------------------
@dataclass(frozen=True)
class CostModel:
    a: float = 0.007  # s per step
    b: float = 25e-6  # s per running sequence per step
    c: float = 20e-9  # s per context token per step
    p: float = 25e-6  # s per prefill token
    max_running: int = 2048
    kv_tokens: int = 850_000
    prefill_chunk: int = 16_384  # prefill tokens admitted per step (SGLang's chunked prefill)
    retrieval_s: float = 0.05


@dataclass
class _Item:
    shape: Shape
    index: int  # start order
    turn: int = 0
    context: int = 0  # real tokens so far (prompt, outputs, observations)
    done_at: float = 0.0  # when its last turn finished
    ended: bool = False


@dataclass(order=True)
class _Seq:
    finish_step: int
    order: int
    item: _Item = field(compare=False)
    future: asyncio.Future | None = field(compare=False)  # None in the saturated replay (no agent)
    context: int = field(compare=False, default=0)
    gen: int = field(compare=False, default=0)


class SimEngine(BackendBase):
    """A backend whose requests are served by a simulated continuous-batching engine (module
    docstring). Completions carry a search or an answer in the search_r1 dialect so the agent
    takes exactly the planned turns; token counts for the cost model are the planned real ones."""

    name = "sim"

    def __init__(self, cost: CostModel, schedule: str, concurrency: int, prompts: dict[tuple[int, ...], Shape]):
        self.cost, self.schedule, self.concurrency = cost, schedule, concurrency
        self.tokenizer = _Bytes()
        self.max_context = 1 << 20
        self.prompts = prompts
        self.prompt_lengths = sorted({len(k) for k in prompts})
        self.items: dict[tuple[int, ...], _Item] = {}
        self._ids: dict[str, list[int]] = {}
        self.now = 0.0
        self.busy = 0.0  # simulated seconds with at least one sequence running
        self.steps = 0
        self.batch_sum = 0
        # heap of (ready at, order, item, future)
        self.arrived: list[tuple[float, int, _Item, asyncio.Future | None]] = []
        self.running: list[_Seq] = []  # heap by finish step
        self.ctx_total = 0
        self.kv_used = 0
        self.order = 0
        self.expect = 0  # agent reactions still to come (a next request or an item's end)
        self.finished = 0
        self.started = 0
        self.total = 0
        # turn-synchronous bookkeeping: per wave, items not yet done with the current turn
        self.wave_turn: dict[int, int] = {}
        self.held: list[tuple[int, _Item, asyncio.Future]] = []

    # -- the backend face (what the agent calls) --
    async def agenerate(self, input_ids: list[int], params: SamplingParams) -> Completion:
        item = self._item(input_ids)
        future = asyncio.get_running_loop().create_future()
        if item.turn == 0:
            self.started += 1
        else:
            self.expect -= 1
        ready = self.now if item.turn == 0 else item.done_at + self.cost.retrieval_s
        if self.schedule == "sync":
            self.held.append((item.turn, item, future))
        else:
            heapq.heappush(self.arrived, (ready, self._next(), item, future))
        final = item.turn == len(item.shape.turns) - 1
        await future
        text = "<answer> x </answer>" if final else f"<search> q{item.turn} </search>"
        if text not in self._ids:  # a handful of distinct texts: encode each once
            self._ids[text] = self.tokenizer.encode(text, add_special_tokens=False)
        ids = list(self._ids[text])
        return Completion(ids, text, "stop", "</answer>" if final else "</search>", prompt_tokens=len(input_ids))

    def _item(self, input_ids: list[int]) -> _Item:
        for n in self.prompt_lengths:
            key = tuple(input_ids[:n])
            if key in self.items:
                return self.items[key]
            if key in self.prompts:
                shape = self.prompts[key]
                item = self.items[key] = _Item(shape, len(self.items), context=shape.prompt)
                return item
        raise KeyError("a request whose prompt the simulation did not plan")

    def _next(self) -> int:
        self.order += 1
        return self.order

    def item_done(self, _traj: Any) -> None:
        """``on_done`` of the run: one item fewer to wait for."""
        self.expect -= 1
        self.finished += 1

    # -- the engine --
    async def drive(self, total: int) -> None:
        """Advance the simulated engine until every question is done."""
        self.total = total
        while self.finished < total:
            await self._settle()
            if self.finished >= total:
                break
            if self.schedule == "sync":
                self._release_sync()
            self._step()

    async def _settle(self) -> None:
        """Let the agent react to everything the engine finished (zero simulated time)."""
        spins = 0
        while self.expect > 0 or self.started < min(self.total, self.finished + self.concurrency):
            spins += 1
            if spins > 100_000:
                raise RuntimeError(f"the agent did not react ({self.expect} reactions outstanding)")
            await asyncio.sleep(0)

    def _release_sync(self) -> None:
        """Turn-synchronous gate: a wave's turn-k requests go to the engine together, once every
        live question of the wave has sent its turn k (or ended); a wave starts after the last."""
        if self.running or self.arrived or not self.held:
            return  # the engine is still on the previous turn
        live_per_wave: dict[int, int] = {}
        for it in self.items.values():
            if not it.ended:
                w = it.index // self.concurrency
                live_per_wave[w] = live_per_wave.get(w, 0) + 1
        wave = min(it.index // self.concurrency for _, it, _ in self.held)
        if any(w < wave for w in live_per_wave):
            return  # an earlier wave is still running
        mine = [h for h in self.held if h[1].index // self.concurrency == wave]
        if len(mine) < live_per_wave.get(wave, 0):
            return  # some question of the wave is still on its previous turn
        ready = max([self.now] + [h[1].done_at + (self.cost.retrieval_s if h[0] > 0 else 0) for h in mine])
        for _, item, future in mine:
            heapq.heappush(self.arrived, (ready, self._next(), item, future))
        self.held = [h for h in self.held if h[1].index // self.concurrency != wave]

    def _admit(self) -> int:
        """Move ready requests into the running batch, first come first served (the head waits
        when it does not fit); returns the prefill tokens of this step."""
        c = self.cost
        prefill = 0
        while self.arrived and self.arrived[0][0] <= self.now:
            _, order, item, future = self.arrived[0]
            gen = item.shape.turns[item.turn][0]
            new = item.shape.prompt if item.turn == 0 else sum(item.shape.turns[item.turn - 1])
            fits = (
                len(self.running) < c.max_running
                and self.kv_used + item.context + gen <= c.kv_tokens
                and (prefill == 0 or prefill + new <= c.prefill_chunk)
            )
            if not fits:
                break
            heapq.heappop(self.arrived)
            prefill += new
            seq = _Seq(self.steps + gen - 1, order, item, future, context=item.context, gen=gen)
            heapq.heappush(self.running, seq)
            self.ctx_total += item.context
            self.kv_used += item.context + gen
        return prefill

    def _step(self) -> None:
        c = self.cost
        prefill = self._admit()
        if not self.running:
            # Idle: nothing to run until the next request is ready.
            if not self.arrived:
                raise RuntimeError("simulation stalled: no request to serve and questions left")
            if self.arrived[0][0] <= self.now:  # ready, yet it did not fit an empty engine
                item = self.arrived[0][2]
                need = item.context + item.shape.turns[item.turn][0]
                raise RuntimeError(f"a request of {need} tokens does not fit --kv-tokens {c.kv_tokens}")
            self.now = max(self.now, self.arrived[0][0])
            return
        B = len(self.running)
        dt = c.a + c.b * B + c.c * self.ctx_total + c.p * prefill
        self.now += dt
        self.busy += dt
        self.batch_sum += B
        self.ctx_total += B  # every running sequence grew by one token
        while self.running and self.running[0].finish_step <= self.steps:
            seq = heapq.heappop(self.running)
            item = seq.item
            self.ctx_total -= seq.context + seq.gen
            self.kv_used -= seq.context + seq.gen
            gen, obs = item.shape.turns[item.turn]
            item.context += gen + obs
            item.turn += 1
            item.done_at = self.now
            item.ended = item.turn >= len(item.shape.turns)
            self.expect += 1  # the item will send its next turn, or end
            if seq.future is not None:
                seq.future.set_result(None)
        self.steps += 1


# ---- running it ------------------------------------------------------------------------------
def simulate(shapes: list[Shape], schedule: str, concurrency: int, cost: CostModel) -> dict[str, float]:
    """Run the real agent over ``shapes`` against the simulated engine; simulated figures."""
    tok = _Bytes()
    examples = [Example(f"q{i}", f"Which town is number {i}?", ("x",)) for i in range(len(shapes))]
    retriever = InMemoryRetriever([Doc("d1", "Town", "A town.")])
    searches = max(len(s.turns) for s in shapes) - 1
    opts = {
        "max_concurrency": concurrency,
        "max_turns": max(4, searches),  # searches allowed: the plan's longest question must fit
        "max_total_tokens": 1 << 20,
        "topk": 1,
        "chat": False,
    }
    probe = build_method("search_r1", _Probe(), retriever, dict(opts))
    prompts = {
        tuple(probe.dialect.prompt_ids(tok, ex.question, chat=False, few_shot=False)): s
        for ex, s in zip(examples, shapes, strict=True)
    }
    engine = SimEngine(cost, schedule, concurrency, prompts)
    agent = build_method("search_r1", engine, retriever, dict(opts))

    async def main() -> list[Any]:
        # The agent searches through asyncio.to_thread; here the (in-memory) search runs inline, so
        # the simulation never waits on a thread: its simulated time is --retrieval-s.
        asyncio.get_running_loop().set_default_executor(_InlineExecutor())
        drive = asyncio.create_task(engine.drive(len(examples)))
        trajs = await agent.arun_examples(examples, on_done=engine.item_done)
        await drive
        return trajs

    t0 = time.perf_counter()
    trajs = asyncio.run(main())
    bad = [t for t in trajs if t.finish_reason != "answer"]
    if bad:
        raise RuntimeError(
            f"{len(bad)} questions did not end with an answer, e.g. {bad[0].finish_reason}: {bad[0].error}"
        )
    turns_done = sum(t.n_turns for t in trajs)
    planned = sum(len(s.turns) for s in shapes)
    if turns_done != planned:
        raise RuntimeError(f"the agent took {turns_done} turns, the plan has {planned}")
    return {
        "questions_per_s": len(shapes) / engine.now,
        "gen_tokens_per_s": generated_tokens(shapes) / engine.now,
        "idle_frac": 1 - engine.busy / engine.now,
        "mean_batch": engine.batch_sum / max(engine.steps, 1),
        "sim_s": engine.now,
        "wall_s": time.perf_counter() - t0,
    }


def generated_tokens(shapes: list[Shape]) -> int:
    """The tokens the model generates over all turns of ``shapes``."""
    return sum(g for s in shapes for g, _ in s.turns)


def least_seconds(shapes: list[Shape], cost: CostModel) -> float:
    """A lower bound on the simulated seconds any schedule needs for the turns of ``shapes`` on
    this engine (module docstring): the schedule-independent work, plus ``a`` for each of the
    fewest steps the longest turn, ``--max-running`` and the KV cache allow, and no idle time."""
    fixed = 0.0
    longest = generated = kv_steps = 0
    for shape in shapes:
        context = shape.prompt
        for k, (g, o) in enumerate(shape.turns):
            new = shape.prompt if k == 0 else sum(shape.turns[k - 1])
            # its g decode steps see contexts context .. context + g - 1; it holds context + g of KV
            fixed += cost.b * g + cost.c * (g * context + g * (g - 1) / 2) + cost.p * new
            longest, generated, kv_steps = max(longest, g), generated + g, kv_steps + (context + g) * g
            context += g + o
    steps = max(longest, math.ceil(generated / cost.max_running), math.ceil(kv_steps / cost.kv_tokens))
    return cost.a * steps + fixed


def saturated(shapes: list[Shape], cost: CostModel) -> tuple[float, int]:
    """Simulated seconds and engine steps to serve every turn of ``shapes`` sent at once (module
    docstring): each turn a request with the context and prefill it has in the agent's run (the
    prefix cached, only the new tokens prefilled), turn order, searches and retrieval ignored,
    queued longest generation first (so the longest turn starts in the first step)."""
    engine = SimEngine(cost, "agent", 1, {})
    requests = []
    for index, shape in enumerate(shapes):
        context = shape.prompt
        for k, (g, o) in enumerate(shape.turns):
            requests.append((-g, len(requests), _Item(shape, index, turn=k, context=context)))
            context += g + o
    for _, _, item in sorted(requests, key=lambda r: r[:2]):
        heapq.heappush(engine.arrived, (0.0, engine._next(), item, None))
    while engine.arrived or engine.running:
        engine._step()
    return engine.now, engine.steps


class _Bytes:
    """A plain byte-level tokenizer (ids = UTF-8 bytes), cheap enough that the simulation's cost is
    the agent's own. The engine's token counts come from the real trajectories, not from these ids."""

    chat_template = None
    eos_token_id = 256
    bos_token_id = 257
    model_max_length = 1 << 20

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class _InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each submitted call at once, in the caller's thread (asyncio wants a ThreadPoolExecutor)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # handed to the awaiting coroutine, as a thread pool would
            future.set_exception(e)
        return future


class _Probe(BackendBase):
    """A backend that only lends its tokenizer (to compute the prompts the agent will send)."""

    def __init__(self) -> None:
        self.tokenizer = _Bytes()
        self.max_context = 1 << 20


def question_count(data_dir: Path | None) -> int | None:
    """HotpotQA dev's size, when the shared data is there."""
    if data_dir is None:
        return None
    dev = data_dir / "hotpotqa" / "dev.jsonl"
    if not dev.is_file():
        return None
    with dev.open("rb") as f:
        return sum(1 for _ in f)


def turn_histogram(shapes: list[Shape]) -> str:
    counts: dict[int, int] = {}
    for s in shapes:
        counts[len(s.turns)] = counts.get(len(s.turns), 0) + 1
    return ", ".join(f"{k} turns: {v}" for k, v in sorted(counts.items()))


def add_cost_args(ap: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One ``--name`` option per :class:`CostModel` constant (but ``skip``), defaulting to it."""
    for name, value in vars(CostModel()).items():
        if name not in skip:
            ap.add_argument(
                f"--{name.replace('_', '-')}", type=type(value), default=value, help=f"cost model (default {value})"
            )


def cost_from_args(args: argparse.Namespace) -> CostModel:
    """The :class:`CostModel` of :func:`add_cost_args`'s options (a skipped one keeps its default)."""
    return CostModel(**{k: getattr(args, k, v) for k, v in vars(CostModel()).items()})


def run_dirs(ap: argparse.ArgumentParser, given: list[Path] | None) -> list[Path]:
    """The run directories given, else the first default that holds trajectories (else a usage error)."""
    runs = given or [Path(p) for p in DEFAULT_RUNS if (Path(p) / "trajectories.jsonl").is_file()][:1]
    if not runs:
        ap.error("no run directory given and none of the defaults exists")
    return runs


def turn_shapes(source: str, ap: argparse.ArgumentParser, runs: list[Path] | None) -> tuple[list[Shape], str]:
    """The real turn shapes of a ``--turns`` source, and where they come from (for the log)."""
    if source == "smollm2":
        dirs = run_dirs(ap, runs)
        return read_shapes(dirs), ", ".join(map(str, dirs))
    if source == "r1searcher-7b":
        return read_turn_file(R1SEARCHER_7B), str(R1SEARCHER_7B.name)
    raise ValueError(f"unknown turn source {source!r}; known: {', '.join(TURN_SOURCES)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--turns",
        nargs="+",
        choices=TURN_SOURCES,
        default=list(TURN_SOURCES),
        help="where the turn counts and lengths come from: this harness's SmolLM2 runs (--runs), "
        "or R1-Searcher's released 7B model's HotpotQA outputs (default: both)",
    )
    ap.add_argument(
        "--runs", nargs="*", type=Path, help=f"run directories (default: the first of {DEFAULT_RUNS} present)"
    )
    ap.add_argument(
        "--data-dir", type=Path, default=None, help="the shared data (HotpotQA dev sets the question count)"
    )
    ap.add_argument("--questions", type=int, default=None, help="questions per run (default: HotpotQA dev's count)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--workload", nargs="+", choices=["uniform", "mixed"], default=["uniform", "mixed"])
    ap.add_argument("--seed", type=int, default=0)
    add_cost_args(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    cost = cost_from_args(args)
    n = args.questions or question_count(args.data_dir) or 4 * max(args.concurrency)
    logger.info("THE ENGINE IS A MODEL (see the docstring): %s", cost)
    logger.info("%d questions per run", n)
    header = (
        "| turns | workload | concurrency | agent q/s | sync q/s | agent/sync | agent gen tok/s | sync gen tok/s "
        "| bound gen tok/s | saturated replay gen tok/s | agent capacity | sync capacity | agent idle "
        "| sync idle | agent batch | sync batch |"
    )
    rows = [header, "|" + "---|" * 16]
    for source in args.turns:
        shapes, origin = turn_shapes(source, ap, args.runs)
        logger.info(
            "%s: turn shapes of %d real trajectories in %s: %s", source, len(shapes), origin, turn_histogram(shapes)
        )
        for workload in args.workload:
            questions = plan(shapes, n, workload, random.Random(args.seed))
            gen = statistics.mean(g for s in questions for g, _ in s.turns)
            logger.info(
                "%s %s: %s; %.0f generated tokens per turn on average",
                source,
                workload,
                turn_histogram(questions),
                gen,
            )
            seconds, steps = saturated(questions, cost)
            replay = generated_tokens(questions) / seconds
            limit = generated_tokens(questions) / least_seconds(questions, cost)
            logger.info(
                "%s %s: bound %.0f generated tok/s; saturated replay %.0f in %d steps",
                source,
                workload,
                limit,
                replay,
                steps,
            )
            for conc in args.concurrency:
                res = {sched: simulate(questions, sched, conc, cost) for sched in ("agent", "sync")}
                a, s = res["agent"], res["sync"]
                logger.info("%s %s c=%d: agent %s | sync %s | bound %.0f tok/s", source, workload, conc, a, s, limit)
                rows.append(
                    f"| {source} | {workload} | {conc} | {a['questions_per_s']:.1f} | {s['questions_per_s']:.1f} | "
                    f"{a['questions_per_s'] / s['questions_per_s']:.2f}x | {a['gen_tokens_per_s']:.0f} | "
                    f"{s['gen_tokens_per_s']:.0f} | {limit:.0f} | {replay:.0f} | "
                    f"{a['gen_tokens_per_s'] / limit:.1%} | {s['gen_tokens_per_s'] / limit:.1%} | "
                    f"{a['idle_frac']:.1%} | {s['idle_frac']:.1%} | {a['mean_batch']:.0f} | {s['mean_batch']:.0f} |"
                )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
