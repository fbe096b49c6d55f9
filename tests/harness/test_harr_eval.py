"""A trained HARR query encoder evaluates: ``--retriever dense|harr --encoder DIR`` (sidecar, LoRA adapter)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from harness.eval_config import RetrieverConfig
from harness.retrieval.encoders import SIDECAR, Encoder, resolve_encoder
from harness.retrieval.factory import build_retriever
from harness.retrieval.stochastic import QueryTower, StateFormat, StochasticDenseRetriever
from tests.helpers.harr_toy import tiny_tower, toy_index

TEMPLATE = "Q={question} | H={history} | now: {query}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A toy index built with one tiny tower, then a *different* tower saved as the trained encoder
    (so results differ from the index's own encoder), with a custom state format in its sidecar."""
    tmp = tmp_path_factory.mktemp("harr_eval")
    index = toy_index(tmp, tiny_tower(seed=0))
    trained = tiny_tower(seed=5)
    retriever = StochasticDenseRetriever.from_index_dir(
        index, trained, n_candidates=10, tau=0.1, state_format=StateFormat(template=TEMPLATE, max_history=2)
    )
    enc_dir = retriever.save_tower(tmp / "encoder")
    return tmp, index, enc_dir, trained


def test_sidecar_records_the_encoder_and_state(saved):
    _, _, enc_dir, trained = saved
    side = json.loads((enc_dir / SIDECAR).read_text())
    assert side["pooling"] == "mean" and side["max_length"] == trained.max_length and side["normalize"] is True
    assert side["state"]["template"] == TEMPLATE and side["state"]["max_history"] == 2 and side["tau"] == 0.1
    spec = resolve_encoder(str(enc_dir))
    assert (spec.pooling, spec.max_length, spec.normalize) == ("mean", trained.max_length, True)


def test_dense_encoder_flag_uses_the_trained_query_encoder(saved):
    _, index, enc_dir, trained = saved
    r = build_retriever(RetrieverConfig(kind="dense", index=str(index), encoder=str(enc_dir)))
    assert r.index_id.endswith(f"+q:{enc_dir}")  # runs and caches tell query encoders apart
    assert r.inner.encoder.max_length == trained.max_length
    q = "Name the secret of the purple owl?"
    vec = trained.encode([q], kind="query")  # [1, H]: what the trained tower says
    _, rows = r.inner.index.search(vec, 3)
    assert [d.id for d in r.search([q], 3)[0]] == [r.inner.docs[i].id for i in rows[0]]


def test_harr_kind_is_greedy_with_the_trained_state_format(saved):
    _, index, enc_dir, _ = saved
    r = build_retriever(RetrieverConfig(kind="harr", index=str(index), encoder=str(enc_dir), topk=3))
    assert isinstance(r, StochasticDenseRetriever)  # uncached: results depend on the state
    assert r.greedy and r.state_format.template == TEMPLATE and r.tau == pytest.approx(0.1)
    from harness.retrieval.state import HistoryStep, RetrievalState

    st = RetrievalState("Who?", (HistoryStep("first", ("The glass harp clock",)),), key="q#0")
    res = r.search(["second"], 3, state=[st])
    assert res.samples[0]["state"].startswith("Q=Who? | H=") and res.samples[0]["state"].endswith("now: second")
    assert res.samples[0]["greedy"] and len(res[0]) == 3
    # Greedy: the top-3 of the trained tower for that state text, twice the same.
    assert [d.id for d in r.search(["second"], 3, state=[st])[0]] == [d.id for d in res[0]]


def test_lora_adapter_dir_loads_merged(tmp_path):
    base_dir = tiny_tower(seed=3).save(tmp_path / "base")
    tower = QueryTower(str(base_dir), lora_r=4)
    with torch.no_grad():  # LoRA's B starts at zero: make the adapter change something
        for name, p in tower.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.5)
    out = tower.save(tmp_path / "trained")
    texts = ["Recall the token of the sleeping giant?", "salt marsh"]
    want = tower.encode(texts, kind="query")  # [2, H]
    for path in (out / "adapter", out):  # the adapter alone (merged into its base) and the merged dir
        spec = resolve_encoder(str(path))
        assert (spec.base is not None) == (path.name == "adapter")
        got = Encoder(str(path), device="cpu").encode(texts, kind="query")
        assert np.allclose(got, want, atol=1e-4), path
    base = Encoder(str(base_dir), device="cpu").encode(texts, kind="query")
    assert not np.allclose(base, want, atol=1e-3)  # the adapter did change the vectors


@pytest.mark.slow  # two CLI evals (~10-20 s on the shared VM)
def test_cli_eval_with_trained_encoder(saved, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    _, index, enc_dir, _ = saved
    data = tmp_path / "data" / "hotpotqa"
    data.mkdir(parents=True)
    qs = ["Name the secret of the purple owl?", "Tell the password for marble harbour?"]
    data.joinpath("dev.jsonl").write_text(
        "".join(json.dumps({"id": f"q{i}", "question": q, "golden_answers": ["W3"]}) + "\n" for i, q in enumerate(qs))
    )
    script = tmp_path / "script.jsonl"
    script.write_text(
        "".join(json.dumps({"match": q, "turns": [f"<search>{q}</search>", "<answer>W3</answer>"]}) + "\n" for q in qs)
    )
    common = ["eval", "-m", "search_r1", "-d", "hotpotqa", "--split", "dev", "--data-dir", str(tmp_path / "data")]
    common += ["--backend", "scripted", "--script", str(script), "--index", str(index), "--encoder", str(enc_dir)]
    for kind in ("harr", "dense"):
        res = CliRunner().invoke(app, [*common, "--retriever", kind, "--out", str(tmp_path / kind)])
        assert res.exit_code == 0, res.output
        run = next((tmp_path / kind).iterdir())
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["config"]["retriever"]["encoder"] == str(enc_dir) and str(enc_dir) in manifest["index_id"]
        trajs = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
        assert len(trajs) == 2 and all(len(t["searches"]) == 1 for t in trajs)
        # the first question's (trajectories.jsonl is in finishing order: two questions run at once)
        sample = next(t for t in trajs if t["example_id"] == "q0")["searches"][0].get("sample")
        if kind == "harr":  # the history-aware state in the trained format, greedy
            assert sample["greedy"] and sample["state"].startswith(f"Q={qs[0]} | H=[]")
        else:
            assert sample is None
