"""Asynchronous rollouts: generation that never waits for the trainer, with bounded staleness.

``trainer.async.enabled`` turns :meth:`training.rl.trainer.RLTrainer.step` from "generate the batch,
then update" into a consumer of :class:`AsyncRollouts`: a producer thread, with its own event
loop, keeps rollout groups (one prompt's ``n_samples`` rollouts, each a call of THE agent's
``arun``, as :func:`training.rl.rollout.collect` makes them) in flight against the rollout backend
while the trainer updates, and puts each finished group in a buffer. A step takes
``prompts_per_step`` finished groups from it.

Staleness is bounded as AReaL bounds it (``areal/core/staleness_manager.py``,
``max_head_offpolicyness``): with the trainer at policy version ``v``, a new group may start
only while ``accepted + running < (max_staleness + v + 1) × groups_per_step`` (and fewer than
``max_running`` groups run). That bounds how far generation runs ahead of the trainer, so groups
consumed in the order they started are never more than ``max_staleness`` versions old. The
trainer takes them in the order they *finish*, though: a slow group (five searches) that later
ones overtake can come due past the bound. :meth:`AsyncRollouts.take` checks every group and
drops (and counts, ``async/dropped_stale``) any that is older, so the bound holds however slow a
worker is; a dropped group's generation is lost (``scripts/perf/async_sim.py`` counts 1–2 per
640 groups at staleness 2 on a mixed workload).

A group's *head version* is the weights version served when it started; each model segment
records the version that wrote it (``Segment.version``, from the backend's report). A weight
update lands between completions (the hf backend drains its running rows first; SGLang's
``/update_weights_from_disk`` waits for the requests in flight), so with ``interrupt:
continue`` a trajectory in flight goes on from where it was, its next turns on the new weights;
with ``interrupt: finish`` the trainer pauses the producer around the update
(:meth:`AsyncRollouts.paused`): no new group starts, the running ones end on the old weights,
then the update. Interrupting a completion in the middle (AReaL aborts the request and
re-submits the tokens so far) is not implemented.

The pieces below know nothing of models: ``scripts/perf/async_sim.py`` drives the same
:class:`StalenessGate` and :class:`AsyncRollouts` with a generation stand-in.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


class StalenessGate:
    """AReaL's capacity rule, in groups (not thread-safe: :class:`AsyncRollouts` holds its lock).

    ``capacity(v) = min(max_running − running, (max_staleness + v + 1) × groups_per_step −
    (accepted + running))``. ``accepted`` counts every group that finished and was not dropped;
    a resumed run starts it at ``version × groups_per_step`` (the steps before consumed that many).
    """

    def __init__(self, max_staleness: int, groups_per_step: int, max_running: int, start_version: int = 0) -> None:
        if max_staleness < 0 or groups_per_step < 1 or max_running < 1:
            raise ValueError(
                f"StalenessGate needs max_staleness >= 0, groups_per_step >= 1 and max_running >= 1, got "
                f"{max_staleness}, {groups_per_step}, {max_running}"
            )
        self.max_staleness, self.groups_per_step, self.max_running = max_staleness, groups_per_step, max_running
        self.accepted = start_version * groups_per_step
        self.running = 0
        self.submitted = 0

    def capacity(self, version: int) -> int:
        """New groups that may start now, with the trainer at ``version`` (≤ 0: none)."""
        by_concurrency = self.max_running - self.running
        by_staleness = (self.max_staleness + version + 1) * self.groups_per_step - (self.accepted + self.running)
        return min(by_concurrency, by_staleness)

    def on_submit(self) -> None:
        self.submitted += 1
        self.running += 1

    def on_finish(self, accepted: bool) -> None:
        """A running group ended: into the buffer (``accepted``), or lost to an error."""
        self.running -= 1
        self.accepted += int(accepted)

    def on_drop(self) -> None:
        """An accepted group was found too stale and never trained on: its slot is free again."""
        self.accepted -= 1


@dataclass
class RolloutGroup:
    """One prompt's finished rollouts, with the version its generation started on."""

    example: Any
    trajectories: list[Any]
    head_version: int  # the weights version served when the group started
    seq: int  # submission order (its seeds derive from it)
    started_at: float = 0.0
    finished_at: float = 0.0

    def staleness(self, version: int) -> int:
        """Policy versions between the group's start and a trainer at ``version``."""
        return version - self.head_version

    def segment_versions(self) -> list[int]:
        """The versions that wrote the group's model segments (where the backend reported one)."""
        return [
            s.version
            for t in self.trajectories
            for s in getattr(t, "segments", [])
            if s.role == "model" and getattr(s, "version", None) is not None
        ]


