"""``harness eval --n-samples K``: K seeded samples per question, exact resume per (question,
sample), mean@K aggregation, and the refusals (greedy agent, baselines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from harness.backends.scripted import ScriptedBackend
from harness.config import from_dict
from harness.eval_config import EvalConfig

runner = CliRunner()


def script_entries(examples, right: bool) -> list[dict]:
    out = []
    for ex in examples:
        answer = ex.answers[0] if right else "unknown"
        turns = [f"<think>look</think><search>{ex.question}</search>", f"<answer>\\boxed{{{answer}}}</answer>"]
        out.append({"match": ex.question, "turns": turns})
    return out


class SeedDependentBackend(ScriptedBackend):
    """Answers right when the request's seed is odd, wrong when even; records every seed it saw
    per question, so a test can tell which sample ran with which seed."""

    def __init__(self, examples) -> None:
        super().__init__(script_entries(examples, right=True))
        self.wrong = ScriptedBackend(script_entries(examples, right=False))
        self.questions = [ex.question for ex in examples]
        self.seen: list[tuple[str, int | None]] = []

    async def agenerate(self, input_ids, params):
        context = self.tokenizer.decode(input_ids)
        question = next(q for q in self.questions if q in context)
        self.seen.append((question, params.seed))
        if params.seed is not None and params.seed % 2 == 1:
            return await super().agenerate(input_ids, params)
        return await self.wrong.agenerate(input_ids, params)


@pytest.fixture(scope="module")
def examples():
    from benchmarks.datasets import load_examples

    return load_examples("demo")[:4]


def config(out: Path, k: int, **agent) -> EvalConfig:
    return from_dict(
        EvalConfig,
        {
            "method": "research",
            "dataset": {"name": "demo", "limit": 4},
            "backend": {"kind": "scripted"},
            "retriever": {"kind": "memory"},
            "agent": {"max_total_tokens": 100000, "temperature": 0.7, "seed": 10, **agent},
            "n_samples": k,
            "out": str(out),
        },
    )


def run(cfg: EvalConfig, examples) -> tuple[SeedDependentBackend, object]:
    from benchmarks.build import simple_evaluate

    backend = SeedDependentBackend(examples)
    return backend, simple_evaluate(cfg, backend=backend)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_k_samples_per_question_with_per_sample_seeds_and_mean_at_k(tmp_path, examples):
    cfg = config(tmp_path, 3)
    backend, results = run(cfg, examples)
    run_dir = tmp_path / "research-demo-test-k3"
    trajs = lines(run_dir / "trajectories.jsonl")
    assert sorted((t["example_id"], t["sample_index"]) for t in trajs) == sorted(
        (e.id, j) for e in examples for j in range(3)
    )
    # Sample j of every question decodes with seed agent.seed + j, on every turn.
    by_q: dict[str, set] = {}
    for q, seed in backend.seen:
        by_q.setdefault(q, set()).add(seed)
    assert all(seeds == {10, 11, 12} for seeds in by_q.values()) and len(by_q) == 4
    # Odd seeds answer right: sample 1 of each question; EM is the mean over all 12 samples.
    em = {(s["id"], s["sample_index"]): s["em"] for s in lines(run_dir / "scores.jsonl")}
    assert all(em[(e.id, 1)] == 1.0 and em[(e.id, 0)] == em[(e.id, 2)] == 0.0 for e in examples)
    assert results.n == results.n_total == 12 and results.complete
    assert results.metrics["em"] == pytest.approx(1 / 3)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["n_total"] == 12 and manifest["config"]["n_samples"] == 3

    # The report's per-question view averages each question's samples (the bootstrap unit).
    from benchmarks.report import load_run

    summary = load_run(run_dir)
    assert summary.item_values("em") == {e.id: pytest.approx(1 / 3) for e in examples}


def test_resume_reruns_exactly_the_missing_question_samples(tmp_path, examples):
    cfg = config(tmp_path, 2)
    _, first = run(cfg, examples)
    run_dir = tmp_path / "research-demo-test-k2"
    before = {(s["id"], s["sample_index"]): s for s in lines(run_dir / "scores.jsonl")}
    # Drop two items' records, as if the run had been killed before they finished.
    dropped = {(examples[1].id, 1), (examples[3].id, 0)}
    for name in ("trajectories.jsonl", "scores.jsonl"):
        recs = lines(run_dir / name)
        key = (
            (lambda r: (r["example_id"], r["sample_index"]))
            if name.startswith("traj")
            else (lambda r: (r["id"], r["sample_index"]))
        )
        kept = [r for r in recs if key(r) not in dropped]
        (run_dir / name).write_text("".join(json.dumps(r) + "\n" for r in kept))
    backend, again = run(cfg, examples)
    rerun = {(q, seed) for q, seed in backend.seen}
    assert rerun == {(examples[1].question, 11), (examples[3].question, 10)}
    after = {(s["id"], s["sample_index"]): s for s in lines(run_dir / "scores.jsonl")}
    assert {k: v["em"] for k, v in after.items()} == {k: v["em"] for k, v in before.items()}
    assert again.metrics == first.metrics and again.n == 8


def test_greedy_k_samples_and_baselines_are_refused(tmp_path, examples):
    from benchmarks.build import build_eval

    with pytest.raises(ValueError, match="temperature"):
        build_eval(config(tmp_path, 2, temperature=0.0), backend=SeedDependentBackend(examples))
    cfg = from_dict(
        EvalConfig,
        {"method": "naive", "dataset": {"name": "demo", "limit": 2}, "n_samples": 2, "out": str(tmp_path)},
    )
    with pytest.raises(ValueError, match="baseline"):
        build_eval(cfg, backend=SeedDependentBackend(examples))
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_cli_flag_reaches_the_config_and_greedy_identity_is_unchanged(tmp_path, examples):
    script = tmp_path / "s.jsonl"
    script.write_text("".join(json.dumps(e) + "\n" for e in script_entries(examples, right=True)))
    base = ["eval", "--method", "research", "--dataset", "demo", "--limit", "2", "--backend", "scripted"]
    base += ["--script", str(script), "--retriever", "memory", "--out", str(tmp_path), "agent.max_total_tokens=100000"]
    result = runner.invoke(app, [*base, "--n-samples", "2", "agent.temperature=0.5"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "research-demo-test-k2" / "results.json").exists()
    result = runner.invoke(app, [*base, "--n-samples", "2"])
    assert result.exit_code != 0 and "temperature" in result.output
    # K = 1 keeps the greedy run's folder and config (no n_samples key): old runs still resume.
    result = runner.invoke(app, base)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "research-demo-test" / "manifest.json").read_text())
    assert "n_samples" not in manifest["config"] and manifest["n_total"] == 2


def test_a_config_files_method_and_dataset_are_not_replaced_by_flag_defaults(tmp_path, examples):
    script = tmp_path / "s.jsonl"
    script.write_text("".join(json.dumps(e) + "\n" for e in script_entries(examples, right=True)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("method: search_r1\ndataset: {name: demo, limit: 2}\nn_samples: 2\nagent: {temperature: 0.5}\n")
    args = ["eval", "-c", str(cfg), "--backend", "scripted", "--script", str(script), "--retriever", "memory"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path), "agent.max_total_tokens=100000"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "search_r1-demo-test-k2" / "results.json").exists()
    result = runner.invoke(
        app, [*args, "--method", "research", "--out", str(tmp_path), "agent.max_total_tokens=100000"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "research-demo-test-k2" / "results.json").exists()  # a flag still wins
