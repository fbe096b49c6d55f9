"""The tool_call dialect trained like the seed systems: `harness data synthesize` writes its
trajectories, SFT loads them with the loss on the generated tokens only (each turn's end-of-turn
token included, every tool message masked) and with the very ids the agent would have run on,
and a GRPO step runs with tool-calling rollouts on a tiny Llama."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.datasets import corpus_path, load_examples
from benchmarks.tiny_recipes import grpo_recipe
from harness.backends.scripted import ScriptedBackend
from harness.config import compose
from harness.eval_config import RetrieverConfig
from harness.models import load_tokenizer
from harness.retrieval.factory import build_retriever
from harness.tokenization import byte_tokenizer
from harness.types import Example
from pipelines.dialects import resolve_dialect
from pipelines.search_agent import AgentConfig, SearchAgent
from training.batch import collate
from training.config import TrainConfig
from training.rewards import REWARDS
from training.sft.sft_data import load_synth
from training.synthesize import corpus_titles, synthesize

if "test_model_text_length" not in REWARDS:
    # A random tiny model never answers right; a reward that varies with its text gives GRPO an
    # advantage signal (observations are excluded: the same tool message follows every sample).
    class ModelTextLength:
        def __call__(self, traj):
            return sum(len(s.text) for s in traj.segments if s.role == "model") / 100.0, {}

    REWARDS.register("test_model_text_length", ModelTextLength)


@pytest.fixture(scope="module")
def demo():
    corpus = corpus_path("demo", "test")
    retriever = build_retriever(RetrieverConfig(kind="memory", topk=3), str(corpus))
    return load_examples("demo", "test"), retriever, corpus_titles(corpus)


def synth(tmp_path, demo, tok, template=None, n=3):
    examples, retriever, titles = demo
    d = resolve_dialect("tool_call")
    d = d.with_chat_template(template) if template else d
    out = tmp_path / "s.jsonl"
    stats = synthesize(examples[:n], d, retriever, out, tokenizer=tok, max_doc_tokens=64, titles=titles)
    assert stats.kept == n, stats.summary()
    return d, out, [json.loads(x) for x in out.read_text().splitlines()]


def test_synthesized_tool_call_turns_parse_and_name_their_template(tmp_path, demo):
    d, _, recs = synth(tmp_path, demo, byte_tokenizer(), "qwen2.5.jinja")
    rec = recs[0]
    assert rec["dialect"] == "tool_call" and rec["chat_template"] == "qwen2.5.jinja"
    model = [t["text"] for t in rec["turns"] if t["role"] == "model"]
    assert all("<tool_call>" in t for t in model[:-1]) and model[-1].endswith(f"Answer: {rec['answers'][0]}")
    assert [d.parse_action(t, eos=True).kind for t in model] == ["search"] * (len(model) - 1) + ["answer"]


@pytest.mark.parametrize("template", ["qwen2.5.jinja", "qwen3.jinja"])
def test_sft_ids_and_mask_are_what_the_agent_generates_and_appends(tmp_path, demo, template):
    """Replaying a synthesized record's model turns through the agent gives the same ids as SFT
    loads, and SFT's loss mask covers exactly the agent's model segments."""
    tok = load_tokenizer("smollm2-135m-instruct")
    d, path, recs = synth(tmp_path, demo, tok, template, n=2)
    _, retriever, _ = demo
    for rec, traj in zip(recs, load_synth(path, tok), strict=True):
        model = [t["text"] for t in rec["turns"] if t["role"] == "model"]
        backend = ScriptedBackend([{"match": rec["question"], "turns": model}], tokenizer=tok)
        cfg = AgentConfig(chat_template=template, topk=3, max_doc_tokens=64, max_total_tokens=4096)
        agent = SearchAgent(backend, retriever, "tool_call", cfg)
        run = asyncio.run(agent.arun(Example(rec["id"], rec["question"], rec["answers"])))
        assert run.finish_reason == "answer" and run.prediction == rec["answers"][0]
        assert [(s.role, s.token_ids) for s in traj.segments] == [(s.role, s.token_ids) for s in run.segments]
        b = collate([traj])
        ids, mask = b.input_ids[0].tolist(), b.loss_mask[0].tolist()
        trained = [i for i, m in zip(ids, mask, strict=True) if m == 1]
        assert trained == [t for s in run.segments if s.role == "model" for t in s.token_ids]
        assert trained.count(tok.eos_token_id) == len(model)  # every turn's own end of turn is trained
        untrained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m == 0])
        assert untrained.count("<tool_response>") == len(model) - 1 and '"arguments": {"query"' not in untrained


SFT_RECIPE = """
name: sft-tool-call
model:
  tiny: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
algo: {kind: sft}
sft: {batch_size: 2}
optim: {lr: 3.0e-3, micro_batch_size: 2, threads: 1}
trainer: {max_steps: 2, save_every: 0, tensorboard: false, progress: false}
"""


def test_sft_trains_on_synthesized_tool_call_trajectories(tmp_path, demo):
    from training.build import build_trainer

    _, data, _ = synth(tmp_path, demo, byte_tokenizer(), n=2)  # the tiny model's byte tokenizer and its template
    (tmp_path / "r.yaml").write_text(SFT_RECIPE)
    cfg = compose(TrainConfig, [tmp_path / "r.yaml"], [f"sft.sources=[{{kind: synth, path: {data}}}]"])
    trainer = build_trainer(cfg, tmp_path / "run")
    m = trainer.step()
    assert m["loss"] == m["loss"] and m["loss"] > 0
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged and logged[0]["tokens/trained"] > 0


def test_a_grpo_step_runs_with_tool_calling_rollouts(tmp_path):
    from training.build import build_trainer

    recipe = grpo_recipe(
        "tool-call",
        "rollout.method=tool_call",
        "rollout.agent.chat=true",
        "rollout.agent.max_turns=2",
        "rollout.sampling.temperature=1.0",
        "algo.reward=test_model_text_length",
        "trainer.save_every=0",
    )
    (tmp_path / "r.yaml").write_text(recipe)
    trainer = build_trainer(compose(TrainConfig, [tmp_path / "r.yaml"], []), tmp_path / "run")
    m = trainer.step()
    assert all(v == v for v in m.values()), m  # no NaN
    assert m["grad_norm"] > 0
