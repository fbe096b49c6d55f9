"""Error messages are for people: the library's message, never an exception's class name
(issue 44: ``harness data`` printed ``ValueError:``, ``RegistryError:`` before them)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from cli.main import app

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
