"""``scripts/perf/compute_floor.py``: its FLOP count of SmolLM2's body by hand, and a CI-sized run."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(scope="module")
def smollm2():
    from training.config import ModelConfig
    from training.engine import build_model

    return build_model(ModelConfig())


def test_body_flops_by_hand(smollm2):
    """30 layers of q, o (576 x 576), k, v (576 x 192) and the MLP (3 x 576 x 1536): 106,168,320
    weights, 2 FLOPs each a token; attention's QK^T and AV: 4 x tokens x 9 heads x 64 a layer."""
    from scripts.perf.compute_floor import body_flops

    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    assert per_layer * 30 == 106_168_320
    assert body_flops(smollm2, 2, 10) == 2 * 10 * (2 * 106_168_320 + 4 * 10 * 576 * 30)


@pytest.mark.slow
def test_a_tiny_run_prints_the_rates_and_the_gradient_check(monkeypatch, capsys):
    from scripts.perf import compute_floor

    monkeypatch.setattr(sys, "argv", ["compute_floor.py", "--rows", "1", "--tokens", "16", "--repeats", "1"])
    compute_floor.main()
    out = capsys.readouterr().out
    assert "gradients with checkpointing on and off: bitwise equal" in out
    assert out.count("GFLOP/s") == 4 and "checkpointing off" in out and "checkpointing on" in out
