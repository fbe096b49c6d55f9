"""The engine launcher, against a stand-in ``sglang.launch_server`` module (a tiny HTTP server
that also spawns a grandchild), so process-group handling is tested without a real engine.
The real engines are tested by ``make test-engines``."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import httpx
import pytest

from harness.engines import EngineError, engine_command, launch_engine

FAKE_SERVER = textwrap.dedent(
    """
    import argparse, http.server, subprocess, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--model-path"); p.add_argument("--host"); p.add_argument("--port", type=int)
    p.add_argument("--fail", action="store_true")
    a, _ = p.parse_known_args()
    if a.fail:
        print("boom: cannot load model", flush=True); sys.exit(3)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(a.model_path + ".child", "w").write(str(child.pid))
    time.sleep(0.5)  # start-up takes a moment, like a real engine
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer((a.host, a.port), H).serve_forever()
    """
)


@pytest.fixture
def fake_engine_env(tmp_path):
    pkg = tmp_path / "fakepkgs" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(FAKE_SERVER)
    return {"PYTHONPATH": str(tmp_path / "fakepkgs")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); check its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_commands_for_both_engines():
    sg = engine_command("sglang", "/m", "/py", "127.0.0.1", 30000, tp=2, device="cpu", extra=["--x"])
    assert sg == [
        "/py",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/m",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--tp-size",
        "2",
        "--device",
        "cpu",
        "--x",
    ]
    vl = engine_command("vllm", "/m", "/py", "127.0.0.1", 8000, dp=2)
    assert vl[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"] and vl[-2:] == ["--data-parallel-size", "2"]
    with pytest.raises(EngineError):
        engine_command("tgi", "/m", "/py", "h", 1)  # type: ignore[arg-type]


def test_launch_waits_for_health_and_stop_kills_the_process_group(tmp_path, fake_engine_env):
    model = str(tmp_path / "model")
    engine = launch_engine(
        "sglang", model, python=sys.executable, log_dir=tmp_path, env=fake_engine_env, health_timeout_s=30
    )
    with engine:
        assert engine.url.startswith("http://127.0.0.1:")
        assert httpx.get(engine.url + "/health").status_code == 200
        child = int(open(model + ".child").read())
        assert _alive(child)
    assert not engine.alive()
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the engine's own children must stop with it"
    engine.stop()  # idempotent


def test_engine_that_dies_fails_fast_with_its_log(tmp_path, fake_engine_env):
    t0 = time.time()
    with pytest.raises(EngineError, match=r"(?s)exited with code 3.*boom: cannot load model"):
        launch_engine("sglang", "m", python=sys.executable, log_dir=tmp_path, env=fake_engine_env, extra=["--fail"])
    assert time.time() - t0 < 20


def test_missing_python_is_a_clear_error(tmp_path):
    with pytest.raises(EngineError, match="pass --python"):
        launch_engine("vllm", "m", python=str(tmp_path / "nope" / "python"), log_dir=tmp_path)


def test_cpu_defaults_unless_the_user_sets_them():
    vl = engine_command("vllm", "/m", "/py", "127.0.0.1", 8000, device="cpu", extra=["--max-model-len=4096"])
    assert vl[vl.index("--dtype") + 1] == "bfloat16" and vl.count("--max-model-len=4096") == 1
    assert "--max-model-len" not in vl  # the user's value, not the recipe's
    sg = engine_command("sglang", "/m", "/py", "127.0.0.1", 1, device="cpu", extra=["--device", "xpu"])
    assert sg.count("--device") == 1 and sg[-2:] == ["--device", "xpu"]
    assert "--dtype" not in engine_command("vllm", "/m", "/py", "127.0.0.1", 1, device="cuda")


def test_engine_python_resolution(tmp_path, monkeypatch):
    from harness.engines import engine_python, engine_ready

    monkeypatch.setenv("HARNESS_ENGINE_DIR", str(tmp_path))
    monkeypatch.delenv("HARNESS_SGLANG_PYTHON", raising=False)
    assert engine_python("sglang") == sys.executable and not engine_ready("sglang")
    venv = tmp_path / "sglang" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")
    assert engine_python("sglang") == sys.executable  # half-built (no stamp): not used
    (tmp_path / "sglang" / ".harness-built").write_text("")
    assert engine_python("sglang") == str(venv / "python") and engine_ready("sglang")
    monkeypatch.setenv("HARNESS_SGLANG_PYTHON", "/opt/sg/python")
    assert engine_python("sglang") == "/opt/sg/python"
    assert engine_python("sglang", "/explicit") == "/explicit"


@pytest.fixture
def fake_model(tmp_path):
    """A model directory the harness can load a tokenizer from (the stand-in engine ignores it)."""
    from harness.tokenization import byte_tokenizer

    model = tmp_path / "model"
    byte_tokenizer().save_pretrained(model)
    (model / "config.json").write_text("{}")
    return model


def _wait_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.time() + timeout
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def test_serve_model_cli_serves_until_sigterm_then_stops_the_group(tmp_path, fake_engine_env, fake_model):
    import signal
    import subprocess

    from harness.ports import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "cli.main", "serve", "model", "--engine", "sglang", "--model"]
    cmd += [str(fake_model), "--python", sys.executable, "--port", str(port), "--log-dir", str(tmp_path / "logs")]
    env = {**os.environ, "PYTHONPATH": fake_engine_env["PYTHONPATH"] + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "serving" in line:
                break
        assert f"http://127.0.0.1:{port}" in "".join(lines), lines
        assert proc.stdout.readline().strip() == f"http://127.0.0.1:{port}"  # type: ignore[union-attr]
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        child = int((tmp_path / "model.child").read_text())
        assert (tmp_path / "logs" / f"sglang-{port}.log").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
        assert _wait_gone(child), "SIGTERM to harness must stop the engine's whole process group"
    finally:
        proc.kill()


def test_eval_launch_stops_the_engine_when_the_run_fails(tmp_path, fake_engine_env, fake_model, monkeypatch):
    from typer.testing import CliRunner

    from cli.main import app

    monkeypatch.setenv("PYTHONPATH", fake_engine_env["PYTHONPATH"])
    monkeypatch.setenv("HARNESS_SGLANG_PYTHON", sys.executable)
    args = ["eval", "--method", "research", "--dataset", "no_such_dataset", "--backend", "sglang", "--launch"]
    result = CliRunner().invoke(app, [*args, "--model", str(fake_model), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "no_such_dataset" in result.output, result.output
    assert "sglang up at http://127.0.0.1:" in result.output
    assert list((tmp_path / "runs" / "engines").glob("sglang-*.log"))
    assert _wait_gone(int((tmp_path / "model.child").read_text()), timeout=5), "engine left running after a failure"


def test_launch_needs_an_engine_backend(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["eval", "--backend", "hf", "--launch", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "sglang or openai backend" in result.output
