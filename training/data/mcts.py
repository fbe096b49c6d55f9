"""MCTS step values for a process reward model (ProRAG stage 2), through THE agent loop.

A step is one model turn plus its observation. A node of the tree is a paused trajectory of
:class:`~pipelines.search_agent.SearchAgent`; its children are ``expansion_width`` sampled
continuations of ONE step (``agent.arun(example, prefix=node.traj, max_steps=1)``), de-duplicated
by the model's tokens. Each simulation:

1. selects from the root by PUCT, ``Q/N + c_puct · prior · sqrt(N_parent) / (1 + N)`` with the
   uniform prior ``1/len(children)`` (UCT with ProRAG's prior term);
2. at a terminal leaf (the item ended, or ``max_depth`` steps) backs up that leaf's outcome reward;
   otherwise expands it and rolls one child (chosen at random) out to the end with the agent loop
   (greedy, like ProRAG's ``_simulate``), scored by the outcome reward;
3. backs the reward up to the root, discounted by ``gamma`` per level (ProRAG's ``backpropagate``).

A node's value is ``W / N`` (sum of backed-up rewards over visits). Settings default to ProRAG's
``prorag/prm/mcts.py`` (lilinwz/ProRAG @ c7a6411): 200 simulations, width 5, depth 10,
c_puct 2.5, gamma 0.99, expansion at temperature 0.9 / top-p 0.95, rollouts greedy, reward = F1 of
the answer (the ``prorag_f1`` reward). Differences, and why:

- Pairs (``pair_rule``): ``filter`` (the default) walks the tree as ProRAG's
  ``prorag/prm/filter.py`` does: at a node, the candidates are its children visited at least
  ``min_visits`` times whose step passes the dialect's step check (ProRAG's ``format_check``);
  with two or more, the node gives ONE pair; the walk recurses only into candidates visited at
  least ``recurse_visits`` (3) times. ProRAG has GPT-4o choose that pair (or none) among the
  candidates; the teacher is replaced here by a rule: the highest- against the lowest-valued
  candidate, kept when they differ by more than ``margin``. ``pair_rule: margin`` is the other
  option: every pair of visited siblings differing by more than ``margin``, anywhere in the tree.
- Budgets per question (``max_nodes``, ``max_rollouts``, ``max_tokens``) cap the search besides
  ``num_simulations``; ProRAG has only the simulation count.

Output (``out``): ``steps.jsonl`` (one record per visited non-root node: question id, prefix
segments, step segments, value, visits, depth), ``pairs.jsonl`` (prefix, chosen and rejected step
with their values) and ``done.jsonl`` (one line per finished question, written last). A
question's records are appended together after its search; on start, lines of questions without
a ``done`` line (an interrupted write) are dropped and finished questions are skipped, so an
interrupted run resumes exactly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from benchmarks.build import build_eval
from harness.config import compose, from_dict, require_at_least, to_dict
from harness.eval_config import BackendConfig, DatasetConfig, EvalConfig, RetrieverConfig
from harness.textfiles import parse_json_line, read_jsonl
from harness.types import Example, Segment, Trajectory
from pipelines.concurrency import run_bounded
from training.rewards import RewardFn, build_reward

if TYPE_CHECKING:
    from pipelines.search_agent import SearchAgent

logger = logging.getLogger(__name__)

STEPS_FILE, PAIRS_FILE, DONE_FILE = "steps.jsonl", "pairs.jsonl", "done.jsonl"


@dataclass(frozen=True)
class MCTSConfig:
    """Search settings (ProRAG's defaults; see the module docstring) and budgets per question."""

    num_simulations: int = 200
    expansion_width: int = 5  # K sampled children per expansion (duplicates dropped)
    max_depth: int = 10  # steps from the root
    c_puct: float = 2.5
    gamma: float = 0.99
    expand_temperature: float = 0.9
    expand_top_p: float = 0.95
    rollout_temperature: float = 0.0
    reward: Any = "prorag_f1"  # training.rewards.build_reward spec scoring a finished rollout
    margin: float = 0.2  # pairs: sibling values must differ by MORE than this
    min_visits: int = 1  # pairs and step records: nodes visited at least this often
    pair_rule: Literal["filter", "margin"] = "filter"  # ProRAG's filter.py walk, or all sibling pairs
    recurse_visits: int = 3  # pair_rule filter: recurse only into candidates visited this often
    max_nodes: int | None = None  # budget: nodes in the tree (root included); a leaf is expanded only if K more fit
    max_rollouts: int | None = None  # budget: rollouts to a terminal answer
    max_tokens: int | None = None  # budget: generated tokens (expansions + rollouts)
    seed: int = 0
    concurrency: int = 4  # questions searched at once

    def __post_init__(self) -> None:
        require_at_least(self, 1, "num_simulations", "expansion_width", "max_depth", "min_visits", "concurrency")
        require_at_least(self, 1, "recurse_visits")
        require_at_least(self, 1, "max_nodes", "max_rollouts", "max_tokens")
        require_at_least(self, 0, "c_puct", "margin", "expand_temperature", "rollout_temperature")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"mcts.gamma must be in (0, 1], got {self.gamma}")


