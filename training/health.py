"""Training health: what a run's rollouts say before the reward does (issue 49).

Collapse is often visible in the rollouts well before the reward falls: an example trained 100
steps on empty documents (rLLM PR #396), reasoning that degenerates into rows of broken ``<think``
tokens while the answer stays right (the 2026 Search-R1 re-examination cited in
docs/training.md). So an RL run has:

- :func:`preflight`, before its first step: the retriever (served or local) returns text for a
  few training questions, and the reward of a gold answer, written in the dialect's own tags, is
  positive. Otherwise :class:`PreflightError` names what failed, and nothing is trained.
- :func:`health_metrics`, per step (logged as ``health/*`` in ``metrics.jsonl`` and drawn in the
  report's training curves): the share of searches that came back empty, the share of responses
  with a repeated n-gram, the share with broken tags, and the mean ``<think>`` length in words.
- :class:`HealthGuard`: ``trainer.stop_on`` (``{metric: "> 0.5"}``) stops a run whose step
  metrics cross a threshold ``trainer.stop_on_steps`` steps in a row, with
  :class:`HealthStop` naming the metric, its values and the steps, as
  :class:`training.divergence.NonFiniteGuard` stops a diverged one.
"""

from __future__ import annotations

import logging
import operator
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from harness.retrieval.base import Retriever
from harness.types import Doc, Example, SearchRecord, Segment, Trajectory
from pipelines.dialects import Dialect
from training.config import parse_stop_on
from training.divergence import DivergenceError
from training.synthesize import final_turn

if TYPE_CHECKING:
    from pipelines.search_agent import SearchAgent
    from training.rewards import RewardFn

logger = logging.getLogger(__name__)

PREFLIGHT_QUESTIONS = 4  # training questions the preflight searches (the first of the sampler's order)
NGRAM = 6  # words in the n-grams :func:`repeats` counts
NGRAM_REPEATS = 3  # a response repeats when one n-gram occurs this often


class PreflightError(ValueError):
    """The run cannot train as configured (an empty retriever, a reward that gives a gold answer
    nothing); the message says which, with the question and what came back."""


class HealthStop(DivergenceError):
    """``trainer.stop_on``: a health metric crossed its threshold for ``stop_on_steps`` steps in a row."""


# ---- before the first step ---------------------------------------------------------------------
def _doc_text(doc: Doc) -> str:
    return (getattr(doc, "text", "") or "").strip() or (getattr(doc, "title", "") or "").strip()


def check_retriever(retriever: Retriever | None, questions: Sequence[str], k: int) -> None:
    """Raise :class:`PreflightError` unless every question gets at least one passage with text."""
    if retriever is None:
        raise PreflightError("preflight: the agent has no retriever (retriever.kind), so no search returns anything")
    try:
        results = retriever.search(list(questions), k)
    except Exception as e:  # any failure of the search itself: the run cannot start
        raise PreflightError(
            f"preflight: the retriever failed on the training questions ({type(e).__name__}: {e})"
        ) from None
    empty = [q for q, docs in zip(questions, results, strict=True) if not any(_doc_text(d) for d in docs)]
    if empty:
        raise PreflightError(
            f"preflight: the retriever returned no text for {len(empty)} of {len(questions)} training questions "
            f"(top-{k}), e.g. {empty[0]!r}: every rollout would search an empty corpus. Check retriever.corpus / "
            "retriever.index / retriever.url (set trainer.preflight=false to train anyway)"
        )


def gold_response(dialect: Dialect, answer: str) -> str:
    """One answering turn in ``dialect``'s own tags: a thought, then ``answer`` in its answer block
    (:func:`training.synthesize.final_turn`, the turn synthesized SFT data ends with)."""
    return final_turn(dialect, answer, None)


def gold_trajectory(example: Example, dialect: Dialect, prompt: str | None = None) -> Trajectory:
    """A well-formed trajectory that answers ``example`` with its first gold answer, after
    ``prompt`` (the text the agent's prompt renders to; the bare question when not given). The
    prompt matters to a reward that reads it (Search-R1's ``qa_em`` takes the last of at least two
    answers in prompt + response: the prompt's example answer is the first)."""
    text = gold_response(dialect, example.answers[0])
    return Trajectory.of(
        example,
        dialect.name,
        segments=[Segment("prompt", [], example.question if prompt is None else prompt), Segment("model", [], text)],
        prediction=example.answers[0],
        response_text=text,
        finish_reason="answer",
        n_turns=1,
        metadata={"dialect": dialect.name},
    )


def check_reward(
    reward_fn: RewardFn,
    examples: Sequence[Example],
    dialect: Dialect,
    render: Callable[[str], str] | None = None,
) -> None:
    """Raise :class:`PreflightError` when the reward of a gold answer is not positive for any of
    ``examples`` (a reward that cannot tell right from wrong gives GRPO nothing to learn).
    ``render``: a question's prompt text as the agent renders it (None: the bare question)."""
    scored = []
    for e in examples:
        traj = gold_trajectory(e, dialect, render(e.question) if render else None)
        reward = float(reward_fn(traj)[0])
        scored.append((e, reward, traj.response_text))
    if not any(r > 0 for _, r, _ in scored):
        e, r, text = scored[0]
        raise PreflightError(
            f"preflight: the reward (algo.reward) of a gold answer is {r:g}, not positive: for {e.question!r} the "
            f"response {text!r} scores {r:g}. Check algo.reward against rollout.method (set trainer.preflight=false "
            "to train anyway)"
        )


