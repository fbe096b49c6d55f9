"""``harness eval --backend sglang --launch`` with the real engine: it is started for the run,
serves the agent, and is gone when the command returns."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from harness.engines import engine_dir, engine_ready
from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]


def test_eval_launch_runs_and_stops_sglang(tmp_path):
    if not engine_ready("sglang"):
        pytest.skip(f"no sglang venv under {engine_dir()}: run make engines")
    from cli.main import app

    out = tmp_path / "runs"
    args = ["eval", "--method", "research", "--dataset", "demo", "--limit", "2", "--backend", "sglang", "--launch"]
    args += ["--out", str(out), "backend.engine.args=" + json.dumps(checks.ENGINE_ARGS["sglang"])]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    results = json.loads((out / "research-demo-test" / "results.json").read_text())
    assert results["n"] == 2 and results["errors"] == 0
    manifest = json.loads((out / "research-demo-test" / "manifest.json").read_text())
    # launch and the ephemeral URL are how the run executed, not what identifies it (not hashed)
    assert manifest["execution"]["backend.launch"] is True and "url" not in manifest["config"]["backend"]
    (log,) = out.joinpath("engines").glob("sglang-*.log")
    assert "POST /generate" in log.read_text()
    assert not checks.processes_with("--port " + log.stem.split("-")[1]), "engine left running after the run"