@dataclass(frozen=True)
class MCTSRunConfig:
    """``harness data mcts -c CONFIG``: the agent (method, backend, retriever, agent options, as
    ``harness eval`` takes them), the questions, the search, and the output folder."""

    method: str = "prorag"
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    agent: dict[str, Any] = field(default_factory=dict)
    mcts: MCTSConfig = field(default_factory=MCTSConfig)
    offset: int = 0  # skip the first N questions (keep MCTS questions apart from others)
    out: str = "runs/mcts"


@dataclass(eq=False)
class Node:
    """A paused (or finished) trajectory in the tree; ``traj`` is None only at the root."""

    traj: Trajectory | None
    parent: Node | None = None
    depth: int = 0
    prior: float = 1.0
    id: int = 0
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    total: float = 0.0  # sum of backed-up (discounted) rewards
    own: int = 0  # backups that started here (its rollout, or a terminal visit)
    reward: float | None = None  # outcome reward, once known (terminal, or its rollout)

    @property
    def value(self) -> float:
        return self.total / self.visits if self.visits else 0.0

    @property
    def terminal(self) -> bool:
        return self.traj is not None and self.traj.finish_reason != "paused"

    def segments(self) -> list[Segment]:
        return self.traj.segments if self.traj is not None else []


@dataclass
class Budget:
    simulations: int = 0
    nodes: int = 1
    rollouts: int = 0
    tokens: int = 0