def preflight(agent: SearchAgent, examples: Sequence[Example], reward_fn: RewardFn, k: int) -> None:
    """Both checks on the first :data:`PREFLIGHT_QUESTIONS` training questions (see the module docstring)."""
    chosen = [e for e in examples if e.answers][:PREFLIGHT_QUESTIONS]
    if not chosen:
        raise PreflightError("preflight: no training question has a gold answer")
    check_retriever(getattr(agent, "retriever", None), [e.question for e in chosen], k)
    check_reward(reward_fn, chosen, agent.dialect, _renderer(agent))
    logger.info("preflight passed: the retriever returns text and a gold answer scores > 0 (%d questions)", len(chosen))


def _renderer(agent: SearchAgent) -> Callable[[str], str] | None:
    """The search agent's prompt text of a question (its dialect, tokenizer, chat and few-shot
    options), or None for an agent that does not say how it renders one."""
    tokenizer, config = getattr(agent, "tokenizer", None), getattr(agent, "config", None)
    if tokenizer is None or config is None:
        return None
    return lambda q: agent.dialect.render(q, tokenizer, agent.use_chat, config.few_shot)


# ---- per step ----------------------------------------------------------------------------------
def empty_search(search: SearchRecord) -> bool:
    """A search that failed or brought back no passage with text."""
    return bool(search.error) or not any(_doc_text(d) for d in search.docs)


def repeats(text: str, n: int = NGRAM, times: int = NGRAM_REPEATS) -> bool:
    """Whether some run of ``n`` words occurs ``times`` times or more in ``text`` (degenerate loops)."""
    words = text.split()
    if len(words) < n * times:
        return False
    grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    return max(grams.values()) >= times


def _tag_name(tag: str) -> str:
    return tag.strip().strip("<>/")


def broken_tags(text: str, think_open: str = "<think>", think_close: str = "</think>") -> bool:
    """Whether the reasoning tag (the dialect's ``think_open``/``think_close``: ``<think>``, ProRAG's
    ``<step>``) is malformed (``<think]``, ``</think`` without its ``>``) or opened and closed a
    different number of times. One open tag left at the end (a response cut by the length limit)
    is not broken."""
    name = re.escape(_tag_name(think_open))
    if re.search(rf"</?{name}(?![a-zA-Z_>])", text):
        return True
    diff = text.count(think_open) - text.count(think_close)
    if diff == 1:
        return text.rfind(think_open) < text.rfind(think_close)
    return diff != 0


def think_words(text: str, think_open: str = "<think>", think_close: str = "</think>") -> int:
    """Words inside the response's reasoning blocks (an unclosed last block counts to the end)."""
    pattern = re.compile(rf"{re.escape(think_open)}(.*?)(?:{re.escape(think_close)}|$)", re.DOTALL)
    return sum(len(m.split()) for m in pattern.findall(text))


def tagged_text(t: Trajectory, think_open: str) -> str:
    """What the reasoning tags are counted on: the model's turns and the observations between
    them (ProRAG's observations open the next ``<step>``), with the tag the prompt opened
    (R1-Searcher's prompt ends with ``Assistant: <think>``) put back in front."""
    rest = "".join(s.text for s in t.segments if s.role != "prompt") or t.response_text
    prompt = next((s.text for s in t.segments if s.role == "prompt"), "")
    return think_open + rest if prompt.rstrip().endswith(think_open) else rest


def model_text(t: Trajectory) -> str:
    """The model's own turns (what a repetition loop shows in)."""
    return "".join(s.text for s in t.segments if s.role == "model") or t.response_text


def health_metrics(trajectories: Sequence[Trajectory], dialect: Dialect) -> dict[str, float]:
    """A step's health (``health/*``): see the module docstring; ``health/empty_retrieval`` only
    when the step searched at all."""
    o, c = dialect.think_open, dialect.think_close
    tagged = [tagged_text(t, o) for t in trajectories]
    n = max(1, len(trajectories))
    searches = [s for t in trajectories for s in t.searches]
    out = {
        "health/repeated_ngrams": sum(repeats(model_text(t)) for t in trajectories) / n,
        "health/broken_tags": sum(broken_tags(x, o, c) for x in tagged) / n,
        "health/think_words": sum(think_words(x, o, c) for x in tagged) / n,
    }
    if searches:
        out["health/empty_retrieval"] = sum(empty_search(s) for s in searches) / len(searches)
    return out


# ---- trainer.stop_on -----------------------------------------------------------------------------
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


class HealthGuard:
    """``trainer.stop_on``: counts, per rule, the steps in a row whose metric crossed it;
    :meth:`stop_if_unhealthy` raises :class:`HealthStop` once one has for ``steps`` steps. A step
    that did not log the metric (no search that step) breaks no streak and extends none."""

    def __init__(self, rules: dict[str, str | float], steps: int = 1) -> None:
        self.rules = parse_stop_on(rules)
        self.steps = max(1, steps)
        self.streak: dict[str, list[tuple[int, float]]] = {m: [] for m in self.rules}

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        for metric, (op, threshold) in self.rules.items():
            if metric not in metrics:
                continue
            value = float(metrics[metric])
            self.streak[metric] = self.streak[metric] + [(step, value)] if _OPS[op](value, threshold) else []

    def stop_if_unhealthy(self) -> None:
        for metric, run in self.streak.items():
            if len(run) >= self.steps:
                op, threshold = self.rules[metric]
                values = ", ".join(f"{v:.3g}" for _, v in run[-self.steps :])
                raise HealthStop(
                    f"stopped at step {run[-1][0]}: {metric} {op} {threshold:g} for {self.steps} step(s) in a row "
                    f"(steps {run[-self.steps][0]} to {run[-1][0]}: {values}; trainer.stop_on). The checkpoints "
                    "kept are from before; look at rollouts.jsonl for what the policy wrote"
                )
