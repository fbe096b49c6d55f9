"""SFT: every data source's loss mask is exact (model tokens only), bad records name file:line,
synthesized trajectories keep only searches that surfaced gold, and a few SFT steps on a tiny
Llama lower the loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.datasets import corpus_path, load_examples
from harness.config import compose
from harness.eval_config import RetrieverConfig
from harness.retrieval.factory import build_retriever
from harness.tokenization import byte_tokenizer
from pipelines.dialects import resolve_dialect
from training.batch import collate
from training.config import TrainConfig
from training.sft.sft_data import SFTDataError, load_chat, load_run, load_synth, parse_filter, split_observations
from training.synthesize import Synthesizer, corpus_titles, synthesize

FIXTURE_RUN = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "research-demo-test"


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def by_role(traj, tok) -> dict[str, str]:
    """Decoded text of each role's tokens, in order, from the collated mask (not the segments)."""
    b = collate([traj])
    ids, mask = b.input_ids[0].tolist(), b.loss_mask[0].tolist()
    return {
        "model": tok.decode([i for i, m in zip(ids, mask, strict=True) if m == 1]),
        "other": tok.decode([i for i, m in zip(ids, mask, strict=True) if m == 0]),
        "all": tok.decode(ids),
    }


# ---- (b) chat messages -------------------------------------------------------------------------
def test_chat_messages_train_assistant_only_and_mask_pasted_retrievals(tmp_path):
    tok = byte_tokenizer()
    info = "<information>Doc 1: Paris is in France.</information>"
    msgs = [
        {"role": "system", "content": "Answer with search."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": f"<search>capital France</search>{info}<answer>Paris</answer>"},
    ]
    f = write_jsonl(tmp_path / "chat.jsonl", [{"messages": msgs}])
    (t,) = load_chat(f, tok)
    r = by_role(t, tok)
    assert "<search>capital France</search>" in r["model"] and "<answer>Paris</answer>" in r["model"]
    assert "Paris is in France" not in r["model"] and info in r["other"]
    assert "Capital of France?" in r["other"] and "Answer with search." not in r["model"]
    # the tokens round-trip to the chat template's rendering of the whole conversation
    assert r["all"] == tok.apply_chat_template(msgs, tokenize=False)
    roles = [s.role for s in t.segments]
    assert roles == ["prompt", "model", "observation", "model"]


def test_sharegpt_and_prorag_layouts(tmp_path):
    tok = byte_tokenizer()
    conv = [{"from": "human", "value": "Q?"}, {"from": "gpt", "value": "<answer>A</answer>"}]
    prorag = {
        "id": "p1",
        "history": "Q?\n<step>\n",
        "completion": "x </step>\n<subquery> q </subquery>\n<retrieval>\nDoc 1 stuff\n</retrieval>\n"
        "<step>\ny </step>\n<answer> A </answer>",
    }
    f = write_jsonl(tmp_path / "c.jsonl", [{"conversations": conv}, prorag])
    a, b = load_chat(f, tok)
    assert by_role(a, tok)["model"].startswith("<answer>A</answer>")
    r = by_role(b, tok)
    assert (
        r["model"] == "x </step>\n<subquery> q </subquery>\n\n<step>\ny </step>\n<answer> A </answer>" + tok.eos_token
    )
    assert "Doc 1 stuff" in r["other"] and b.segments[0].role == "prompt" and b.segments[0].text == "Q?\n<step>\n"


def test_split_observations_unclosed_block_is_observation_to_the_end():
    assert split_observations("a<result>b") == [("model", "a"), ("observation", "<result>b")]
    assert split_observations("plain") == [("model", "plain")]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "malformed JSON"),
        (json.dumps({"messages": [{"role": "user", "content": "q"}]}), "no assistant turn"),
        (json.dumps({"messages": [{"role": "wizard", "content": "q"}]}), "message 0"),
        (json.dumps({"text": "x"}), "expected 'messages'"),
        (json.dumps({"history": "h", "completion": 3}), "must both be strings"),
        (json.dumps({"messages": [{"role": "assistant", "content": "a"}]}), "starts with an assistant"),
        (
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "q"},
                        {"role": "assistant", "content": "<information>x</information>"},
                    ]
                }
            ),
            "nothing left",
        ),
    ],
)
def test_malformed_chat_record_names_file_and_line(tmp_path, line, message):
    good = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    f = tmp_path / "bad.jsonl"
    f.write_text(good + "\n\n" + line + "\n")
    with pytest.raises(SFTDataError, match=rf"bad\.jsonl:3: .*{message}"):
        load_chat(f, byte_tokenizer())


