"""Rollouts through THE search agent (the object ``harness eval`` runs; no second loop).

Each step takes ``prompts_per_step`` examples and ``n_samples`` rollouts of each. Every rollout
is one call of :meth:`SearchAgent.arun`, the per-item coroutine that ``run_examples`` (the eval
path) calls too, so the token-exact segments, the loss-mask roles (1 on model tokens only) and
the prediction are exactly what evaluation would produce. The collector adds only what RL
needs on top:

- a seed per (step, prompt, sample), so the n samples of a prompt differ and a resumed run
  draws the same samples as an uninterrupted one;
- the group id of a rollout = its prompt's index in the step (never a fresh id per sample,
  which would make every group a singleton and silently zero GRPO's advantages);
- the policy version the rollout was generated with, recorded on every trajectory;
- admission in lockstep (:mod:`harness.backends.lockstep`): with the in-process backend, which
  rollouts share a decode batch does not depend on timing, so a rerun draws the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.backends.base import SamplingParams, run_sync
from harness.backends.lockstep import client, lockstep_of
from harness.types import Example, Trajectory
from pipelines.concurrency import run_bounded
from pipelines.method import Method
from training.epochs import EpochSampler


class PromptSampler:
    """Deterministic epochs over the examples (reshuffled per epoch: :class:`~training.epochs.EpochSampler`);
    its position is checkpointed."""

    def __init__(self, examples: list[Example], seed: int = 0, shuffle: bool = True) -> None:
        if not examples:
            raise ValueError("no training examples")
        self.examples = examples
        self._indices = EpochSampler(len(examples), seed, shuffle)

    @property
    def epoch(self) -> int:
        return self._indices.epoch

    def next(self, n: int) -> list[Example]:
        """The next ``n`` examples, running into the next epoch when this one ends."""
        return [self.examples[i] for i in self._indices.next(n)]

    def state(self) -> dict[str, int]:
        # RL checkpoints have always named the position "index" (the SFT and PRM trainers' "pos").
        return {"epoch": self._indices.epoch, "index": self._indices.pos}

    def load(self, state: dict[str, int]) -> None:
        self._indices.load({"epoch": state["epoch"], "pos": state["index"]})


@dataclass
class RolloutBatch:
    """The rollouts of one step, example-major: prompt 0's samples, then prompt 1's, ..."""

    trajectories: list[Trajectory]
    group_ids: list[int]  # the prompt's index in the step, one per trajectory
    policy_version: int


def sample_seed(seed: int, prompt_index: int, sample_index: int, n_samples: int) -> int:
    """A distinct, reproducible seed for every rollout of a step (``seed`` varies per step)."""
    return seed * 1_000_003 + prompt_index * n_samples + sample_index


def collect(
    agent: Method,
    prompts: list[Example],
    n_samples: int,
    sampling: SamplingParams,
    policy_version: int,
    seed: int,
    group_offset: int = 0,
) -> RolloutBatch:
    """Run ``n_samples`` rollouts of every prompt through ``agent``; see the module docstring.

    ``group_offset`` shifts the group ids (a data-parallel rank's prompts are a slice of the step's).
    """
    params = sampling.with_(logprobs=True)
    items = [(i, ex, j) for i, ex in enumerate(prompts) for j in range(n_samples)]
    limit = agent.max_concurrency  # the same bounded loop and cap run_examples applies
    # In lockstep, which rollouts share a decode batch does not depend on timing: a rerun of the
    # same seed draws the same tokens (harness.backends.lockstep).
    with lockstep_of(getattr(agent, "backend", None), len(items), limit) as gate:

        async def one(i: int, ex: Example, j: int) -> Trajectory:
            try:
                with client((i, j)):
                    return await agent.arun(
                        ex,
                        sample_index=j,
                        sampling=params.with_(seed=sample_seed(seed, i + group_offset, j, n_samples)),
                        policy_version=policy_version,
                    )
            finally:
                gate.done()

        trajectories = run_sync(run_bounded(one, items, limit))
    group_ids = [group_offset + i for i in range(len(prompts)) for _ in range(n_samples)]
    return RolloutBatch(trajectories, group_ids, policy_version)