class TreeSearch:
    """MCTS for one question over ``agent`` (a :class:`~pipelines.search_agent.SearchAgent`)."""

    def __init__(self, agent: SearchAgent, cfg: MCTSConfig, reward_fn: RewardFn) -> None:
        self.agent, self.cfg, self.reward_fn = agent, cfg, reward_fn

    async def search(self, example: Example) -> tuple[Node, Budget]:
        c = self.cfg
        seed = (c.seed * 1_000_003 + zlib.crc32(example.id.encode())) & 0x7FFFFFFF
        rng = random.Random(seed)  # per question: the tree does not depend on other questions
        root, used = Node(traj=None), Budget()
        while used.simulations < c.num_simulations and not self._spent(used):
            node = self._select(root)
            used.simulations += 1
            if node.terminal or node.depth >= c.max_depth:
                self._backup(node, self._reward(node))
                continue
            if c.max_nodes is not None and used.nodes + c.expansion_width > c.max_nodes:
                break  # an expansion may add K nodes: the budget has no room for them
            children = await self._expand(example, node, seed, used)
            if not children:
                raise RuntimeError(f"question {example.id!r}: every expansion failed ({node.depth=})")
            child = rng.choice(children)
            self._backup(child, await self._simulate(example, child, used))
        return root, used

    def _spent(self, used: Budget) -> bool:
        c = self.cfg
        return (
            (c.max_nodes is not None and used.nodes >= c.max_nodes)
            or (c.max_rollouts is not None and used.rollouts >= c.max_rollouts)
            or (c.max_tokens is not None and used.tokens >= c.max_tokens)
        )

    def _select(self, node: Node) -> Node:
        while node.children and not node.terminal and node.depth < self.cfg.max_depth:
            sqrt_n = math.sqrt(node.visits)
            node = max(
                node.children, key=lambda ch: ch.value + self.cfg.c_puct * ch.prior * sqrt_n / (1 + ch.visits)
            )  # first of equals: children keep their sampling order
        return node

    async def _expand(self, example: Example, node: Node, seed: int, used: Budget) -> list[Node]:
        c, base = self.cfg, self.agent.sampling()
        params = [
            base.with_(temperature=c.expand_temperature, top_p=c.expand_top_p, seed=seed + used.nodes * 131 + k)
            for k in range(c.expansion_width)
        ]
        trajs = await asyncio.gather(
            *(self.agent.arun(example, sampling=p, prefix=node.traj, max_steps=1) for p in params)
        )
        seen, kids = set(), []
        for t in trajs:
            used.tokens += t.generated_tokens - (node.traj.generated_tokens if node.traj else 0)
            if t.finish_reason == "error":
                logger.warning("question %s: an expansion failed: %s", example.id, t.error)
                continue
            key = tuple(tuple(s.token_ids) for s in t.segments[len(node.segments()) :] if s.role == "model")
            if key in seen:  # ProRAG keeps distinct actions only
                continue
            seen.add(key)
            kids.append(t)
        for t in kids:
            used.nodes += 1
            node.children.append(Node(t, node, node.depth + 1, 1.0 / len(kids), id=used.nodes - 1))
        return node.children

    async def _simulate(self, example: Example, child: Node, used: Budget) -> float:
        """The child's outcome: its own reward when it is terminal, else a rollout's."""
        c = self.cfg
        if child.terminal or child.depth >= c.max_depth:
            return self._reward(child)
        params = self.agent.sampling().with_(temperature=c.rollout_temperature, seed=c.seed)
        out = await self.agent.arun(example, sampling=params, prefix=child.traj, max_steps=c.max_depth - child.depth)
        used.rollouts += 1
        used.tokens += out.generated_tokens - child.traj.generated_tokens
        if out.finish_reason == "error":
            raise RuntimeError(f"question {example.id!r}: a rollout failed: {out.error}")
        return float(self.reward_fn(out)[0])

    def _reward(self, node: Node) -> float:
        if node.reward is None:
            node.reward = float(self.reward_fn(node.traj)[0])
        return node.reward

    def _backup(self, node: Node, reward: float) -> None:
        node.own += 1
        n: Node | None = node
        while n is not None:
            n.visits += 1
            n.total += reward
            reward *= self.cfg.gamma
            n = n.parent


# ---- records ----------------------------------------------------------------------------------
def _segs(segments: Sequence[Segment]) -> list[dict[str, Any]]:
    return [{"role": s.role, "token_ids": list(s.token_ids), "text": s.text} for s in segments]


def walk(root: Node) -> list[Node]:
    out, stack = [], [root]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(n.children))
    return out


def prefix_of(node: Node) -> list[Segment]:
    """The segments before this node's step: the parent's, or (root children) the prompt."""
    assert node.traj is not None and node.parent is not None
    if node.parent.traj is not None:
        return node.parent.traj.segments
    return node.traj.segments[: _n_prompt(node.traj)]


def _n_prompt(traj: Trajectory) -> int:
    n = 0
    while n < len(traj.segments) and traj.segments[n].role == "prompt":
        n += 1
    return n


def step_of(node: Node) -> list[Segment]:
    return node.traj.segments[len(prefix_of(node)) :]  # type: ignore[union-attr]


