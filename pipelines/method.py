"""The method protocol and its one shared implementation of running many examples.

Every method (the search agent, FlashRAG's baselines) subclasses :class:`Method` and writes
only ``arun`` (one item); ``run_examples`` / ``arun_examples`` — which items are still to do,
the bounded concurrency, the schedule — live here once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from harness.backends.base import SamplingParams
from harness.types import Example, Trajectory
from pipelines.concurrency import run_bounded

#: ``async``: each item runs start to finish on its own, up to the concurrency at once (the
#: default). ``sync``: items go in waves of the concurrency and turn k of a wave starts only when
#: every item of the wave has finished turn k-1 (a turn-synchronous baseline; needs a method
#: whose ``arun`` can pause and resume between steps).
SCHEDULES = ("async", "sync")


def check_schedule(method: Any, schedule: str) -> None:
    """Raise ``ValueError`` naming the problem when ``method`` cannot run under ``schedule``: an
    unknown schedule, or ``sync`` for a method that cannot pause between steps (FlashRAG's
    baselines run each item inside FlashRAG's own loop)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if schedule == "sync" and not getattr(method, "pauses_between_steps", False):
        name = getattr(method, "method", type(method).__name__)
        raise ValueError(
            f"schedule 'sync' (--schedule sync) needs a method that can pause between steps; "
            f"method {name!r} cannot (it runs each item start to finish): use --schedule async"
        )


ItemRunner = Callable[[Example, int, SamplingParams | None, int], Awaitable[Trajectory]]


@runtime_checkable
class Method(Protocol):
    """What ``harness eval`` (``benchmarks.evaluate``) and RL rollouts (``training.rl.rollout``) call.

    ``arun`` runs one (example, sample) and never raises (errors are recorded on the trajectory);
    ``run_examples`` runs many concurrently, calling ``on_done`` as each finishes and skipping
    the (example id, sample index) pairs in ``skip``. Subclasses write ``arun`` and
    ``max_concurrency``; they inherit ``run_examples`` / ``arun_examples``.
    """

    method: str
    #: Whether ``arun`` takes ``prefix=`` and ``max_steps=`` (pause after a step, resume from the
    #: paused trajectory): what the ``sync`` schedule needs. The agent loop can; FlashRAG's
    #: baselines cannot (:func:`check_schedule` refuses them by name).
    pauses_between_steps: bool = False

    async def arun(
        self, example: Example, sample_index: int = 0, sampling: SamplingParams | None = None, policy_version: int = 0
    ) -> Trajectory: ...

    @property
    def max_concurrency(self) -> int: ...

    @contextlib.asynccontextmanager
    async def item_runner(self) -> AsyncIterator[ItemRunner]:
        """How one item runs during ``arun_examples``: ``arun`` by default; a method that needs
        resources for the whole run (a thread pool) overrides this."""

        async def one(ex: Example, j: int, sampling: SamplingParams | None, version: int) -> Trajectory:
            return await self.arun(ex, sample_index=j, sampling=sampling, policy_version=version)

        yield one

    def run_examples(self, examples: Sequence[Example], *args: Any, **kwargs: Any) -> list[Trajectory]:
        """Synchronous :meth:`arun_examples` (same arguments)."""
        return asyncio.run(self.arun_examples(examples, *args, **kwargs))

    async def arun_examples(
        self,
        examples: Sequence[Example],
        n_samples: int = 1,
        sampling: SamplingParams | None = None,
        policy_version: int = 0,
        on_done: Callable[[Trajectory], None] | None = None,
        skip: set[tuple[str, int]] | None = None,
        schedule: str = "async",
    ) -> list[Trajectory]:
        """Run every (example, sample) not in ``skip``; returns trajectories in input order.

        ``on_done`` is called as each item finishes (completion order) — the eval path streams
        trajectories to disk with it. ``schedule`` is one of :data:`SCHEDULES`.
        """
        check_schedule(self, schedule)
        skip = skip or set()
        todo = [(ex, j) for ex in examples for j in range(n_samples) if (ex.id, j) not in skip]
        limit = self.max_concurrency
        if schedule == "sync":
            return await self._arun_sync(todo, limit, sampling, policy_version, on_done)
        async with self.item_runner() as one:
            return await run_bounded(lambda ex, j: one(ex, j, sampling, policy_version), todo, limit, on_done)

    async def _arun_sync(
        self,
        todo: list[tuple[Example, int]],
        limit: int,
        sampling: SamplingParams | None,
        policy_version: int,
        on_done: Callable[[Trajectory], None] | None,
    ) -> list[Trajectory]:
        # One step (a model turn plus its observation) of every unfinished item of the wave, then
        # a barrier: the same loop, paused and resumed between steps (``arun(prefix=, max_steps=1)``).
        out: list[Trajectory] = []
        for start in range(0, len(todo), limit):
            wave = todo[start : start + limit]
            trajs: list[Trajectory | None] = [None] * len(wave)
            while True:
                live = [i for i, t in enumerate(trajs) if t is None or t.finish_reason == "paused"]
                if not live:
                    break
                steps = [
                    self.arun(  # type: ignore[call-arg]
                        wave[i][0],
                        sample_index=wave[i][1],
                        sampling=sampling,
                        policy_version=policy_version,
                        prefix=trajs[i],
                        max_steps=1,
                    )
                    for i in live
                ]
                for i, t in zip(live, await asyncio.gather(*steps), strict=True):
                    trajs[i] = t
                    if t.finish_reason != "paused" and on_done is not None:
                        on_done(t)
            out.extend(t for t in trajs if t is not None)
        return out
