"""Rollouts come from THE agent: eval/rollout parity, groups by prompt, role-based masks,
token-exact segments, per-sample seeds, policy versions, and the prompt sampler's position."""

from __future__ import annotations

import pytest

from benchmarks.build import dataset_retriever, simple_evaluate
from benchmarks.datasets import load_examples
from harness.backends.base import SamplingParams
from harness.backends.scripted import ScriptedBackend
from harness.config import from_dict
from harness.eval_config import EvalConfig
from harness.runlog import RunDir
from pipelines.search_agent import AgentConfig, SearchAgent
from training.batch import collate
from training.rl.rollout import PromptSampler, collect, sample_seed


@pytest.fixture(scope="module")
def examples():
    return load_examples("demo", limit=3)


def script_for(examples):
    """Each question: one search, then an answer (so trajectories hold all three roles)."""
    return [
        {"match": e.question, "turns": [f"<search>{e.question}</search>", f"<answer>{e.answers[0]}</answer>"]}
        for e in examples
    ]


def make_agent(examples, **agent_opts):
    retriever = dataset_retriever(from_dict(EvalConfig, {"retriever": {"kind": "memory"}}).retriever, "demo")
    agent = SearchAgent(
        ScriptedBackend(script_for(examples)), retriever, "search_r1", from_dict(AgentConfig, agent_opts)
    )
    return agent, retriever


def test_rollouts_and_eval_produce_identical_trajectories(tmp_path, examples):
    """Eval/rollout parity: scripted backend, fixed seed, the same examples → the same token ids,
    roles, predictions, finish reasons and searches."""
    opts = {"max_total_tokens": 100000}
    agent, retriever = make_agent(examples, **opts)
    cfg = from_dict(
        EvalConfig,
        {
            "method": "search_r1",
            "dataset": {"name": "demo", "limit": 3},
            "retriever": {"kind": "memory"},
            "agent": opts,
            "out": str(tmp_path),
        },
    )
    simple_evaluate(cfg, backend=ScriptedBackend(script_for(examples)), retriever=retriever)
    evaluated = {t.example_id: t for t in RunDir(tmp_path / "search_r1-demo-test").trajectories()}

    rolled = collect(agent, examples, 1, SamplingParams(temperature=0.0), policy_version=0, seed=0)
    assert rolled.group_ids == [0, 1, 2]
    assert len(rolled.trajectories) == len(evaluated) == 3
    for t in rolled.trajectories:
        e = evaluated[t.example_id]
        assert [(s.role, s.token_ids) for s in t.segments] == [(s.role, s.token_ids) for s in e.segments]
        assert (t.prediction, t.finish_reason, t.response_text) == (e.prediction, e.finish_reason, e.response_text)
        assert [s.query for s in t.searches] == [s.query for s in e.searches]


def test_groups_are_prompt_indices_and_masks_follow_roles(examples):
    agent, _ = make_agent(examples, max_total_tokens=100000)
    rolled = collect(agent, examples[:2], 3, SamplingParams(temperature=1.0), policy_version=7, seed=5, group_offset=4)
    # example-major order; group id = the prompt's index (shifted by the rank's offset), never per sample
    assert rolled.group_ids == [4, 4, 4, 5, 5, 5]
    assert [t.example_id for t in rolled.trajectories] == [examples[0].id] * 3 + [examples[1].id] * 3
    assert [t.sample_index for t in rolled.trajectories] == [0, 1, 2, 0, 1, 2]
    assert all(t.policy_version == 7 for t in rolled.trajectories)
    tok = agent.tokenizer
    for t in rolled.trajectories:
        roles = [s.role for s in t.segments]
        assert roles[0] == "prompt" and "model" in roles and "observation" in roles
        for s in t.segments:
            if s.role == "model":  # token-exact: the ids the backend produced, decoding to its text
                assert tok.decode(s.token_ids) == s.text
    batch = collate(rolled.trajectories, [0.0] * 6, rolled.group_ids)
    for i, t in enumerate(rolled.trajectories):
        expect = [m for s in t.segments for m in ([1 if s.role == "model" else 0] * len(s.token_ids))]
        n = len(expect)
        assert batch.loss_mask[i, :n].tolist() == expect  # 0 on prompt and observation tokens
        assert batch.input_ids[i, :n].tolist() == [x for s in t.segments for x in s.token_ids]
    assert batch.group_ids.tolist() == [4, 4, 4, 5, 5, 5]


