"""``harness train --plan`` (training.memory_plan): DeepSpeed's own estimators, every recipe,
the knob it names, the shipped architectures, and (slow) SmolLM2's measured peak on CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import compose
from harness.ports import child_env
from training.config import TrainConfig
from training.memory_plan import GiB, _produced_by, arch_of, model_states, plan, plan_recipe, shipped_archs

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs" / "train").rglob("*.yaml"))

# Parameter counts of the checkpoints (their model cards): the shipped configs must rebuild them.
PARAMS = {
    "qwen2.5-3b": 3.09e9,
    "qwen2.5-7b": 7.62e9,
    "qwen3-8b": 8.19e9,
    "llama-3.1-8b": 8.03e9,
    "smollm2-135m": 0.135e9,
}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_shipped_architectures_rebuild_the_checkpoints_parameter_counts(name):
    a = arch_of(str(shipped_archs()[name]))
    assert a.params == pytest.approx(PARAMS[name], rel=0.01)
    assert json.loads(shipped_archs()[name].read_text())["_source"].startswith("the architecture fields of https://")


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3.1-8b", "smollm2-135m"])
@pytest.mark.parametrize("gpus", [1, 4, 8, 16])
def test_model_states_equal_deepspeeds_estimators(name, gpus, capsys):
    from deepspeed.runtime.zero.stage3 import (
        estimate_zero3_model_states_mem_needs,
        estimate_zero3_model_states_mem_needs_all_cold,
    )
    from deepspeed.runtime.zero.stage_1_and_2 import (
        estimate_zero2_model_states_mem_needs,
        estimate_zero2_model_states_mem_needs_all_cold,
    )

    a = arch_of(str(shipped_archs()[name]))
    z2 = sum(model_states(a.params, a.params, a.largest_layer, 2, gpus, bf16=True).values())
    z3 = sum(model_states(a.params, a.params, a.largest_layer, 3, gpus, bf16=True).values())
    assert z2 == pytest.approx(estimate_zero2_model_states_mem_needs(a.params, gpus, 1, cpu_offload=False)[1], abs=2)
    ds3 = estimate_zero3_model_states_mem_needs(a.params, a.largest_layer, gpus, 1, cpu_offload=False)[1]
    assert z3 == pytest.approx(ds3, abs=2)
    # The printed tables (the *_all_cold entry points): the no-offload row's per-GPU figure, in GiB.
    estimate_zero2_model_states_mem_needs_all_cold(a.params, gpus, 1)
    estimate_zero3_model_states_mem_needs_all_cold(a.params, a.largest_layer, gpus, 1)
    out = capsys.readouterr().out
    z2_row = re.search(r"\|\s*([\d.]+)GB \| offload_optimizer=none", out)
    z3_row = re.search(r"\|\s*([\d.]+)GB \| offload_param=none, offload_optimizer=none", out)
    assert float(z2_row.group(1)) == pytest.approx(z2 / GiB, abs=0.006)
    assert float(z3_row.group(1)) == pytest.approx(z3 / GiB, abs=0.006)


def test_zero_stages_and_lora_shrink_model_states():
    a = arch_of(str(shipped_archs()["qwen2.5-7b"]))
    totals = [sum(model_states(a.params, a.params, a.largest_layer, s, 8, True).values()) for s in range(4)]
    assert totals == sorted(totals, reverse=True) and totals[0] == 20 * a.params  # bf16 ZeRO-0: 2 + 6 + 12 B
    lora = sum(model_states(a.params, 16 * a.lora_per_r, a.largest_layer, 2, 8, True).values())
    assert 2 * a.params < lora < 2.05 * a.params  # frozen bf16 base + small adapter states


def test_an_oversized_plan_names_a_knob_that_makes_it_fit():
    cfg = compose(
        TrainConfig,
        [ROOT / "configs/train/research_grpo_qwen2.5_7b.yaml"],
        ["model.gradient_checkpointing=false", "model.logits_chunk_tokens=0", "optim.zero_stage=2"],
    )
    p = plan(cfg, gpus=8, gpu_mem_gb=80)
    assert not p.fits and p.max_micro_batch == 0
    assert "model.gradient_checkpointing=true" in p.knob and "optim.micro_batch_size=" in p.knob
    sets = p.knob.split()
    # the named settings fit (re-planned from the same starting point plus the knob)
    again = compose(
        TrainConfig,
        [ROOT / "configs/train/research_grpo_qwen2.5_7b.yaml"],
        ["model.logits_chunk_tokens=0", "optim.zero_stage=2", *sets],
    )
    assert plan(again, gpus=8, gpu_mem_gb=80).fits
    # micro-batch alone: the largest that fits is what it names
    cfg = compose(TrainConfig, [ROOT / "configs/train/research_grpo_qwen2.5_7b.yaml"], ["optim.micro_batch_size=64"])
    p = plan(cfg, gpus=8, gpu_mem_gb=80)
    assert not p.fits and p.knob.startswith(f"optim.micro_batch_size={p.max_micro_batch} ")


def test_checkpointing_and_chunking_cut_activations_and_logits():
    base = ROOT / "configs/train/research_grpo_qwen2.5_7b.yaml"
    on = plan(compose(TrainConfig, [base], []))
    off = plan(compose(TrainConfig, [base], ["model.gradient_checkpointing=false", "model.logits_chunk_tokens=0"]))
    assert off.parts["activations"] > 10 * on.parts["activations"]
    assert off.parts["logits chunk"] > 20 * on.parts["logits chunk"]


def test_the_prorag_rl_plan_puts_one_bf16_prm_on_local_rank_0_or_none_when_served():
    f = ROOT / "configs/train/prorag_dual_granularity.yaml"
    p = plan(compose(TrainConfig, [f], []))
    assert p.parts["PRM (local rank 0)"] == 2 * p.arch.params
    served = plan(compose(TrainConfig, [f], ["algo.step_scorer_path=null", "algo.step_scorer_url=http://h:1"]))
    assert "PRM (local rank 0)" not in served.parts


def test_a_demo_model_is_planned_before_the_demo_ran(tmp_path, monkeypatch):
    """The GRPO demo recipe starts from ``runs/demo/sft/model/final``, which only ``make demo``
    writes: on a fresh clone the planner traces it to the SFT recipe's model (CI caught this)."""
    monkeypatch.chdir(tmp_path)  # no runs/ here
    assert _produced_by("runs/demo/sft/model/final") == "smollm2-135m-instruct"
    assert _produced_by("runs/demo/rl/final") == "smollm2-135m-instruct"
    assert _produced_by("runs/nobody/final") == "runs/nobody/final"  # untraceable: left as named


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_plan_covers_every_recipe(recipe, monkeypatch):
    """``harness train --plan`` on every file in configs/train: a plan for each recipe and each
    train stage of a chain, and a plain "nothing to plan" for eval/MCTS configs. In process (typer's
    runner): a subprocess per recipe paid ~6 s of imports each, 2.5 minutes of the suite;
    :func:`test_plan_cli_in_its_own_process` keeps one real process."""
    from typer.testing import CliRunner

    from cli.main import app

    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(app, ["train", "--plan", "-c", recipe])
    text = " ".join(res.output.split())  # the CLI prints on stderr (cli.common)
    assert res.exit_code == 0, res.output[-2000:]
    plans = plan_recipe([str(ROOT / recipe)]) if "chain" in recipe else None
    assert ("FITS" in text) or ("nothing to plan" in text), text[-500:]
    if plans is not None:
        assert text.count("total per rank") == len(plans) >= 2


