"""``eval_vs_limit.py``'s replay against a real SGLang: with ``ignore_eos`` every call generates
exactly its recorded length, and after the warm-up pass each finds its input in the prefix cache."""

from __future__ import annotations

import pytest

from harness.engines import EngineConfig, engine_dir, engine_ready, launched
from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]


def test_replay_generates_the_recorded_lengths_from_a_warm_cache(tmp_path, model_dir):
    if not engine_ready("sglang"):
        pytest.skip(f"no sglang venv under {engine_dir()}: run make engines")
    from scripts.perf.eval_vs_limit import Call, replay

    prompt = list(range(100, 160))
    calls = [Call(tuple(prompt), 5), Call(tuple(prompt + [7, 8, 9]), 40), Call(tuple(prompt[:30]), 12)]
    cfg = EngineConfig(device="cpu", args=checks.ENGINE_ARGS["sglang"])
    with launched("sglang", model_dir, cfg, log_dir=tmp_path) as proc:
        rep = replay(proc.url, calls)
    assert rep.tokens == 5 + 40 + 12 and rep.mismatched == 0
    assert rep.cached >= sum(len(c.input_ids) for c in calls) - len(calls)  # all but (at most) the last token