def test_every_sample_of_a_step_gets_its_own_seed():
    seeds = {sample_seed(s, i, j, 4) for s in range(3) for i in range(8) for j in range(4)}
    assert len(seeds) == 3 * 8 * 4


def test_prompt_sampler_is_deterministic_and_resumable(examples):
    many = load_examples("demo", limit=5)
    a = PromptSampler(many, seed=3)
    first = [e.id for e in a.next(3)]
    state = a.state()
    rest = [e.id for e in a.next(9)]  # crosses into epochs 2 and 3 (reshuffled)
    b = PromptSampler(many, seed=3)
    b.load(state)
    assert [e.id for e in b.next(9)] == rest
    assert sorted(first + rest[:2]) == sorted(e.id for e in many)  # an epoch covers every example once
    with pytest.raises(ValueError):
        PromptSampler([])


def test_sglang_weight_sync_saves_then_updates_from_disk_and_flushes(tmp_path):
    """The sglang side of weight sync against a recording HTTP server: a loadable safetensors
    directory, then /update_weights_from_disk {model_path, weight_version, flush_cache}, then /flush_cache."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from safetensors.torch import load_file

    from harness.backends.sglang import SGLangBackend
    from harness.tokenization import byte_tokenizer
    from training.config import ModelConfig
    from training.engine import build_model
    from training.weight_sync import sync_weights

    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            n = int(self.headers.get("Content-Length") or 0)
            calls.append((self.path, json.loads(self.rfile.read(n) or b"{}")))
            body = json.dumps({"success": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tok = byte_tokenizer()
        backend = SGLangBackend(f"http://127.0.0.1:{server.server_port}", health_check=False, tokenizer=tok)
        model = build_model(ModelConfig(tiny={"hidden_size": 16, "intermediate_size": 32}), vocab_size=len(tok))
        for version in (1, 2):
            sync_weights(backend, model.state_dict(), version, tmp_path / "sync", tok, model.config)
    finally:
        server.shutdown()
    assert [c[0] for c in calls] == ["/update_weights_from_disk", "/flush_cache"] * 2
    update = calls[2][1]
    assert update["weight_version"] == "2" and update["flush_cache"] is True
    path = tmp_path / "sync" / "weights-v2"
    assert update["model_path"] == str(path)
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    assert set(load_file(str(path / "model.safetensors"))) <= set(model.state_dict())
    assert not (tmp_path / "sync" / "weights-v1").exists()  # only the served copy is kept
    assert backend.weight_version == "2"


class ParamsRecorder(ScriptedBackend):
    """Scripted backend that remembers the sampling parameters of every request."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.params: list[SamplingParams] = []

    async def agenerate(self, input_ids, params):
        self.params.append(params)
        return await super().agenerate(input_ids, params)


def test_evaluation_asks_for_no_logprobs_and_rollouts_do(tmp_path, examples):
    """Evaluation reads no logprobs, so the agent asks for none; rollouts (the loss needs the
    backend's old logprobs) ask for them on every turn. The same loop serves both."""
    cfg = from_dict(
        EvalConfig,
        {
            "method": "search_r1",
            "dataset": {"name": "demo", "limit": 3},
            "retriever": {"kind": "memory"},
            "out": str(tmp_path),
        },
    )
    evaluating = ParamsRecorder(script_for(examples))
    simple_evaluate(cfg, backend=evaluating)
    assert len(evaluating.params) == 6 and not any(p.logprobs for p in evaluating.params)
    for t in RunDir(tmp_path / "search_r1-demo-test").trajectories():
        assert all(s.logprobs is None for s in t.segments if s.role == "model")

    agent, _ = make_agent(examples)
    agent.backend = rolling = ParamsRecorder(script_for(examples))
    rolled = collect(agent, examples, 1, SamplingParams(temperature=1.0), policy_version=0, seed=0)
    assert len(rolling.params) == 6 and all(p.logprobs for p in rolling.params)
    for t in rolled.trajectories:
        assert all(len(s.logprobs or []) == len(s.token_ids) for s in t.segments if s.role == "model")
