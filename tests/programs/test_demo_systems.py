"""``harness demo --system NAME`` end to end at CI size: a tiny random Llama with SmolLM2's tokenizer
in place of SmolLM2, four test questions, one training step per stage. What is checked is that each
stage hands its output to the next (the SFT model to the training, the trained model or encoder to
the last evaluation, every run to the report and demo.md), not what is learned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.models import load_tokenizer
from programs.demo.program import HARR_START, DemoOptions, labels, run_demo, seeded, start_label
from programs.demo.systems import SYSTEMS, get_system
from tests.helpers.models import random_llama
from training.build import StaleRunError

pytestmark = pytest.mark.slow

# Evaluations of the tiny model: one short turn, so a random model's 154 answers cost nothing.
AGENT = {"variant": "small", "max_turns": 1, "max_new_tokens": 8, "max_total_tokens": 256, "max_doc_tokens": 16}
RL = [
    "trainer.max_steps=1",
    "trainer.eval_every=1",
    "trainer.val_before_train=false",
    "data.val_limit=2",
    "rollout.prompts_per_step=2",
    "rollout.n_samples=2",
    "rollout.sampling.max_new_tokens=8",
    "algo.ppo_mini_batch_size=null",
    "optim.micro_batch_size=4",  # the 4 rows of a step in one micro-batch (research filters groups: it needs that)
    "model.gradient_checkpointing=false",
    # HARR's retriever recipe: one step of two questions, two samples each
    "retriever_rl.rl.steps=1",
    "retriever_rl.rl.questions_per_step=2",
    "retriever_rl.rl.group_size=2",
    "retriever_rl.sampling.n_candidates=4",
]


class _Quiet:
    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self, title: str) -> None:
        self.steps.append(title)

    def results(self, results) -> None:
        pass

    def report(self, report) -> None:
        pass

    def say(self, text: str) -> None:
        pass


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A random two-layer Llama saved with SmolLM2's tokenizer (its chat template included)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tok = load_tokenizer("smollm2-135m-instruct")
    random_llama(len(tok), seed=0, tie_word_embeddings=True).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _methods_config(tmp: Path, model: Path) -> str:
    path = tmp / "methods.yaml"
    data = {
        "agent": AGENT,
        "baseline": {"max_new_tokens": 8},
        "backend": {"kind": "hf", "model": str(model), "max_batch_size": 8, "max_concurrency": 8},
    }
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _opts(tmp: Path, model: Path, seeds=(0,), baselines: bool = False) -> DemoOptions:
    return DemoOptions(
        methods_config=_methods_config(tmp, model),
        sft_overrides=[f"model.path={model}", "trainer.max_steps=1", "sft.batch_size=2", "optim.micro_batch_size=2"],
        rl_overrides=list(RL),
        seeds=seeds,
        threads=1,
        limit=4,
        baselines=baselines,  # FlashRAG's baselines: once, in the research chain (the same for every system)
    )


@pytest.mark.parametrize("system", [s for s in SYSTEMS if SYSTEMS[s].chain != "prorag"])
def test_each_system_chain_hands_its_outputs_on(system, tmp_path, tiny_model):
    s = get_system(system)
    out = tmp_path / "demo"
    report = run_demo(_Quiet(), system, out, _opts(tmp_path, tiny_model, baselines=system == "research"))
    untrained, sft_label, trained = labels(s)
    runs = {p.name for p in (out / "eval").iterdir()}
    assert {f"{untrained}-demo-test", f"{sft_label}-demo-test", f"{trained}-demo-test"} <= runs
    # The SFT run's final model is what the first training stage started from.
    sft_final = out / "sft" / "model" / "final"
    assert sft_final.is_dir()
    first = json.loads((out / s.stage_names[0] / "config.json").read_text())
    if s.chain == "harr":
        assert first["retriever_rl"]["backend"]["model"] == str(sft_final)
        assert (out / "retriever" / "encoder").is_dir()
        manifest = json.loads((out / "eval" / f"{trained}-demo-test" / "manifest.json").read_text())
        assert manifest["config"]["retriever"]["encoder"] == str(out / "retriever" / "encoder")
        # HARR's own start: the SFT generator with the untrained tower, in the trained tower's state
        start = json.loads((out / "eval" / f"{start_label(s)}-demo-test" / "manifest.json").read_text())
        assert start["config"]["retriever"]["encoder"] == str(out / HARR_START)
        assert start["config"]["backend"]["model"] == manifest["config"]["backend"]["model"] == str(sft_final)
        sidecar = json.loads((out / HARR_START / "harr_encoder.json").read_text())
        assert sidecar == json.loads((out / "retriever" / "encoder" / "harr_encoder.json").read_text())
        text = (report / "demo.md").read_text()
        assert f"## {trained} against {start_label(s)}" in text and f"## {start_label(s)} against {sft_label}" in text
    else:
        assert first["model"]["path"] == str(sft_final)
        assert first["rollout"]["method"] == s.method
        assert first["rollout"]["agent"]["variant"] == s.agent.get("variant", "small")
        for before, after in zip(s.stage_names, s.stage_names[1:], strict=False):  # R1-Searcher: stage 2 from stage 1
            assert json.loads((out / after / "config.json").read_text())["model"]["path"] == str(out / before / "final")
        manifest = json.loads((out / "eval" / f"{trained}-demo-test" / "manifest.json").read_text())
        assert manifest["config"]["backend"]["model"] == str(out / s.stage_names[-1] / "final")
    if template := s.agent.get("chat_template"):  # tool_call: the system's one template reaches every stage
        records = [json.loads(x) for x in (out / "sft" / "train.jsonl").read_text().splitlines()]
        assert records and {r["chat_template"] for r in records} == {template}  # SFT renders with it
        assert first["rollout"]["agent"]["chat_template"] == template
        for label in (untrained, sft_label, trained):
            manifest = json.loads((out / "eval" / f"{label}-demo-test" / "manifest.json").read_text())
            assert manifest["config"]["agent"]["chat_template"] == template
            traj = json.loads((out / "eval" / f"{label}-demo-test" / "trajectories.jsonl").read_text().splitlines()[0])
            assert "<tools>" in traj["segments"][0]["text"]  # the prompt lists the tools (SmolLM2's own would not)
    text = (report / "demo.md").read_text()
    if s.chain != "harr":  # HARR's trained tower is paired against its start (above)
        assert f"## {trained} against {sft_label}" in text
    assert f"## {sft_label} against {untrained}" in text
    if s.chain == "rl":  # the RL runs' training health is drawn with their curves (issue 49)
        assert any("health" in p.name for p in (report / "curves").iterdir()), sorted((report / "curves").iterdir())
    assert set(json.loads((out / "timings.json").read_text())) >= {"baselines", "sft", "train", "eval_trained"}


def test_seeds_train_apart_from_one_sft_model_and_a_rerun_trains_nothing(tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the checkout: the shipped recipes are found from the package (issue 44)
    out = tmp_path / "demo"
    run_demo(_Quiet(), "research", out, _opts(tmp_path, tiny_model, seeds=(0, 1)))
    _, sft_label, trained = labels(get_system("research"))
    for seed in (0, 1):
        cfg = json.loads((out / seeded("rl", seed) / "config.json").read_text())
        assert cfg["trainer"]["seed"] == seed and cfg["model"]["path"] == str(out / "sft" / "model" / "final")
        assert (out / "eval" / f"{seeded(trained, seed)}-demo-test").is_dir()
    text = (out / "report" / "demo.md").read_text()
    assert f"## {seeded(trained, 1)} against {sft_label}" in text  # each seed against SFT, not against seed 0
    # The learning table reads the same folders: one row per seed, each against the SFT agent.
    from scripts.perf.learning_table import markdown, rows

    table = rows("research", out, [0, 1])
    assert [r["seed"] for r in table] == [0, 1] and all(r["n"] == 4 for r in table)
    assert markdown(table, {}).count("| research |") == 2

    def no_training(*a, **k):
        raise AssertionError("a cached stage trained again")

    monkeypatch.setattr("training.build.train", no_training)
    run_demo(_Quiet(), "research", out, _opts(tmp_path, tiny_model, seeds=(0, 1)))
    # A changed recipe (a harness upgrade that moved a default reads the same) does not delete the
    # trained model and its evaluation: the stage is refused, naming what differs, unless --retrain.
    changed = _opts(tmp_path, tiny_model, seeds=(0, 1))
    changed.rl_overrides.append("optim.weight_decay=0.123")
    with pytest.raises(StaleRunError, match=r"optim\.weight_decay: .* → 0\.123.*--retrain"):
        run_demo(_Quiet(), "research", out, changed)
    assert (out / "rl" / "final").is_dir() and (out / "eval" / f"{trained}-demo-test").is_dir()


def test_unknown_system_and_bad_seeds_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a demo system; choose one of research"):
        run_demo(_Quiet(), "nope", tmp_path)
    with pytest.raises(ValueError, match="--seeds must be distinct"):
        run_demo(_Quiet(), "research", tmp_path, DemoOptions(seeds=(0, 0), threads=1))


def test_prorag_chain_hands_mcts_to_prm_to_rft_to_rl(tmp_path, tiny_model, monkeypatch):
    """ProRAG's chain: the SFT model's MCTS → a PRM on its pairs → RFT samples kept by outcome and
    that PRM → SFT on them → RL from the RFT model scored by the PRM → the trained agent's evaluation.
    A random model finds no contrastive pair and answers nothing right, so two gates are opened
    here (and only here): the MCTS's own step records give one pair if it found none, and the RFT
    filter keeps every sample while still scoring each with the learned PRM. The MCTS and the RFT
    samples run on two questions each."""
    import dataclasses

    import training.data.mcts as mcts_mod
    import training.data.rft as rft_mod

    real_mcts, real_filter = mcts_mod.run_mcts_recipe, rft_mod.rft_filter

    def mcts_with_a_pair(paths, over, out):  # CI size: 2 questions (28 and 29 of train), 2 simulations
        result = real_mcts(paths, [*over, "dataset.limit=30", "mcts.num_simulations=2"], out)
        pairs = Path(out) / "pairs.jsonl"
        if not pairs.read_text().strip():
            steps = [json.loads(x) for x in (Path(out) / "steps.jsonl").read_text().splitlines()]
            a, b = steps[0], steps[1]
            pair = {"prefix": a["prefix"], "chosen": {"step": a["step"]}, "rejected": {"step": b["step"]}}
            pairs.write_text(json.dumps(pair) + "\n")
        return result

    def keep_every_sample(paths, out, cfg):
        assert cfg.step_scorer == "prm" and Path(cfg.step_scorer_args["path"]).parent == demo / "prm"
        return real_filter(paths, out, dataclasses.replace(cfg, min_outcome=0.0, step_threshold=float("-inf")))

    monkeypatch.setattr(mcts_mod, "run_mcts_recipe", mcts_with_a_pair)
    monkeypatch.setattr(rft_mod, "rft_filter", keep_every_sample)
    monkeypatch.setattr("programs.demo.program.RFT_QUESTIONS", 2)  # CI size: 2 questions × 4 samples
    demo = tmp_path / "demo"
    report = run_demo(_Quiet(), "prorag", demo, _opts(tmp_path, tiny_model))
    s = get_system("prorag")
    sft_final = demo / "sft" / "model" / "final"
    assert str(sft_final) in json.loads((demo / "mcts" / "inputs.json").read_text())["overrides"][0]  # backend
    prm = json.loads((demo / "prm" / "config.json").read_text())
    assert prm["model"]["path"] == str(sft_final) and prm["prm"]["data"] == [str(demo / "mcts")]
    assert prm["trainer"]["max_steps"] == 1  # ProRAG's 3 epochs over the one pair: one step of 8
    rft = json.loads((demo / "rft" / "model" / "config.json").read_text())
    assert rft["model"]["path"] == str(sft_final)
    assert rft["sft"]["sources"] == [{"kind": "run", "path": str(demo / "rft" / "set")}]
    rl = json.loads((demo / "rl" / "config.json").read_text())
    assert rl["model"]["path"] == str(demo / "rft" / "model" / "final")
    assert rl["algo"]["step_scorer_path"] == str(demo / "prm" / "final")
    assert rl["rollout"]["agent"]["max_turns"] == s.agent["max_turns"]
    _, sft_label, trained = labels(s)
    manifest = json.loads((demo / "eval" / f"{trained}-demo-test" / "manifest.json").read_text())
    assert manifest["config"]["backend"]["model"] == str(demo / "rl" / "final")
    assert f"## {trained} against {sft_label}" in (report / "demo.md").read_text()
