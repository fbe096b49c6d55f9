"""The LLM judge against a scripted OpenAI-compatible judge on loopback: verdicts, the cache (a
rerun sends nothing), failures recorded as missing (never wrong), the record of prompt/model/
decoding, and the API key sent but never written."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from typer.testing import CliRunner

from benchmarks.evaluate import evaluate
from benchmarks.judge import JudgeConfig, JudgePrompt, LLMJudge, parse_verdict, reference_text
from cli.main import app as cli_app
from harness.run_records import RunManifest
from harness.runlog import RunDir
from harness.types import Example, Trajectory
from tests.harness.conftest import ServerThread

SECRET = "sk-test-not-a-real-key-123"


class ScriptedJudge:
    """True when the prediction appears in the golden answer text; 500 on 'FAIL'; no verdict on 'GARBLE'."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.auth: list[str | None] = []

    def app(self) -> FastAPI:
        api = FastAPI()

        @api.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.requests.append(body)
            self.auth.append(request.headers.get("authorization"))
            text = body["messages"][0]["content"]
            research = "pred_answer: " in text  # ReSearch's prompt: answer in JSON
            if research:
                pred = text.split("pred_answer: ", 1)[1].split("\n", 1)[0].strip()
                gold = text.split("ground truth answers: ", 1)[1].split("\n", 1)[0]
            else:
                pred = text.split("Predicted Answer: ", 1)[1].strip()
                gold = text.split("Golden Answer: ", 1)[1].split("\n", 1)[0]
            if "FAIL" in pred:
                return JSONResponse({"error": "scripted failure"}, status_code=500)
            right = bool(pred) and pred.lower() in gold.lower()
            if research:
                verdict = "correct" if right else "incorrect"
                reply = "not json" if "GARBLE" in pred else json.dumps({"rationale": "scripted", "judgement": verdict})
            else:
                reply = "I cannot tell" if "GARBLE" in pred else ("True" if right else "False")
            return {"choices": [{"message": {"role": "assistant", "content": reply}}]}

        return api


@pytest.fixture
def judge_server():
    script = ScriptedJudge()
    with ServerThread(script.app()) as server:
        yield script, server.url + "/v1"


def test_prompt_file_is_r1_searchers_text():
    p = JudgePrompt.load("r1_searcher")
    assert p.template.startswith("Given a Question and its Golden Answer, verify whether the Predicted Answer")
    assert p.template.endswith("Predicted Answer: {prediction}\n    ")
    assert p.source["repository"] == "RUCAIBox/R1-Searcher" and p.model == "gpt-4o-mini"
    assert reference_text(["Paris"]) == "Paris" and reference_text(["a", "b"]) == "['a', 'b']"
    assert reference_text(["False"]) == "no"
    assert parse_verdict("True.") == 1.0 and parse_verdict("false") == 0.0 and parse_verdict("Truely?") is None


def test_research_prompt_is_researchs_text_and_reads_json_verdicts():
    p = JudgePrompt.load("research")
    assert p.source["repository"] == "Agent-RL/ReSearch" and p.decoding["temperature"] == 0
    text = p.template.format(question="Q?", gt_answer=p.reference(["Paris", "Paris, France"]), pred_answer="paris")
    assert "ground truth answers: ['Paris', 'Paris, France']\npred_answer: paris\n" in text
    assert '```json \n{\n    "rationale"' in text and text.endswith("Your output:")
    assert p.parse('```json\n{"rationale": "x", "judgement": "correct"}\n```') == 1.0
    assert p.parse('{"judgement": "Incorrect"}') == 0.0 and p.parse("correct") is None


def test_research_profile_uses_researchs_judge(judge_server, tmp_path):
    from benchmarks.profiles import apply_profile

    script, url = judge_server
    data = apply_profile({"judge": {"url": url}}, "research")
    assert data["judge"]["prompt"] == "research" and data["metrics"] == ["em", "judge"]
    judge = LLMJudge(JudgeConfig.from_options(data["judge"]), cache_dir=tmp_path)
    assert judge("a", "Capital?", ["Paris"], "Paris") == 1.0
    assert judge("b", "Capital?", ["Paris"], "Rome") == 0.0
    assert judge("c", "Capital?", ["Paris"], "GARBLE") is None
    assert script.requests[0]["response_format"] == {"type": "json_object"}


def test_verdicts_cache_and_failures_are_missing(judge_server, tmp_path, monkeypatch):
    script, url = judge_server
    monkeypatch.setenv("JUDGE_KEY", SECRET)
    cfg = JudgeConfig(url=url, model="scripted-judge", api_key_env="JUDGE_KEY", temperature=0.0, retries=0)
    judge = LLMJudge(cfg, cache_dir=tmp_path)
    assert judge("q1", "Capital of France?", ["Paris"], "paris") == 1.0
    assert judge("q2", "Capital of Italy?", ["Rome"], "Milan") == 0.0
    assert judge("q3", "x?", ["y"], "FAIL please") is None  # HTTP 500: missing, not wrong
    assert judge("q4", "x?", ["y"], "GARBLE") is None  # no True/False in the reply: missing
    assert len(script.requests) == 4 and script.auth[0] == f"Bearer {SECRET}"
    body = script.requests[0]
    assert body["model"] == "scripted-judge" and body["max_tokens"] == 1024 and body["temperature"] == 0.0
    # A new judge over the same folder answers from the cache: no request for q1/q2; failures are asked again.
    again = LLMJudge(cfg, cache_dir=tmp_path)
    assert again("q1", "Capital of France?", ["Paris"], "paris") == 1.0
    assert again("q2", "Capital of Italy?", ["Rome"], "Milan") == 0.0
    assert len(script.requests) == 4
    assert again("q3", "x?", ["y"], "FAIL please") is None and len(script.requests) == 5
    # Another prediction for the same item is a new verdict.
    assert again("q2", "Capital of Italy?", ["Rome"], "Rome") == 1.0 and len(script.requests) == 6
    again.write_record(tmp_path)
    for f in tmp_path.iterdir():
        assert SECRET not in f.read_text()