# ---- (a) run directories with a score filter ---------------------------------------------------
def test_filter_is_safe_and_evaluates():
    f = parse_filter("em >= 1 and n_searches > 1 or finish_reason == 'x'")
    assert f({"em": 1.0, "n_searches": 2, "finish_reason": "answer"})
    assert not f({"em": 1.0, "n_searches": 1, "finish_reason": "answer"})
    assert parse_filter("0 < f1 <= 0.5")({"f1": 0.5}) and not parse_filter("0 < f1 <= 0.5")({"f1": 0.0})
    assert not parse_filter("em >= 1")({"em": None})  # a missing metric passes no threshold
    for bad in ("__import__('os').system('x')", "em.real > 0", "[1][0]", "em + 1 > 0", "lambda: 1"):
        with pytest.raises(ValueError, match="not allowed"):
            parse_filter(bad)
    with pytest.raises(KeyError, match="unknown name 'bogus'"):
        parse_filter("bogus > 0")({"em": 1})


def test_run_source_filters_on_scores_and_keeps_exact_mask():
    tok = byte_tokenizer()
    scores = [json.loads(x) for x in (FIXTURE_RUN / "scores.jsonl").read_text().splitlines()]
    want = {s["id"] for s in scores if s["em"] >= 1 and s["n_searches"] >= 2 and not s.get("error")}
    got = load_run(FIXTURE_RUN, tok, "em >= 1 and n_searches >= 2")
    assert {t.example_id for t in got} == want and want
    src = {
        json.loads(x)["example_id"]: json.loads(x)
        for x in (FIXTURE_RUN / "trajectories.jsonl").read_text().splitlines()
    }
    for t in got:
        r = by_role(t, tok)
        segs = src[t.example_id]["segments"]
        assert r["model"] == "".join(s["text"] for s in segs if s["role"] == "model")
        assert r["other"] == "".join(s["text"] for s in segs if s["role"] != "model")
    assert len(load_run(FIXTURE_RUN, tok)) > len(got)


# ---- (c) synthesized -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo():
    examples = load_examples("demo", "test")
    corpus = corpus_path("demo", "test")
    return examples, corpus


def test_synthesize_demo_keeps_only_gold_surfacing_searches(tmp_path, demo):
    examples, corpus = demo
    titles = corpus_titles(corpus)
    retriever = build_retriever(RetrieverConfig(kind="memory", topk=3), str(corpus))
    d = resolve_dialect("search_r1", "small")
    stats = synthesize(examples[:6], d, retriever, tmp_path / "s.jsonl", titles=titles)
    recs = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert stats.total == 6 and stats.kept == len(recs) > 0
    for rec in recs:
        ex = next(e for e in examples if e.id == rec["id"])
        gold = set(ex.metadata["supporting_doc_ids"])
        assert {s["gold"] for s in rec["searches"]} == gold  # each hop surfaced its own gold document
        assert all(s["gold"] in s["doc_ids"] for s in rec["searches"])
        response = "".join(t["text"] for t in rec["turns"])
        assert d.validate_format(response)[0] and d.extract_answer(response) == ex.answers[0]
    # a corpus without the second-hop documents: retrieval cannot surface them, nothing is kept
    hop2 = {e.metadata["supporting_doc_ids"][1] for e in examples[:6]}
    pruned = tmp_path / "pruned.jsonl"
    pruned.write_text(
        "".join(x + "\n" for x in Path(corpus).read_text().splitlines() if json.loads(x)["id"] not in hop2)
    )
    s2 = Synthesizer(d, build_retriever(RetrieverConfig(kind="memory", topk=3), str(pruned)), titles=titles)
    assert all(s2.one(e) is None for e in examples[:6])
    assert s2.stats.kept == 0 and s2.stats.dropped["retrieval missed the gold"] == 6


