"""The generation dtype: ``auto`` picks bf16 only where the hardware computes it natively."""

from __future__ import annotations

import pytest

from harness.backends import dtype as dt
from harness.eval_config import BackendConfig, EvalConfig


@pytest.mark.parametrize(
    ("native", "chosen"), [("AMX-BF16", "bfloat16"), ("AVX512-BF16", "bfloat16"), (None, "float32")]
)
def test_auto_picks_bf16_only_on_a_cpu_with_native_bf16(monkeypatch, native, chosen):
    monkeypatch.setattr(dt, "cpu_bf16_support", lambda: native)
    name, why = dt.choose_dtype("auto")
    assert name == chosen
    assert (native or "neither") in why


def test_an_explicit_dtype_is_kept_and_an_unknown_one_is_refused():
    assert dt.choose_dtype("bfloat16") == ("bfloat16", "as configured")
    with pytest.raises(ValueError, match="backend dtype must be one of .*'fp8'"):
        dt.choose_dtype("fp8")
    with pytest.raises(ValueError, match="backend.dtype must be one of .*'half'"):
        BackendConfig(dtype="half")


def test_this_machines_answer_matches_its_capabilities():
    import torch

    caps = torch.cpu.get_capabilities()
    native = caps.get("amx_bf16") or caps.get("avx512_bf16")
    assert dt.choose_dtype("auto")[0] == ("bfloat16" if native else "float32")


def test_an_auto_runs_identity_records_the_dtype_it_resolved_to(monkeypatch):
    from benchmarks.build import split_config

    for native, chosen in (("AMX-BF16", "bfloat16"), (None, "float32")):
        monkeypatch.setattr(dt, "cpu_bf16_support", lambda native=native: native)
        identity, _ = split_config(EvalConfig(backend=BackendConfig(dtype="auto")))
        assert identity["backend"]["dtype"] == chosen
