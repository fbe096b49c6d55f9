"""``harness train --plan`` against ``torch.cuda.max_memory_allocated`` for SmolLM2 in bf16 on one
GPU (DeepSpeed ZeRO-0, our AdamW; two RL micro-steps through the chunked log-prob path, each with
an optimizer step), within 25 %, with and without gradient checkpointing. Prints both figures
(run with ``-rP``). NOT RUN in the session that wrote it (no GPU was lent): its first GPU run is
its first test."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_plan_matches_max_memory_allocated_for_smollm2(checkpointing):
    import torch

    from scripts.perf.plan_memory import GiB, measure, planned

    mb, seq = 4, 2048
    peak = measure(mb, seq, checkpointing, "cuda")
    est = planned(mb, seq, True, checkpointing)
    print(
        f"SmolLM2 bf16 on {torch.cuda.get_device_name()}: micro-batch {mb} x {seq} tokens, checkpointing "
        f"{checkpointing}: max_memory_allocated {peak / GiB:.2f} GiB, --plan {est / GiB:.2f} GiB ({est / peak:.2f}x)"
    )
    assert est == pytest.approx(peak, rel=0.25)