def tree_records(
    example: Example, root: Node, cfg: MCTSConfig, step_ok: Callable[[str], bool] | None = None
) -> tuple[list[dict], list[dict]]:
    """Step records of every visited non-root node, and the contrastive sibling pairs
    (``cfg.pair_rule``; ``step_ok``: the dialect's check of a step's text, ProRAG's ``format_check``)."""
    steps, pairs = [], []
    for n in walk(root):
        if n.parent is not None and n.visits >= cfg.min_visits:
            steps.append(
                {
                    "question_id": example.id,
                    "question": example.question,
                    "node": n.id,
                    "parent": n.parent.id,
                    "depth": n.depth,
                    "prefix": _segs(prefix_of(n)),
                    "step": _segs(step_of(n)),
                    "value": n.value,
                    "visits": n.visits,
                    "terminal": n.terminal,
                    "finish_reason": n.traj.finish_reason if n.traj else None,
                }
            )
    if cfg.pair_rule == "margin":
        for n in walk(root):
            kids = [ch for ch in n.children if ch.visits >= cfg.min_visits]
            pairs += [_pair(example, n, a, b) for i, a in enumerate(kids) for b in kids[i + 1 :] if _apart(a, b, cfg)]
    else:
        pairs = _filter_pairs(example, root, cfg, step_ok)
    return steps, pairs


def _apart(a: Node, b: Node, cfg: MCTSConfig) -> bool:
    return abs(a.value - b.value) > cfg.margin


def _pair(example: Example, parent: Node, a: Node, b: Node) -> dict[str, Any]:
    hi, lo = (a, b) if a.value > b.value else (b, a)
    return {
        "question_id": example.id,
        "question": example.question,
        "parent": parent.id,
        "prefix": _segs(prefix_of(hi)),
        "chosen": {"node": hi.id, "step": _segs(step_of(hi)), "value": hi.value, "visits": hi.visits},
        "rejected": {"node": lo.id, "step": _segs(step_of(lo)), "value": lo.value, "visits": lo.visits},
    }


def _filter_pairs(
    example: Example, node: Node, cfg: MCTSConfig, step_ok: Callable[[str], bool] | None
) -> list[dict[str, Any]]:
    """ProRAG's ``traverse_and_collect_jobs``: one pair per node among its well-formed visited
    children (the highest- and lowest-valued, when apart by more than the margin), recursing only
    into those visited at least ``recurse_visits`` times."""
    ok = step_ok or (lambda text: True)
    cands = [ch for ch in node.children if ch.visits >= cfg.min_visits and ok("".join(s.text for s in step_of(ch)))]
    pairs = []
    if len(cands) >= 2:
        best = max(cands, key=lambda c: c.value)
        worst = min(cands, key=lambda c: c.value)
        if _apart(best, worst, cfg):
            pairs.append(_pair(example, node, best, worst))
    for ch in cands:
        if ch.visits >= cfg.recurse_visits:
            pairs += _filter_pairs(example, ch, cfg, step_ok)
    return pairs


