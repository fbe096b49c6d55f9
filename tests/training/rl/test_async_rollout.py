"""The asynchronous producer: AReaL's staleness gate by hand, the bound under a delayed worker,
pausing for ``interrupt: finish``, errors and shutdown (generation stand-ins; no model)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from training.rl.async_rollout import AsyncRollouts, StalenessGate


def test_gate_is_areals_formula_in_groups():
    # capacity = min(max_running − running, (max_staleness + v + 1)·G − (accepted + running))
    g = StalenessGate(max_staleness=1, groups_per_step=2, max_running=3)
    assert g.capacity(0) == min(3 - 0, (1 + 0 + 1) * 2 - 0) == 3
    for _ in range(3):
        g.on_submit()
    assert g.capacity(0) == min(0, 4 - 3) == 0
    g.on_finish(accepted=True)
    g.on_finish(accepted=True)  # running 1, accepted 2
    assert g.capacity(0) == min(2, 4 - 3) == 1
    assert g.capacity(1) == min(2, 6 - 3) == 2
    g.on_drop()  # a stale group never trained on frees its slot
    assert g.capacity(0) == min(2, 4 - 2) == 2
    g.on_finish(accepted=False)  # an error: the slot frees, nothing accepted
    assert (g.running, g.accepted) == (0, 1)
    # a resumed run at version 5 has consumed 5·G groups
    assert StalenessGate(0, 4, 8, start_version=5).capacity(5) == min(8, (0 + 5 + 1) * 4 - 20) == 4
    with pytest.raises(ValueError, match="max_staleness >= 0"):
        StalenessGate(-1, 2, 2)


def _producer(delays: dict[int, float], max_staleness: int, groups_per_step: int = 2, hold=None, **kw):
    """A producer whose group ``seq`` takes ``delays.get(seq, 0.01)`` seconds (group 1 also waits
    for ``hold``, an Event, when given); its 'trajectories' record (seq, version started on)."""
    started: list[tuple[int, int]] = []
    prompts = iter(range(10**6))

    async def run_group(example, seq, version):
        started.append((seq, version))
        await asyncio.sleep(delays.get(seq, 0.01))
        while hold is not None and seq == 1 and not hold.is_set():
            await asyncio.sleep(0.005)
        return [(example, seq, version)]

    p = AsyncRollouts(run_group, lambda: next(prompts), groups_per_step, max_staleness, **kw)
    return p, started


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_the_bound_holds_when_one_worker_is_delayed(max_staleness):
    """Group 1 (started on version 0) is held until the trainer has moved ``max_staleness + 2``
    versions on: it must never reach the trainer; it is dropped and counted. With
    ``max_staleness`` 0 the trainer cannot move on without it (the gate starts only one step's
    groups), so it is released at once and trained on at version 0."""
    hold = threading.Event()
    release_at = 0 if max_staleness == 0 else max_staleness + 2
    p, started = _producer({}, max_staleness, hold=hold, max_running=4)
    taken = []
    with p:
        for v in range(release_at + 3):  # the trainer: take a step's groups, "update", serve v + 1
            if v == release_at:
                hold.set()
                time.sleep(0.1)  # it lands in the buffer, late
            groups, st = p.take(2, v, timeout=10)
            assert all(0 <= g.staleness(v) <= max_staleness for g in groups)
            assert st.staleness == [g.staleness(v) for g in groups]
            taken += [(g.seq, g.head_version, v) for g in groups]
            p.set_version(v + 1)
    seqs = [s for s, _, _ in taken]
    assert len(seqs) == len(set(seqs))  # each group trained on once
    assert dict(started)[1] == 0
    if max_staleness == 0:  # synchronous in effect: every group trained at the version it started on
        assert 1 in seqs and all(head == at for _, head, at in taken)
    else:
        assert 1 not in seqs and p.dropped == 1


def test_staleness_zero_never_starts_ahead_of_the_trainer():
    p, started = _producer({}, 0, groups_per_step=3, max_running=10)
    with p:
        p.take(3, 0, timeout=5)
        time.sleep(0.1)
        assert len(started) == 3  # (0 + 0 + 1)·3: nothing more may start until version 1
        p.set_version(1)
        p.take(3, 1, timeout=5)
        time.sleep(0.1)
        assert len(started) == 6 and {v for _, v in started[3:]} == {1}


def test_paused_waits_for_the_running_groups_and_starts_none():
    p, started = _producer({0: 0.3, 1: 0.3}, 2, max_running=2)
    with p:
        time.sleep(0.05)  # groups 0 and 1 are running
        with p.paused() as waited:
            assert waited >= 0.15
            assert p.stats()["running"] == 0
            n = len(started)
            time.sleep(0.1)
            assert len(started) == n  # nothing started while paused
        time.sleep(0.1)
        assert len(started) > n  # and it resumes


def test_a_producer_error_reaches_the_trainer():
    async def run_group(example, seq, version):
        raise KeyError("broken reward input")

    p = AsyncRollouts(run_group, lambda: 0, 1, 1)
    with p, pytest.raises(RuntimeError, match="producer failed") as e:
        p.take(1, 0, timeout=5)
    assert isinstance(e.value.__cause__, KeyError)


def test_take_times_out_and_close_cancels_running_groups():
    cancelled = threading.Event()

    async def run_group(example, seq, version):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return []

    p = AsyncRollouts(run_group, lambda: 0, 1, 1).start()
    with pytest.raises(TimeoutError, match="0/1 groups"):
        p.take(1, 0, timeout=0.2)
    t0 = time.perf_counter()
    p.close()
    assert cancelled.is_set() and time.perf_counter() - t0 < 5


def test_close_shuts_down_in_order_and_is_idempotent():
    """Issue 31, defect 6: the producer's groups end (cancelled), its event loop closes (with the
    threads of its executor), then its thread; a second close is a no-op, and the exit hook goes."""
    import atexit

    seen_loop: list[asyncio.AbstractEventLoop] = []

    async def run_group(example, seq, version):
        seen_loop.append(asyncio.get_running_loop())
        await asyncio.to_thread(time.sleep, 0.05)  # a retriever call: an executor thread of the loop
        return [seq]

    p = AsyncRollouts(run_group, lambda: 0, 2, 1).start()
    p.take(2, 0, timeout=30)
    unregistered: list = []
    real = atexit.unregister
    atexit.unregister = lambda fn: (unregistered.append(fn), real(fn))[1]  # see that close drops its hook
    try:
        p.close()
        p.close()
    finally:
        atexit.unregister = real
    assert not p.running and seen_loop[0].is_closed()
    assert unregistered and unregistered[0] == p.close
    assert not [t for t in threading.enumerate() if t.name == "async-rollouts"]


EXIT_WITHOUT_CLOSE = r"""
import asyncio, atexit, sys, threading, time
from training.rl.async_rollout import AsyncRollouts

def report():  # registered first, so it runs after the producer's own exit hook
    alive = [t.name for t in threading.enumerate() if t.name == "async-rollouts"]
    print("producer threads at exit:", alive, flush=True)

atexit.register(report)

async def run_group(example, seq, version):
    await asyncio.to_thread(time.sleep, 0.02)
    return [seq]

p = AsyncRollouts(run_group, lambda: 0, 2, 4).start()
p.take(2, 0, timeout=30)
raise SystemExit(3 if sys.argv[1] == "error" else 0)  # the trainer's close() is never reached
"""


@pytest.mark.parametrize("how", ["error", "normal"])
def test_a_producer_left_running_is_stopped_before_the_interpreter_exits(tmp_path, how):
    """An exit path that never calls close() (an error in a step outside Trainer.train, a test that
    steps by hand): the exit hook stops the producer before the interpreter tears down, so the
    process exits with its own status instead of aborting (SIGABRT, 134)."""
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(EXIT_WITHOUT_CLOSE)
    for _ in range(3):  # the abort it prevents was intermittent
        r = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=120)
        assert r.returncode == (3 if how == "error" else 0), r.stderr[-2000:]
        assert "producer threads at exit: []" in r.stdout and "terminate called" not in r.stderr