class ListMethod:
    """A method protocol double: one fixed trajectory per example (the prediction from a table)."""

    method = "fixed"

    def __init__(self, predictions: dict[str, str]) -> None:
        self.predictions = predictions

    def run_examples(self, examples, n_samples=1, on_done=None, skip=(), schedule="async"):
        for e in examples:
            if (e.id, 0) in skip:
                continue
            pred = self.predictions[e.id]
            on_done(Trajectory(e.id, e.question, list(e.answers), "fixed", prediction=pred, finish_reason="answer"))


def test_evaluate_records_missing_verdicts_and_rejudges_them(judge_server, tmp_path):
    script, url = judge_server
    examples = [Example(f"q{i}", f"question {i}?", [a]) for i, a in enumerate(["Paris", "Rome", "Oslo"])]
    method = ListMethod({"q0": "Paris", "q1": "Milan", "q2": "FAIL"})
    judge = LLMJudge(JudgeConfig(url=url, retries=0), cache_dir=tmp_path / "run")
    manifest = RunManifest(method="fixed", dataset="t", split="")
    res = evaluate(method, examples, tmp_path / "run", ("em", "judge"), manifest, judge=judge)
    assert res.metrics["judge"] == pytest.approx(0.5)  # mean over the 2 judged items, not over 3
    assert res.missing == {"judge": 1}
    scores = {s.id: s.metric("judge") for s in RunDir(tmp_path / "run").scores()}
    assert scores == {"q0": 1.0, "q1": 0.0, "q2": None}
    n_calls = len(script.requests)
    # Rerun (resumes): judged items cost nothing; only the missing one is asked again (and fails again).
    evaluate(method, examples, tmp_path / "run", ("em", "judge"), manifest, judge=LLMJudge(judge.cfg, tmp_path / "run"))
    assert len(script.requests) == n_calls + 1


@pytest.mark.slow  # ~15 s on 2 shared cores: importing the agent pipeline dominates
def test_eval_cli_records_profile_and_judge(judge_server, tmp_path):
    from benchmarks.datasets import load_examples
    from tests.cli.test_eval_cli import eval_args, write_script

    script, url = judge_server
    examples = load_examples("demo")
    s = write_script(tmp_path / "s.jsonl", examples, n_right=2)
    args = [*eval_args(s, tmp_path / "runs", "--limit", "3"), "--metric-profile", "r1_searcher", "--judge-url", url]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    assert "metric profile: r1_searcher" in result.output and "Cover-EM" in result.output
    assert "LLM judge" in result.output
    run = next((tmp_path / "runs").iterdir())
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["metric_profile"] == "r1_searcher"
    assert manifest["config"]["metrics"] == ["cover_em", "em_r1_searcher", "f1_r1_searcher", "judge"]
    judge_cfg = manifest["config"]["judge"]
    assert "url" not in judge_cfg  # execution-only: a new endpoint resumes the run
    assert judge_cfg == {"prompt": "r1_searcher", "model": "gpt-4o-mini", "decoding": {"max_tokens": 1024}}
    record = json.loads((run / "judge.json").read_text())
    assert record["model"] == "gpt-4o-mini" and record["prompt_source"]["repository"] == "RUCAIBox/R1-Searcher"
    assert record["decoding"] == {"max_tokens": 1024}
    results = json.loads((run / "results.json").read_text())
    assert results["metrics"]["judge"] is not None and results["metrics"]["cover_em"] == pytest.approx(2 / 3)
    # The report names the profile and carries the judge column.
    rep = CliRunner().invoke(cli_app, ["report", str(run), "--out", str(tmp_path / "rep"), "--format", "md"])
    assert rep.exit_code == 0, rep.output
    md = (tmp_path / "rep" / "leaderboard.md").read_text()
    assert "Metric profile: `r1_searcher`" in md and "LLM judge" in md and "Cover-EM" in md


def test_score_cli_with_profile_and_judge(judge_server, tmp_path):
    _, url = judge_server
    f = tmp_path / "preds.jsonl"
    rows = [
        {"id": "a", "question": "q?", "pred": "<answer>x</answer><answer>Paris</answer>", "golden_answers": ["Paris"]},
        {"id": "b", "question": "q?", "pred": "FAIL", "golden_answers": ["Rome"]},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(
        cli_app, ["score", str(f), "--metric-profile", "search_r1", "--judge-url", url, "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["em_last_answer"] == 0.5 and out["judge_missing"] == 1 and out["n"] == 2
    assert out["judge"] == 0.0  # the tagged prediction is judged as written, and is not "Paris"
