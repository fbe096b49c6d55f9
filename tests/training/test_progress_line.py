"""The training progress line says "reward" only for steps that have one (issue 23 defect 7:
``make demo`` printed "reward 0.000" on every SFT step)."""

from __future__ import annotations

import logging

from training.logging_utils import ProgressBar


def test_sft_steps_show_no_reward_and_rl_steps_do(caplog):
    caplog.set_level(logging.INFO, logger="training.logging_utils")
    with ProgressBar(2, enabled=False) as bar:
        bar.update(1, {"loss": 1.25, "time/step_s": 0.5})
        bar.update(2, {"loss": 0.5, "reward/mean": 0.75})
    sft, rl = (r.getMessage() for r in caplog.records)
    assert sft.startswith("step 1 loss 1.2500") and "reward" not in sft
    assert rl.startswith("step 2 reward 0.750 loss 0.5000")
