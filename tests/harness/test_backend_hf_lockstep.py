"""The hf backend's lockstep admission: which rows share a decode batch does not depend on when
the clients send their requests, clients that end (also by an error) release the others, and a
client that never comes back is waited for only so long."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from harness.backends import hf as hf_module
from harness.backends.base import SamplingParams
from harness.backends.hf import HFBackend
from harness.backends.hf_batch import _Running
from harness.backends.lockstep import Lockstep, client, current_client, lockstep_of
from harness.tokenization import byte_tokenizer
from pipelines.concurrency import run_bounded
from tests.helpers.models import random_llama


@pytest.fixture(scope="module")
def tiny():
    tok = byte_tokenizer()
    special = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id}
    model = random_llama(len(tok), 0, max_position_embeddings=512, **special)
    backend = HFBackend(model_obj=model, tokenizer=tok, max_batch_size=4)
    yield backend, tok
    backend.close()


@pytest.fixture()
def admissions(monkeypatch):
    """Every admission as (decode steps run before it, the clients admitted, their prompt lengths)."""
    log: list[tuple[int, list, list[int]]] = []
    real = _Running.admit

    def admit(self, reqs):
        log.append((self.b.steps_run, [r.client for r in reqs], [len(r.input_ids) for r in reqs]))
        return real(self, reqs)

    monkeypatch.setattr(_Running, "admit", admit)
    return log


def _agents(backend, tok, jitter_seed: int, lockstep: bool, clients: int = 6, concurrency: int = 3, most: float = 0.03):
    """``clients`` three-turn agents, at most ``concurrency`` at once, each pausing between turns
    for up to ``most`` seconds, drawn from ``jitter_seed`` (the timing a retrieval or a busy
    machine brings)."""
    jitter = random.Random(jitter_seed)
    pauses = {(c, t): jitter.uniform(0.0, most) for c in range(clients) for t in range(3)}

    async def agent(c: int, gate: Lockstep) -> list[int]:
        try:
            with client((c,) if lockstep else None):
                prompt = tok.encode(f"question {c}:", add_special_tokens=False)
                for turn in range(3):
                    length = 4 + (7 * c + 3 * turn) % 9
                    params = SamplingParams(max_new_tokens=length, temperature=1.0, seed=100 * c + turn)
                    out = await backend.agenerate(prompt, params)
                    await asyncio.sleep(pauses[(c, turn)])
                    prompt = prompt + out.token_ids + tok.encode(" obs;", add_special_tokens=False)
                return prompt
        finally:
            gate.done()

    def run(gate: Lockstep) -> list[list[int]]:
        # The bounded loop RL rollouts run in, whose starts Lockstep.running counts.
        return asyncio.run(run_bounded(agent, [(c, gate) for c in range(clients)], concurrency))

    if lockstep:
        with backend.lockstep(clients, concurrency) as gate:
            return run(gate)
    return run(Lockstep(clients, concurrency))


def test_batches_do_not_depend_on_timing_in_lockstep(tiny, admissions):
    backend, tok = tiny
    runs = []
    for jitter_seed in (1, 2):
        admissions.clear()
        start = backend.steps_run
        outputs = _agents(backend, tok, jitter_seed, lockstep=True)
        runs.append(([(steps - start, who, lengths) for steps, who, lengths in admissions], outputs))
    (first, out1), (second, out2) = runs
    assert first == second  # the same rows admitted together at the same decode steps
    assert out1 == out2
    # Never more clients at once than the loop runs, and every turn of every client admitted.
    assert all(len(who) <= 3 for _, who, _ in first)
    assert sum(len(who) for _, who, _ in first) == 6 * 3
    # Admitted in the clients' order.
    assert all(who == sorted(who) for _, who, _ in first)


def test_without_lockstep_the_same_agents_are_admitted_as_they_come(tiny, admissions):
    # The contrast the lockstep removes: with other pauses, other batches (this is why RL
    # rollouts use it). Checked loosely: the decode step at which each turn is admitted, or the
    # grouping, differs between pauses. Pauses of up to 0.1 s span many decode steps of the tiny
    # model even on a loaded machine (at 0.03 s, three draws once gave the same groups).
    backend, tok = tiny
    shapes = []
    for jitter_seed in (1, 2, 3):
        admissions.clear()
        start = backend.steps_run
        _agents(backend, tok, jitter_seed, lockstep=False, most=0.1)
        shapes.append([(steps - start, sorted(lengths)) for steps, _, lengths in admissions])
    assert len({repr(s) for s in shapes}) > 1


def test_a_client_that_fails_releases_the_others(tiny):
    backend, tok = tiny

    async def main(gate: Lockstep):
        async def good(c: int):
            try:
                with client((c,)):
                    prompt = tok.encode("hi", add_special_tokens=False)
                    return await backend.agenerate(prompt, SamplingParams(max_new_tokens=5))
            finally:
                gate.done()

        async def bad():
            try:
                with client((9,)):
                    raise RuntimeError("a malformed answer")
            finally:
                gate.done()

        return await asyncio.gather(good(0), good(1), bad(), return_exceptions=True)

    with backend.lockstep(3, 3) as gate:
        a, b, err = asyncio.run(asyncio.wait_for(main(gate), timeout=30))
    assert len(a.token_ids) == 5 and a.token_ids == b.token_ids and isinstance(err, RuntimeError)


def test_a_client_that_never_comes_waits_only_so_long(tiny, monkeypatch, caplog):
    backend, tok = tiny
    monkeypatch.setattr(hf_module, "LOCKSTEP_PATIENCE_S", 0.2)

    async def main():
        with client((0,)):
            return await backend.agenerate(tok.encode("hi", add_special_tokens=False), SamplingParams(max_new_tokens=3))

    with caplog.at_level(logging.WARNING, logger="harness.backends.hf"), backend.lockstep(2, 2):
        out = asyncio.run(asyncio.wait_for(main(), timeout=30))
    assert len(out.token_ids) == 3
    assert "1 of 2 clients sent no request" in caplog.text


def test_one_collector_at_a_time_and_keys_stay_in_their_task(tiny):
    backend, _ = tiny
    with backend.lockstep(1, 1), pytest.raises(Exception, match="already running a collector"):
        with backend.lockstep(1, 1):
            pass
    assert backend._gate is None

    async def main():
        async def keyed(k):
            with client(k):
                await asyncio.sleep(0.01)
                return current_client()

        return await asyncio.gather(keyed((1,)), keyed((2,)))

    assert asyncio.run(main()) == [(1,), (2,)] and current_client() is None


def test_lockstep_counts_the_clients_running_or_about_to():
    gate = Lockstep(5, 2)
    assert gate.running == 2
    for expected in (2, 2, 2, 1, 0):
        gate.done()
        assert gate.running == expected
    with pytest.raises(ValueError, match="concurrency >= 1"):
        Lockstep(3, 0)
    # A backend without lockstep (a test's stand-in) still gets a gate to count on.
    with lockstep_of(object(), 3, 2) as gate:
        assert gate.running == 2
