"""programs.demo.program: what demo.md says of the RL run, and the folder's stage times."""

from __future__ import annotations

import json

from programs.demo.program import Timings, _rl_choice


def write_run(run, best_metric, records):
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"trainer": {"best_metric": best_metric}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_demo_md_names_the_step_validation_chose(tmp_path):
    records = [{"step": 0, "val/em": 0.75}, {"step": 0, "val/best_step": 0.0}, {"step": 3, "loss": 0.1}]
    records += [{"step": 3, "val/em": 0.857}, {"step": 3, "val/best_step": 3.0}]
    records += [{"step": 6, "val/em": 0.643}, {"step": 6, "val/best_step": 3.0}]
    write_run(tmp_path / "rl", "em", records)
    assert _rl_choice(tmp_path / "rl") == (
        "The RL agent is the RL run's step 3, chosen by validation EM on the val split "
        "(trainer.best_metric; 75.0 at step 0, 85.7 at step 3, 64.3 at step 6)."
    )


def test_demo_md_says_nothing_of_a_choice_without_best_metric(tmp_path):
    write_run(tmp_path / "rl", None, [{"step": 0, "val/em": 0.75}, {"step": 6, "val/em": 0.8}])
    assert _rl_choice(tmp_path / "rl") is None
    assert _rl_choice(tmp_path / "missing") is None


def test_stage_times_survive_a_cached_rerun_and_another_seeds_demo(tmp_path):
    """timings.json is the folder's record: a rerun whose stages are cached keeps the times of the
    run that did the work, and a second process (another seed into the same folder) keeps the
    first one's entries."""
    path = tmp_path / "timings.json"
    first, second = Timings(path), Timings(path)
    with first.stage("sft"):
        pass
    with second.stage("train-s1"):
        pass
    done = json.loads(path.read_text())
    assert set(done) == {"sft", "train-s1"} and set(done["sft"]) == {"seconds", "peak_rss_mb", "rss_mb"}
    path.write_text(json.dumps({**done, "sft": {**done["sft"], "seconds": 241.5}}))  # the real SFT's time
    with Timings(path).stage("sft") as st:
        st.reused = True  # cached: nothing trained now
    with Timings(path).stage("report") as st:
        st.reused = True  # reused, but no earlier record: this run's is written
    again = json.loads(path.read_text())
    assert again["sft"]["seconds"] == 241.5 and set(again) == {"sft", "train-s1", "report"}


def test_new_sft_data_where_a_model_was_trained_on_the_old_is_refused_unless_retrain(tmp_path, monkeypatch):
    """Synthesized SFT data made for other inputs, with an SFT model trained on it, is not renewed
    silently (that would make the model and all after it stale): the refusal names the input."""
    import pytest

    from programs.demo.program import _synthesize
    from training.build import StaleRunError

    sft_dir = tmp_path / "sft"
    (sft_dir / "model" / "final").mkdir(parents=True)
    (sft_dir / "train.jsonl").write_text("{}\n")
    data = {"agent": {"variant": "small", "max_doc_tokens": 64}, "retriever": {"kind": "bm25", "topk": 3}}
    with pytest.raises(StaleRunError, match="train.inputs.json: missing.*--retrain"):
        _synthesize(None, data, sft_dir, "research", retrain=False)
    monkeypatch.setattr("programs.demo.program.file_hash", lambda path: "h")
    stamp = {"questions": "h", "limit": 28, "corpus": "h", "dialect": "research", "variant": "small"}
    stamp |= {"max_doc_tokens": 128, "tokenizer": "smollm2-135m-instruct", "retriever": "bm25", "topk": 3}
    (sft_dir / "train.inputs.json").write_text(json.dumps(stamp))
    with pytest.raises(StaleRunError, match="max_doc_tokens: 128 → 64") as refused:
        _synthesize(None, data, sft_dir, "research", retrain=False)
    assert refused.value.differences == ["its SFT data's max_doc_tokens: 128 → 64"]
    assert (sft_dir / "train.jsonl").read_text() == "{}\n" and (sft_dir / "model" / "final").is_dir()
