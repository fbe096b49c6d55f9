"""The generation dtype of the in-process (hf) backend, which loads its weights on the CPU, and
why it was chosen.

``auto`` picks bfloat16 where the CPU computes it natively, with AMX-BF16 (Sapphire Rapids and
later) or AVX512-BF16 (Cooper Lake, Zen 4): oneDNN runs bf16 matmuls there at about twice the
rate of fp32, and a decode step, bound by reading the weights, reads half the bytes.
On a CPU without either (AVX2 only) torch emulates bf16 by converting to fp32 and back, which is
no faster (measured on this project's AVX2 machine: docs/performance.md), so ``auto`` stays fp32.

bf16 generation beside an fp32 trainer is the mismatch GPU RL frameworks live with (a bf16
engine, an fp32 or mixed-precision trainer); ``algo.rollout_correction`` weighs it, and the
``mismatch/*`` metrics measure it.
"""

from __future__ import annotations

from typing import Any

DTYPES = ("float32", "bfloat16", "float16", "auto")


def cpu_bf16_support() -> str | None:
    """The CPU's native bf16 instructions by name ("AMX-BF16", "AVX512-BF16"), or None."""
    import torch

    caps: dict[str, Any] = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    if caps.get("amx_bf16"):
        return "AMX-BF16"
    if caps.get("avx512_bf16"):
        return "AVX512-BF16"
    return None


def choose_dtype(requested: str) -> tuple[str, str]:
    """The torch dtype name to generate in for ``requested`` (one of :data:`DTYPES`), and a
    sentence saying why (for the log)."""
    if requested not in DTYPES:
        raise ValueError(f"backend dtype must be one of {', '.join(DTYPES)}, got {requested!r}")
    if requested != "auto":
        return requested, "as configured"
    native = cpu_bf16_support()
    if native:
        return "bfloat16", f"auto: the CPU has {native}"
    return "float32", "auto: the CPU has neither AMX-BF16 nor AVX512-BF16 (bf16 would be emulated, no faster)"
