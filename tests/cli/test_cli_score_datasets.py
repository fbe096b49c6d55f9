"""``harness score`` and ``harness datasets``."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_score_json(tmp_path):
    f = tmp_path / "p.jsonl"
    rows = [
        {"pred": "Paris", "golden_answers": ["paris"]},
        {"pred": "the city of Lyon", "golden_answers": "Lyon"},
        {"pred": "no", "golden_answers": ["yes"]},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = runner.invoke(app, ["score", str(f), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["n"] == 3
    assert out["em"] == 1 / 3
    assert out["acc"] == 2 / 3 and out["cover_em"] == 2 / 3
    assert abs(out["f1"] - (1 + 0.5) / 3) < 1e-9  # 'city of lyon' vs 'lyon': P=1/3, R=1 -> F1=0.5


def test_score_custom_keys_and_errors(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"answer": "x", "gold": ["x"]}\n{"answer": "y"}\n')
    result = runner.invoke(app, ["score", str(f), "--pred-key", "answer", "--gold-key", "gold", "--json"])
    assert result.exit_code != 0 and "p.jsonl:2" in result.output
    result = runner.invoke(app, ["score", str(f), "--metrics", "emm"])
    assert result.exit_code != 0 and "did you mean 'em'" in result.output


def test_datasets_lists_sources(tmp_path):
    result = runner.invoke(app, ["datasets", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "demo", "packaged"):
        assert name in result.output


def test_score_rejects_bad_golds_list_predictions_and_non_utf8(tmp_path):
    f = tmp_path / "p.jsonl"
    cases = [
        ({"pred": "x", "golden_answers": []}, "p.jsonl:2"),
        ({"pred": "x", "golden_answers": [None]}, "p.jsonl:2"),
        ({"pred": ["x", "y"], "golden_answers": ["x"]}, "p.jsonl:2"),
    ]
    for row, where in cases:
        f.write_text(json.dumps({"pred": "a", "golden_answers": ["a"]}) + "\n" + json.dumps(row) + "\n")
        result = runner.invoke(app, ["score", str(f), "--json"])
        assert result.exit_code == 2 and where in " ".join(result.output.split()), (row, result.output)
    f.write_bytes(b'{"pred": "a", "golden_answers": ["a"]}\n{"pred": "caf\xe9", "golden_answers": ["a"]}\n')
    result = runner.invoke(app, ["score", str(f), "--json"])
    out = " ".join(result.output.split())
    assert result.exit_code == 2 and "p.jsonl:2: not UTF-8" in out and "Traceback" not in out


def test_metrics_refuse_a_list_prediction():
    import pytest

    from benchmarks.metrics import score_prediction

    with pytest.raises(ValueError, match="a prediction must be a string, got list"):
        score_prediction(["Paris"], ["Paris"])
    with pytest.raises(ValueError, match="no gold answers"):
        score_prediction("Paris", [])


def test_score_says_how_many_rows_had_no_prediction(tmp_path, caplog):
    """Issue 44: ``pred: null`` was scored as "" with no word of it."""
    f = tmp_path / "p.jsonl"
    rows = [{"pred": "Paris", "golden_answers": ["paris"]}, {"pred": None, "golden_answers": ["x"]}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = runner.invoke(app, ["score", str(f), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["n"] == 2 and out["em"] == 0.5 and out["no_prediction"] == 1
    assert "1 of 2 rows have no prediction ('pred' is null; first on line 2): scored as wrong" in caplog.text
    table = runner.invoke(app, ["score", str(f)])
    assert "1 with no prediction, scored as wrong" in " ".join(table.stdout.split()), table.stdout