@pytest.mark.slow
def test_plan_cli_in_its_own_process():
    """``harness train --plan`` as a user runs it: its own process, exit 0, a plan on stderr."""
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "train", "--plan", "-c", "configs/train/smollm2_cpu_grpo_demo.yaml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "FITS" in " ".join(out.stderr.split()), out.stderr[-500:]


@pytest.mark.slow
def test_plan_matches_smollm2_measured_on_cpu():
    """The plan against the measured peak of two real micro-steps (DeepSpeed, AdamW) of SmolLM2 on CPU."""
    # A clean rendezvous: this test process may have set MASTER_PORT for its own (still listening)
    # single-process DeepSpeed group, and a child inheriting it would fail to bind the port.
    env = child_env()
    out = subprocess.run(
        [sys.executable, "-m", "scripts.perf.plan_memory", "--device", "cpu", "--micro-batch", "1"] + ["--seq", "384"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"measured peak ([\d.]+) GiB, --plan ([\d.]+) GiB", out.stdout)
    print(out.stdout)
    assert m and float(m.group(2)) == pytest.approx(float(m.group(1)), rel=0.25)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpus", "0"], "--gpus must be at least 1"),
        (["--gpus", "-2"], "--gpus must be at least 1"),
        (["--gpu-mem", "-5"], "--gpu-mem must be a positive number of GB"),
        (["--gpu-mem", "nan"], "--gpu-mem must be a positive number of GB"),
    ],
)
def test_plan_refuses_no_gpus_and_no_memory(flags, message):
    """Issue 44: ``train --plan`` planned for 0 or -2 GPUs of -5 GB."""
    from typer.testing import CliRunner

    from cli.main import app

    recipe = str(ROOT / "configs" / "train" / "smollm2_cpu_sft_demo.yaml")
    res = CliRunner().invoke(app, ["train", "--plan", "-c", recipe, *flags])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and message in said and "FITS" not in said, said