# ---- the resumable writer ---------------------------------------------------------------------
class MCTSWriter:
    """Appends each finished question's records to ``out``; see the module docstring."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.done = self._read_done()
        for name in (STEPS_FILE, PAIRS_FILE):
            self._drop_unfinished(self.out / name)

    def _read_done(self) -> set[str]:
        path = self.out / DONE_FILE
        if not path.exists():
            return set()
        raw = path.read_bytes()
        keep = raw[: raw.rfind(b"\n") + 1]  # a torn last line is not a finished question
        if keep != raw:
            path.write_bytes(keep)
        return {r["question_id"] for _, r in read_jsonl(path)}

    def _drop_unfinished(self, path: Path) -> None:
        if not path.exists():
            return
        raw = path.read_bytes()
        lines = raw[: raw.rfind(b"\n") + 1].decode("utf-8").splitlines(keepends=True)
        keep = [
            ln
            for i, ln in enumerate(lines, 1)
            if ln.strip() and parse_json_line(ln, f"{path}:{i}")["question_id"] in self.done
        ]
        if len(keep) != len(lines) or len(raw) != sum(len(x.encode()) for x in lines):
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(keep), encoding="utf-8")
            os.replace(tmp, path)
            logger.info("%s: dropped %d records of unfinished questions", path, len(lines) - len(keep))

    def write(self, qid: str, steps: list[dict], pairs: list[dict], summary: dict[str, Any]) -> None:
        for name, records in ((STEPS_FILE, steps), (PAIRS_FILE, pairs), (DONE_FILE, [summary])):
            with open(self.out / name, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
                f.flush()
                os.fsync(f.fileno())
        self.done.add(qid)


@dataclass
class MCTSStats:
    questions: int = 0
    skipped: int = 0
    failed: int = 0
    steps: int = 0
    pairs: int = 0

    def summary(self) -> str:
        return (
            f"{self.questions} questions searched ({self.skipped} already done, {self.failed} failed): "
            f"{self.steps} step records, {self.pairs} pairs"
        )


def run_mcts(agent: SearchAgent, examples: Sequence[Example], cfg: MCTSConfig, out: str | Path) -> MCTSStats:
    """Search every example not yet done in ``out``; append each one's records when it finishes."""
    writer, stats = MCTSWriter(out), MCTSStats()
    todo = [e for e in examples if e.id not in writer.done]
    stats.skipped = len(examples) - len(todo)
    search = TreeSearch(agent, cfg, build_reward(cfg.reward))

    async def one(ex: Example) -> tuple[Example, Any]:
        try:
            return ex, await search.search(ex)
        except Exception as e:  # one question's fault stays on that question: it is not marked done
            logger.warning("MCTS on %s failed: %s: %s", ex.id, type(e).__name__, e)
            return ex, e

    def done(result: tuple[Example, Any]) -> None:
        ex, res = result
        if isinstance(res, Exception):
            stats.failed += 1
            return
        root, used = res
        steps, pairs = tree_records(
            ex, root, cfg, getattr(agent, "dialect", None) and agent.dialect.options.get("step_check")
        )
        summary = {
            "question_id": ex.id,
            "steps": len(steps),
            "pairs": len(pairs),
            "simulations": used.simulations,
            "nodes": used.nodes,
            "rollouts": used.rollouts,
            "tokens": used.tokens,
            "root_value": root.value,
        }
        writer.write(ex.id, steps, pairs, summary)
        logger.info("MCTS %s: %d steps, %d pairs, root value %.3f", ex.id, len(steps), len(pairs), root.value)
        stats.questions += 1
        stats.steps += len(steps)
        stats.pairs += len(pairs)

    asyncio.run(run_bounded(one, [(e,) for e in todo], cfg.concurrency, done))
    return stats


def read_pairs(path: str | Path) -> list[dict[str, Any]]:
    """The pairs of an MCTS output folder (or a pairs JSONL); errors name file and line."""
    path = Path(path)
    path = path / PAIRS_FILE if path.is_dir() else path
    out = []
    for i, r in read_jsonl(path):
        missing = [k for k in ("prefix", "chosen", "rejected") if k not in r]
        if missing:
            raise ValueError(f"{path}:{i}: not an MCTS pair record (no {', '.join(missing)})")
        out.append(r)
    return out


def run_mcts_recipe(files: list[str], overrides: list[str], out: str | None = None) -> tuple[MCTSStats, str]:
    """``harness data mcts``: compose an :class:`MCTSRunConfig` from YAML ``files`` and
    ``key.path=value`` overrides, build its agent and questions as ``harness eval`` builds a run,
    and :func:`run_mcts` into ``out`` (default: the config's). Returns the stats and the folder."""
    cfg = compose(MCTSRunConfig, files, overrides)
    ecfg = from_dict(
        EvalConfig,
        {k: to_dict(getattr(cfg, k)) for k in ("method", "dataset", "backend", "retriever", "agent")},
        where="mcts",
    )
    run = build_eval(ecfg)
    if not hasattr(run.method, "arun"):
        raise ValueError(f"method {cfg.method!r} is not the search agent: MCTS resumes the agent loop")
    folder = out or cfg.out
    return run_mcts(run.method, run.examples[cfg.offset :], cfg.mcts, folder), folder
