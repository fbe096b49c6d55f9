"""Recipe values that passed validation and then crashed or trained nothing (issue 44, defects 4
and 6 and the smaller findings on ranges): each is refused when the recipe loads, naming its key,
exit 2, and no run folder is made."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from benchmarks.tiny_recipes import sft_recipe
from cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.micro_batch_size=0", "optim.micro_batch_size must be at least 1, got 0"),  # was a ZeroDivisionError
        ("trainer.max_steps=0", "trainer.max_steps must be at least 1, got 0"),  # exited 0 with an untrained final/
        ("trainer.max_steps=-3", "trainer.max_steps must be at least 1, got -3"),
        ("sft.batch_size=0", "sft.batch_size must be at least 1, got 0"),  # failed late, naming no key
        ("optim.lr=.nan", "optim.lr: expected a finite number, got nan"),
        ("optim.lr=-1", "optim.lr must be at least 0"),
        ("retriever.timeout=.inf", "retriever.timeout: expected a finite number, got inf"),
        ("optim.min_lr_ratio=2", "optim.min_lr_ratio must be in [0, 1], got 2.0"),  # was 'optim.optim.min_lr_ratio'
        ("rollout.backend.engine.port=99999", "rollout.backend.engine.port must be in [1, 65535], got 99999"),
        ("algo.gamma=1.5", "algo.gamma must be in [0, 1], got 1.5"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_its_key(tmp_path, override, message):
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", "-c", str(sft_recipe(tmp_path)), "--out", str(run), override])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.exception, out)
    assert message in out and "optim.optim" not in out, out
    assert not run.exists()


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("on: 1\n", "unknown config key true at the top level"),
        ("optim:\n  yes: 1\n", "unknown config key true in 'optim'"),
        ("trainer:\n  async:\n    1: x\n", "unknown config key 1 in 'trainer.async'"),
        ("rollout:\n  backend:\n    engine:\n      ~: 1\n", "unknown config key null in 'rollout.backend.engine'"),
        (
            "rollout:\n  backend:\n    engine:\n      env: {on: 1}\n",
            "unknown config key true in 'rollout.backend.engine.env'",
        ),
        ("model:\n  tiny: {1: 2}\n", "unknown config key 1 in 'model.tiny'"),
        ("sft:\n  sources: [{kind: chat, path: x, no: 1}]\n", "unknown config key false in 'sft.sources[0]'"),
    ],
)
def test_a_recipe_key_yaml_reads_as_no_string_is_named(tmp_path, yaml_text, message):
    """Issue 44 defect 4, in a recipe: a TypeError traceback from the did-you-mean hint."""
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml_text)
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", "-c", str(sft_recipe(tmp_path)), "-c", str(extra), "--out", str(run)])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.exception, out)
    assert message in out and "YAML reads this key as" in out, out
    assert not run.exists()


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", ""])
def test_a_recipe_name_cannot_take_the_run_out_of_trainer_out(tmp_path, name):
    """Issue 44: ``name=../../x`` wrote the run outside ``trainer.out`` (eval labels were checked)."""
    out = tmp_path / "a" / "b" / "runs"
    res = runner.invoke(app, ["train", "-c", str(sft_recipe(tmp_path)), f"trainer.out={out}", f"name={name}"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"name {name!r}: use letters, digits" in said, said
    assert not (tmp_path / "a").exists() and not (tmp_path / "x").exists()
