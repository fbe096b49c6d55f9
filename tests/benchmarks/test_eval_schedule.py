"""``EvalConfig.schedule`` through :func:`benchmarks.build.build_eval`: its choices are the
method runner's, and a method that cannot pause between steps is refused by name before the run
starts (not a TypeError from inside the loop)."""

from __future__ import annotations

import typing

import pytest

from benchmarks.build import build_eval
from harness.backends.scripted import ScriptedBackend
from harness.eval_config import DatasetConfig, EvalConfig
from pipelines.method import SCHEDULES
from pipelines.methods import check_method_schedule
from tests.pipelines.test_baselines import tiny_model_dir  # noqa: F401  (a fixture)


def test_config_choices_are_the_runner_schedules():
    hint = typing.get_type_hints(EvalConfig)["schedule"]
    assert set(typing.get_args(hint)) == set(SCHEDULES) and EvalConfig().schedule == "async"


def test_a_baseline_is_refused_the_sync_schedule_by_name(tmp_path, tiny_model_dir):  # noqa: F811
    backend = ScriptedBackend([], model_path=tiny_model_dir)
    demo = DatasetConfig(name="demo", limit=2)
    cfg = EvalConfig(method="naive", dataset=demo, out=str(tmp_path), schedule="sync")
    with pytest.raises(ValueError, match=r"--schedule sync.*'naive' cannot"):
        build_eval(cfg, backend=backend)
    assert not any(tmp_path.iterdir())  # refused before anything was written
    run = build_eval(EvalConfig(method="naive", dataset=demo, out=str(tmp_path)), backend=backend)
    assert run.manifest.execution["schedule"] == "async"


def test_every_pair_is_checked_before_the_first_runs(tmp_path):
    """Issue 44: with ``--method search_r1,naive --schedule sync`` the agent ran every item before
    the baseline's pair was refused; now no pair starts."""
    from typer.testing import CliRunner

    from cli.main import app
    from programs.faults.kit import eval_script

    args = ["eval", "--method", "search_r1,naive", "--dataset", "demo", "--backend", "scripted", "--script"]
    args += [str(eval_script(tmp_path)), "--retriever", "memory", "--limit", "2", "--out", str(tmp_path / "runs")]
    res = CliRunner().invoke(app, [*args, "--schedule", "sync"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "naive on demo: schedule 'sync'" in said and "'naive' cannot" in said, said
    assert not (tmp_path / "runs").exists()  # the agent's pair never started
    check_method_schedule("search_r1", "sync")  # each pair's own check, before anything is built: an agent can
    with pytest.raises(ValueError, match="'naive' cannot"):
        check_method_schedule("naive", "sync")
