"""Error messages are for people: the library's message, never an exception's class name
(issue 44: ``harness data`` printed ``ValueError:``, ``RegistryError:`` before them)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from harness.ports import child_env, free_port

runner = CliRunner()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dialect", "researchh"], "unknown dialect 'researchh'; did you mean 'research'"),
        (["--dialect", "research", "--topk", "0"], "topk must be at least 1, got 0"),
    ],
)
def test_data_command_errors_print_no_class_name(tmp_path, extra, message):
    args = ["data", "synthesize", "--dataset", "demo", "--retriever", "memory", "--out", str(tmp_path / "s.jsonl")]
    res = runner.invoke(app, [*args, *extra])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"error: {message}" in said, said
    assert not re.search(r"\b[A-Z][A-Za-z]*(Error|Exception):", said), said


def test_resuming_with_another_model_size_is_one_sentence(tmp_path):
    """Issue 44: resuming with another model size printed torch's "size mismatch" line for every
    tensor (12 for a one-layer model, hundreds for a real one)."""
    from benchmarks.tiny_recipes import sft_recipe

    run = tmp_path / "run"
    first = runner.invoke(app, ["train", "-c", str(sft_recipe(tmp_path)), "--out", str(run), "trainer.max_steps=1"])
    assert first.exit_code == 0, first.output
    res = runner.invoke(app, ["train", "--resume", str(run), "trainer.max_steps=2", "model.tiny.hidden_size=64"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "the checkpoint does not fit the model this recipe builds" in said, said
    assert "12 tensors differ in shape" in said and said.count("size mismatch") == 1, said


def _serve(index, port: int) -> subprocess.Popen:
    env = {**child_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = [sys.executable, "-m", "cli.main", "serve", "retriever", "--index", str(index), "--port", str(port)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # two server processes (~15 s each on a busy 2-core machine)
def test_serve_says_serving_only_once_it_listens_and_names_a_port_it_cannot_take(tmp_path):
    """Issue 44: ``serve retriever --port 99999`` said it served on 99999 and listened on 34463
    (uvicorn wraps the number); its "serving" line came before the socket listened, and also when
    the bind then failed."""
    from benchmarks.datasets import demo_path

    index = tmp_path / "idx"
    built = runner.invoke(app, ["index", "build", "--corpus", str(demo_path("corpus.jsonl")), "--out", str(index)])
    assert built.exit_code == 0, built.output
    res = runner.invoke(app, ["serve", "retriever", "--index", str(index), "--port", "99999"])
    assert res.exit_code == 2 and "'--port'" in res.output and "65535" in res.output and "serving" not in res.output
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    with taken:
        busy = _serve(index, port)
        _, err = busy.communicate(timeout=120)
    said = " ".join(err.split())
    assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in said, said
    assert "serving" not in said and "Errno" not in said
    server = _serve(index, free_port())
    try:
        line = ""
        while "serving" not in line:
            line = server.stderr.readline()
            assert line or server.poll() is None, "the server exited"
        url = re.search(r"on (http://\S+)", line).group(1)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # listening when it says so
    finally:
        server.terminate()
        server.wait(timeout=30)
