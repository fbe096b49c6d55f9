"""HARR's stochastic retriever: Plackett–Luce maths, sampling, history-aware state, agent hook, gradients."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from harness.backends.scripted import ScriptedBackend
from harness.retrieval.state import HistoryStep, RetrievalState, accepts_state
from harness.retrieval.stochastic import (
    StateFormat,
    StochasticDenseRetriever,
    pl_log_prob,
    pl_sample,
    render_state,
)
from harness.types import Example, SearchRecord, Trajectory
from pipelines.search_agent import AgentConfig, SearchAgent
from tests.helpers.harr_toy import tiny_tower, toy_index


def test_pl_log_prob_matches_hand_computation():
    s = [1.0, 2.0, 0.5]
    got = pl_log_prob(torch.tensor([s]), torch.tensor([[1, 0]]))[0].item()
    e = [math.exp(x) for x in s]
    want = math.log(e[1] / (e[0] + e[1] + e[2]) * e[0] / (e[0] + e[2]))
    assert got == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_pl_probabilities_sum_to_one_over_all_orderings(k):
    scores = torch.tensor([0.3, -1.2, 2.0, 0.7])
    orders = list(itertools.permutations(range(4), k))
    lp = pl_log_prob(scores.expand(len(orders), 4), torch.tensor(orders))
    assert lp.exp().sum().item() == pytest.approx(1.0, abs=1e-6)


def test_pl_padding_is_ignored():
    scores = torch.tensor([[0.3, -1.2, 2.0], [0.3, -1.2, float("-inf")]])
    order = torch.tensor([[2, 0], [1, 0]])
    mask = torch.tensor([[True, True], [True, False]])
    lp = pl_log_prob(scores, order, mask)
    assert lp[1].item() == pytest.approx(pl_log_prob(scores[1:, :2], torch.tensor([[1]]))[0].item(), abs=1e-6)


def test_sampling_frequencies_match_probabilities():
    """20,000 seeded draws of ordered pairs from 4 candidates; every one of the 12 frequencies lies
    within 4 binomial standard errors of its PL probability."""
    scores = torch.tensor([1.0, 0.2, -0.5, 1.5])
    gen = torch.Generator().manual_seed(1234)
    n = 20_000
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        key = tuple(pl_sample(scores, 2, gen).tolist())
        counts[key] = counts.get(key, 0) + 1
    orders = list(itertools.permutations(range(4), 2))
    probs = pl_log_prob(scores.expand(len(orders), 4), torch.tensor(orders)).exp().tolist()
    for o, p in zip(orders, probs, strict=True):
        se = math.sqrt(p * (1 - p) / n)
        assert abs(counts.get(o, 0) / n - p) < 4 * se, (o, counts.get(o, 0) / n, p)


def test_render_state_format_and_cap():
    st = RetrievalState("Who?", (HistoryStep("first q", ("A", "B")), HistoryStep("second q", ("C",))))
    text = render_state("third q", st, StateFormat(history="titles"))
    assert text.startswith("Original Question: Who?\nHistory: [")
    assert '"query": "first q"' in text and '"retrieved": ["C"]' in text and text.endswith("Query: third q")
    # HARR's own (the default): per model turn, {"sub_query", "answer"} as json.dumps writes it.
    harr = RetrievalState("Who?", st.history, turns=(HistoryStep(" a ", (), "think 1"), HistoryStep(None, (), None)))
    assert render_state("q", harr, StateFormat()) == (
        'Original Question: Who?\nHistory: [{"sub_query": " a ", "answer": "think 1"}, '
        '{"sub_query": null, "answer": null}]\nQuery: q'
    )
    short = render_state("third q", st, StateFormat(max_chars=90, history="titles"))
    assert "first q" not in short and short.endswith("Query: third q") and len(short) <= 90
    assert render_state("third q", st, StateFormat(stateful=False)) == "third q"
    assert render_state("q", None, StateFormat()) == "q"


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    tower = tiny_tower(seed=0)
    return tower, toy_index(tmp_path_factory.mktemp("harr"), tower)


def test_greedy_is_top_k_and_records_recompute(toy):
    from harness.retrieval.index import load_index

    tower, index_dir = toy
    plain = load_index(index_dir, encoder=tower)
    greedy = StochasticDenseRetriever.from_index_dir(index_dir, tower, n_candidates=10, tau=0.05, greedy=True)
    q = ["where is the copper mine"]
    assert [d.id for d in greedy.search(q, 3)[0]] == [d.id for d in plain.search(q, 3)[0]]
    sampler = StochasticDenseRetriever.from_index_dir(index_dir, tower, n_candidates=10, tau=0.01, seed=3)
    res = sampler.search(q * 4, 3)
    recs = res.samples
    assert len(res) == 4 and all(len(r["candidates"]) == 10 and len(r["sampled_ids"]) == 3 for r in recs)
    assert all(set(r["sampled_ids"]) <= set(r["candidates"]) for r in recs)
    assert len({tuple(r["sampled_ids"]) for r in recs}) > 1  # tau 0.01 on a random tower: draws differ
    again = sampler.recompute_logprobs(recs)
    assert torch.allclose(again, torch.tensor([r["logprob"] for r in recs]), atol=1e-3)


def test_agent_passes_history_and_records_samples(toy):
    tower, index_dir = toy
    retriever = StochasticDenseRetriever.from_index_dir(index_dir, tower, n_candidates=8, tau=0.1)
    assert accepts_state(retriever)
    turns = ["<think>the loom</think><search>steam loom</search>", "<search>code</search>"]
    script = [{"match": "Question: Which code", "turns": turns}]
    agent = SearchAgent(ScriptedBackend(script), retriever, "search_r1", AgentConfig(max_turns=2, topk=2))
    traj = agent.run_examples([Example("x", "Which code does the loom keep?", ("W1",))])[0]
    assert [s.query for s in traj.searches] == ["steam loom", "code"]
    first, second = (s.sample for s in traj.searches)
    assert first["state"].endswith("History: []\nQuery: steam loom")
    # HARR's history: the earlier turn's sub-query and its reasoning block (generator.py).
    assert '[{"sub_query": "steam loom", "answer": "the loom"}]' in second["state"]
    assert second["sampled_ids"] == traj.searches[1].doc_ids
    back = Trajectory.from_dict(traj.to_dict())
    assert back.searches[1].sample == second
    old = traj.searches[0].to_dict()
    del old["sample"]  # a run written before the field existed still loads
    assert SearchRecord.from_dict(old).sample is None


def test_gradients_flow_only_into_the_query_tower(toy):
    tower, index_dir = toy
    retriever = StochasticDenseRetriever.from_index_dir(index_dir, tower, n_candidates=10, tau=0.1)
    tower.freeze_reference()
    before = retriever.faiss_index.reconstruct_n(0, retriever.faiss_index.ntotal).copy()
    recs = retriever.search(["the bell tower", "salt marsh"], 2).samples
    tower.zero_grad()
    lp = retriever.recompute_logprobs(recs)
    ref = retriever.recompute_logprobs(recs, reference=True)
    assert lp.requires_grad and not ref.requires_grad
    lp.sum().backward()
    grads = [p.grad for p in tower.model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(p.grad is None for p in tower._reference.parameters())
    torch.optim.SGD(tower.model.parameters(), lr=1.0).step()
    assert (retriever.faiss_index.reconstruct_n(0, retriever.faiss_index.ntotal) == before).all()


def test_lora_trains_only_adapters(tmp_path):
    tower = tiny_tower(seed=1, lora_r=4)
    retriever = StochasticDenseRetriever.from_index_dir(toy_index(tmp_path, tower), tower, n_candidates=6, tau=0.1)
    recs = retriever.search(["the rope walk"], 2).samples
    retriever.recompute_logprobs(recs).sum().backward()
    named = dict(tower.model.named_parameters())
    with_grad = {n for n, p in named.items() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad and all("lora_" in n for n in with_grad)
    assert not any(p.requires_grad for n, p in named.items() if "lora_" not in n)
    out = tower.save(tmp_path / "saved")  # merged: a plain HF model dir the Encoder loads
    from harness.retrieval.encoders import Encoder

    enc = Encoder(str(out))
    assert enc.dim == 32 and (out / "adapter").is_dir()