@dataclass
class TakeStats:
    """What one :meth:`AsyncRollouts.take` saw: the trainer's wait, the buffer, the staleness."""

    wait_s: float  # the trainer idle, waiting for finished groups
    buffer_after: int  # groups left in the buffer after the take
    running: int  # groups generating at the take
    dropped: int  # groups dropped as too stale during this take
    staleness: list[int] = field(default_factory=list)  # per taken group, head staleness

    def metrics(self, dropped_total: int) -> dict[str, float]:
        s = self.staleness or [0]
        return {
            "async/trainer_wait_s": self.wait_s,
            "async/buffer_depth": float(self.buffer_after),
            "async/running_groups": float(self.running),
            "async/staleness_mean": sum(s) / len(s),
            "async/staleness_max": float(max(s)),
            "async/dropped_stale": float(dropped_total),
        }


# A group's rollouts: (example, group seq, head version) → trajectories.
RunGroup = Callable[[Any, int, int], Awaitable[list[Any]]]


class AsyncRollouts:
    """The producer and its buffer; see the module docstring.

    ``run_group(example, seq, version)`` makes one group's rollouts; ``next_prompt()`` gives the
    next example (called on the producer's thread; :class:`training.rl.rollout.PromptSampler` behind
    a lock). ``version`` is the trainer's policy version the backend serves when it starts.
    """

    def __init__(
        self,
        run_group: RunGroup,
        next_prompt: Callable[[], Any],
        groups_per_step: int,
        max_staleness: int,
        max_running: int | None = None,
        version: int = 0,
    ) -> None:
        self.run_group, self.next_prompt = run_group, next_prompt
        self.max_staleness = max_staleness
        self.gate = StalenessGate(max_staleness, groups_per_step, max_running or groups_per_step, version)
        self._version = version
        self._cond = threading.Condition()  # guards the gate, the buffer, the flags below
        self._buffer: list[RolloutGroup] = []
        self._paused = False
        self._closing = False
        self._error: BaseException | None = None
        self.dropped = 0
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> AsyncRollouts:
        """Start the producer thread (idempotent). It is stopped by :meth:`close`, and at the latest
        when the interpreter exits (an ``atexit`` hook): a producer thread or event loop still
        running at exit can abort the process ("terminate called without an active exception",
        exit 134) after the run itself succeeded."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._thread_main, name="async-rollouts", daemon=True)
            self._thread.start()
            self._started.wait()
            atexit.register(self.close)
        return self

    def close(self, timeout: float = 60.0) -> None:
        """Shut down in order (idempotent): stop starting groups, cancel the running ones and wait
        for them, end the event loop (``asyncio.run`` closes it after its executor's threads end),
        then join the thread; the buffer is dropped."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("async rollouts: the producer did not stop within %.0f s", timeout)
                return  # the exit hook tries again
        atexit.unregister(self.close)

    @property
    def running(self) -> bool:
        """Whether the producer thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> AsyncRollouts:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the trainer's side ------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """The backend now serves ``version``: groups started from here on carry it, and the
        staleness bound lets that many more groups start."""
        with self._cond:
            self._version = version
            self._drop_stale_locked()
        self._poke()

    def take(
        self, n: int, version: int | None = None, timeout: float | None = None
    ) -> tuple[list[RolloutGroup], TakeStats]:
        """The ``n`` earliest-finished groups at most ``max_staleness`` versions behind ``version``
        (default: the current one), waiting for them; older groups are dropped and counted.
        Raises the producer's error, or ``TimeoutError`` after ``timeout`` seconds."""
        t0 = time.perf_counter()
        v = self._version if version is None else version
        dropped_before = self.dropped
        with self._cond:
            while True:
                if self._error is not None:
                    raise RuntimeError("async rollouts: the producer failed") from self._error
                self._drop_stale_locked(v)
                if len(self._buffer) >= n:
                    break
                if self._closing:
                    raise RuntimeError("async rollouts: closed while the trainer waited for groups")
                left = None if timeout is None else timeout - (time.perf_counter() - t0)
                if left is not None and left <= 0:
                    raise TimeoutError(f"async rollouts: {len(self._buffer)}/{n} groups after {timeout} s")
                self._cond.wait(left)
            taken, self._buffer = self._buffer[:n], self._buffer[n:]
            stats = TakeStats(
                wait_s=time.perf_counter() - t0,
                buffer_after=len(self._buffer),
                running=self.gate.running,
                dropped=self.dropped - dropped_before,
                staleness=[g.staleness(v) for g in taken],
            )
        self._poke()
        return taken, stats

    @contextlib.contextmanager
    def paused(self, timeout: float | None = None) -> Iterator[float]:
        """No new group starts and the running ones finish (``interrupt: finish``); yields the
        seconds waited for them. The producer resumes on exit."""
        t0 = time.perf_counter()
        with self._cond:
            self._paused = True
            while self.gate.running > 0 and self._error is None and not self._closing:
                if not self._cond.wait(timeout):
                    break
        try:
            yield time.perf_counter() - t0
        finally:
            with self._cond:
                self._paused = False
            self._poke()

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "buffer": len(self._buffer),
                "running": self.gate.running,
                "submitted": self.gate.submitted,
                "accepted": self.gate.accepted,
                "dropped": self.dropped,
            }

    # ---- internals ---------------------------------------------------------------------------
    def _drop_stale_locked(self, version: int | None = None) -> None:
        v = self._version if version is None else version
        keep = [g for g in self._buffer if g.staleness(v) <= self.max_staleness]
        for _ in range(len(self._buffer) - len(keep)):
            self.gate.on_drop()
            self.dropped += 1
        if len(keep) != len(self._buffer):
            logger.warning(
                "async rollouts: dropped %d group(s) more than %d version(s) behind %d",
                len(self._buffer) - len(keep),
                self.max_staleness,
                v,
            )
        self._buffer = keep

    def _poke(self) -> None:
        """Wake the producer loop from any thread."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(wake.set)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as e:  # surfaced to the trainer by take()
            with self._cond:
                self._error = e
                self._cond.notify_all()

    async def _produce(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        tasks: set[asyncio.Task] = set()
        try:
            while True:
                self._wake.clear()
                with self._cond:
                    if self._closing:
                        return
                    if self._error is not None:
                        raise self._error
                    room = 0 if self._paused else self.gate.capacity(self._version)
                    version = self._version
                    for _ in range(max(0, room)):
                        self.gate.on_submit()
                starts = [(self.next_prompt(), self._next_seq()) for _ in range(max(0, room))]
                for ex, seq in starts:
                    task = asyncio.create_task(self._one(ex, seq, version))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if not starts:
                    await self._wake.wait()
        finally:
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq - 1

    async def _one(self, example: Any, seq: int, version: int) -> None:
        started = time.perf_counter()
        try:
            trajs = await self.run_group(example, seq, version)
        except asyncio.CancelledError:
            with self._cond:
                self.gate.on_finish(accepted=False)
            raise
        except BaseException as e:  # a bug, not an item fault (the agent records those on the item)
            with self._cond:
                self.gate.on_finish(accepted=False)
                self._error = e
                self._cond.notify_all()
            self._poke()
            return
        group = RolloutGroup(example, list(trajs), version, seq, started, time.perf_counter())
        with self._cond:
            self.gate.on_finish(accepted=True)
            self._buffer.append(group)
            self._cond.notify_all()
        if self._wake is not None:
            self._wake.set()