def test_synthesize_demo_year_templates_read_the_year_in_the_second_passage(tmp_path):
    """The demo's year templates (the answer is a year only the second passage holds) synthesize
    like the others: both hops surface their gold and the answer is the second passage's year."""
    years = ("inventor's birth year", "company's founding year")
    examples = [e for e in load_examples("demo", "train") if e.metadata["template"] in years][:6]
    corpus = corpus_path("demo", "train")
    retriever = build_retriever(RetrieverConfig(kind="memory", topk=3), str(corpus))
    d = resolve_dialect("research", "small")
    stats = synthesize(examples, d, retriever, tmp_path / "s.jsonl", titles=corpus_titles(corpus))
    assert stats.kept == 6, stats.summary()
    for rec, ex in zip(map(json.loads, (tmp_path / "s.jsonl").read_text().splitlines()), examples, strict=True):
        year = ex.answers[0]
        second = [t["text"] for t in rec["turns"] if t["role"] == "observation"][1]
        assert [s["gold"] for s in rec["searches"]] == ex.metadata["supporting_doc_ids"]
        assert year in second  # read off the second search's passages
        assert d.extract_answer("".join(t["text"] for t in rec["turns"])) == year


@pytest.mark.parametrize(
    "name, variant", [("research", "exact"), ("r1_searcher", "exact"), ("prorag", "exact"), ("rag_r1", "small")]
)
def test_synth_records_load_with_exact_segments(tmp_path, demo, name, variant):
    examples, corpus = demo
    tok = byte_tokenizer()
    d = resolve_dialect(name, variant)
    retriever = build_retriever(RetrieverConfig(kind="memory", topk=3), str(corpus))
    stats = synthesize(
        examples[:2], d, retriever, tmp_path / "s.jsonl", tokenizer=tok, max_doc_tokens=64, titles=corpus_titles(corpus)
    )
    assert stats.kept == 2, stats.summary()
    rec = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[0])
    (t,) = load_synth(tmp_path / "s.jsonl", tok, limit=1)
    assert t.segments[0].token_ids == d.prompt_ids(tok, rec["question"], chat=True)  # the agent's prompt
    r = by_role(t, tok)
    assert r["model"] == "".join(x["text"] for x in rec["turns"] if x["role"] == "model") + tok.eos_token
    obs = [s for s in t.segments if s.role == "observation"]
    assert [s.text for s in obs] == [x["text"] for x in rec["turns"] if x["role"] == "observation"]
    assert all(tok.decode(s.token_ids) == s.text for s in t.segments[1:])


def test_synth_record_errors_name_line(tmp_path):
    f = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {"dialect": "search_r1", "question": "q", "turns": [{"role": "model", "text": "a"}]},
            {"dialect": "nope", "question": "q", "turns": []},
        ],
    )
    with pytest.raises(SFTDataError, match=r"s\.jsonl:2: "):
        load_synth(f, byte_tokenizer())


# ---- the trainer -------------------------------------------------------------------------------
SFT_RECIPE = """
name: sft-tiny
model:
  tiny: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
algo: {kind: sft}
sft: {batch_size: 4}
optim: {lr: 3.0e-3, micro_batch_size: 2}
trainer: {max_steps: 6, save_every: 3, tensorboard: false, progress: false}
"""


@pytest.mark.slow
def test_sft_steps_lower_the_loss_and_checkpoint(tmp_path, demo):
    from training.build import build_trainer

    examples, corpus = demo
    data = tmp_path / "s.jsonl"
    retriever = build_retriever(RetrieverConfig(kind="memory", topk=2), str(corpus))
    synthesize(examples[:4], resolve_dialect("search_r1", "small"), retriever, data, titles=corpus_titles(corpus))
    (tmp_path / "r.yaml").write_text(SFT_RECIPE)
    cfg = compose(TrainConfig, [tmp_path / "r.yaml"], [f"sft.sources=[{{kind: synth, path: {data}}}]"])
    trainer = build_trainer(cfg, tmp_path / "run")
    before = trainer.evaluate_loss()
    final = trainer.train()
    after = trainer.evaluate_loss()
    assert after < before - 0.1, (before, after)
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == list(range(1, 7)) and all(m["tokens/trained"] > 0 for m in logged)
    assert (final / "config.json").exists() and (tmp_path / "run" / "checkpoints" / "step-6").is_dir()
