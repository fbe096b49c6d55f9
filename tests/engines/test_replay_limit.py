"""``eval_vs_limit.py``'s replay against a real SGLang: with ``ignore_eos`` every call generates
exactly its recorded length, and after the warm-up pass each finds exactly its reachable prefix in
the prefix cache (no more: not the retrieved document a later turn's warm-up holds)."""

from __future__ import annotations

import pytest

from harness.engines import EngineConfig, engine_dir, engine_ready, launched
from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]


def test_replay_generates_the_recorded_lengths_from_the_reachable_prefixes(tmp_path, model_dir):
    if not engine_ready("sglang"):
        pytest.skip(f"no sglang venv under {engine_dir()}: run make engines")
    from scripts.perf.eval_vs_limit import Call, plan_replay, replay

    template = list(range(100, 160))
    q1 = template + [300, 301, 302]
    q2 = template + [400, 401]
    out1, out2 = [500 + k for k in range(5)], [600 + k for k in range(40)]
    calls = [
        Call(tuple(q1), 5, 0, tuple(out1)),
        Call(tuple(q1 + out1 + [700 + k for k in range(30)]), 12, 0, tuple(range(800, 812))),
        Call(tuple(q2), 40, 0, tuple(out2)),
    ]
    plan = plan_replay(calls)
    assert plan.hits == [60, 68, 60]  # the template; turn 1's input and output, not the document
    cfg = EngineConfig(device="cpu", args=checks.ENGINE_ARGS["sglang"])
    with launched("sglang", model_dir, cfg, log_dir=tmp_path) as proc:
        rep = replay(proc.url, calls)
    assert rep.tokens == 5 + 12 + 40 and rep.mismatched == 0
    assert rep.off_plan == 0 and rep.cached == rep.planned == 60 + 68 + 60
