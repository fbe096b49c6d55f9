"""Real vLLM (CPU, float32) through the ``openai`` backend: the agent, stop semantics, logprobs,
``n`` and greedy parity with ``hf``."""

from __future__ import annotations

import pytest

from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]


@pytest.fixture(scope="module")
def backend(vllm_server, model_dir):
    from harness.backends.openai import OpenAIBackend

    b = OpenAIBackend(vllm_server.url, model=model_dir)
    yield b
    b.close()


def test_agent_runs_on_demo(backend):
    checks.check_agent_on_demo(backend)


def test_length_finish(backend):
    checks.check_length_finish(backend)


def test_eos_finish(backend):
    checks.check_eos_finish(backend)


def test_stop_string_kept(backend, hf_backend):
    checks.check_stop_string_kept(backend, hf_backend)


def test_logprobs(backend):
    checks.check_logprobs(backend)


def test_n_samples_in_one_request(backend):
    checks.check_n_samples(backend)


def test_greedy_parity_with_hf(backend, hf_backend):
    checks.check_greedy_parity(backend, hf_backend)
