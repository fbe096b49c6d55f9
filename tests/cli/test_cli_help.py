"""The command surface: every command is listed; unbuilt ones say so and exit non-zero."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_help_lists_every_command():
    from cli.commands import COMMANDS, stage_commands

    result = runner.invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for cmd in ("eval", "train", "report", "index", "serve", "datasets", "score", "prompt"):
        assert cmd in result.output
    for cmd in COMMANDS:  # the registry the CLI attaches by (and stage chains check against)
        assert f" {cmd} " in result.output and COMMANDS.get(cmd).help[:40] in result.output
    assert "serve" not in stage_commands() and "demo" not in stage_commands() and "train" in stage_commands()


def test_every_stage_command_is_a_command():
    """The library names the commands a chain stage may run (it cannot read the CLI's table)."""
    from cli.commands import COMMANDS, stage_commands
    from training.stages import STAGE_COMMANDS

    assert sorted(stage_commands()) == sorted(STAGE_COMMANDS) and set(STAGE_COMMANDS) <= set(COMMANDS)


def test_serve_model_rejects_bad_flags_by_name():
    for args, msg in (
        (["--engine", "tgi"], "--engine must be sglang or vllm"),
        (["--engine", "sglang", "--tp", "0"], "--tp and --dp must be at least 1"),
        (["--engine", "vllm", "--device", "tpu"], "--device must be auto, cpu or cuda"),
    ):
        result = runner.invoke(app, ["serve", "model", *args])
        assert result.exit_code == 2 and msg in result.output, result.output


def test_help_is_fast_and_imports_no_torch():
    code = "import sys; from cli.main import app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_serve_model_passes_args_after_double_dash_to_the_engine(monkeypatch):
    import contextlib

    import harness.engines as engines

    seen = {}

    @contextlib.contextmanager
    def fake_launched(engine, model, cfg, log_dir=None):
        seen.update(engine=engine, model=model, cfg=cfg)
        raise engines.EngineError("stop here")
        yield

    monkeypatch.setattr(engines, "launched", fake_launched)
    args = ["serve", "model", "--engine", "vllm", "--tp", "2", "--", "--max-num-seqs", "64", "--enforce-eager"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen["engine"] == "vllm" and seen["model"] == "smollm2-135m-instruct"
    assert seen["cfg"].args == ["--max-num-seqs", "64", "--enforce-eager"] and seen["cfg"].tp == 2
    assert seen["cfg"].host == "127.0.0.1"  # loopback unless asked
