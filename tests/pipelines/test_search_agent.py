"""The agent loop end to end on the scripted backend: every dialect, every finish reason,
token exactness and masks, concurrency, and its FlashRAG pipeline form."""

from __future__ import annotations

import asyncio
import os
import time
from typing import get_args

import pytest

from harness.backends.scripted import ScriptedBackend
from harness.types import FINISH_REASONS, Example, FinishReason
from pipelines.search_agent import AgentConfig, SearchAgent

Q = Example("q1", "Which river flows through the birthplace of the inventor of the glass harp-clock?", ("Lunne",))


class RecordingBackend(ScriptedBackend):
    """Scripted backend that remembers every context it was fed."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.inputs: list[list[int]] = []

    async def agenerate(self, input_ids, params):
        self.inputs.append(list(input_ids))
        return await super().agenerate(input_ids, params)


SCRIPTS = {
    "research": [
        "<think>Who invented it?</think><search>glass harp-clock inventor</search>",
        "<think>Where was Mira born?</think><search>Mira Solberg born</search>",
        "<think>Eddavik river</think><search>Eddavik river</search>",
        "<think>So the river is Lunne.</think><answer>The answer is \\boxed{Lunne}</answer>",
    ],
    "search_r1": [
        "<think>a</think><search>glass harp-clock inventor</search>",
        "<think>b</think><search>Eddavik river</search>",
        "<think>c</think><answer> Lunne </answer>",
    ],
    "r1_searcher": [
        "First find the inventor. <|begin_of_query|>glass harp-clock inventor<|end_of_query|>",
        "Then the river. <|begin_of_query|>Eddavik river<|end_of_query|>",
        "<answer>Lunne</answer>",
    ],
    "prorag": [
        "I need the inventor first.</step>\n<subquery>Who invented the glass harp-clock?</subquery>",
        "The retrieval names Mira Solberg.</step>\n<subanswer>Mira Solberg</subanswer>",
        "Now her birthplace's river.</step>\n<subquery>Eddavik river</subquery>",
        "Found it.</step>\n<subanswer>Lunne</subanswer>",
        "Combine.</step>\n<answer>Lunne</answer>",
    ],
    "rag_r1": [
        "<think>two at once</think><search>glass harp-clock inventor, Mira Solberg birthplace</search>",
        "<think>river</think><search>Eddavik river</search>",
        "<answer>Lunne</answer>",
    ],
}


def run_one(backend, retriever, dialect, example=Q, **cfg):
    # Byte-level tokens: observations are long, so the default total budget is raised.
    cfg.setdefault("max_total_tokens", 8192)
    agent = SearchAgent(backend, retriever, dialect, AgentConfig(**cfg))
    return agent.run_examples([example])[0]


def assert_token_exact(traj, backend):
    """Each call's input is a prefix of the final ids, and the final ids end with the last output."""
    ids = traj.token_ids
    for fed in backend.inputs:
        assert ids[: len(fed)] == fed
    assert ids[: len(backend.inputs[-1])] + traj.segments[-1].token_ids == ids
    for seg, mask in ((s, s.loss_mask) for s in traj.segments):
        assert mask == [1 if seg.role == "model" else 0] * len(seg.token_ids)
    assert len(traj.loss_mask) == len(ids)


@pytest.mark.parametrize("dialect", sorted(SCRIPTS))
def test_every_dialect_multi_turn(dialect, toy_retriever):
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": SCRIPTS[dialect]}])
    traj = run_one(backend, toy_retriever, dialect, max_turns=len(SCRIPTS[dialect]))
    assert traj.error is None
    assert traj.finish_reason == "answer"
    assert traj.prediction == "Lunne"
    n_model = len(SCRIPTS[dialect])
    roles = [s.role for s in traj.segments]
    # Every turn but the last is followed by inserted text (ProRAG: a new <step> after a subanswer).
    assert roles == ["prompt"] + ["model", "observation"] * (n_model - 1) + ["model"]
    assert traj.n_turns == n_model
    assert_token_exact(traj, backend)
    # Observations are the dialect's own tags around the retrieved documents.
    obs = [s.text for s in traj.segments if s.role == "observation"]
    assert all(SearchAgent(backend, None, dialect).dialect.obs_open in o for o in obs[::2] if dialect == "prorag")
    assert all(SearchAgent(backend, None, dialect).dialect.obs_open in o for o in obs if dialect != "prorag")
    assert traj.generated_tokens == sum(len(s.token_ids) for s in traj.segments if s.role == "model")
    assert traj.observation_tokens == sum(len(s.token_ids) for s in traj.segments if s.role == "observation")


def test_parallel_queries_make_one_search_record_each(toy_retriever):
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": SCRIPTS["rag_r1"]}])
    traj = run_one(backend, toy_retriever, "rag_r1")
    assert [(s.turn, s.query) for s in traj.searches] == [
        (0, "glass harp-clock inventor"),
        (0, "Mira Solberg birthplace"),
        (1, "Eddavik river"),
    ]
    assert traj.searches[0].doc_ids[0] == "d1"
    assert all(len(s.doc_ids) == 3 for s in traj.searches)


def test_invalid_action_gets_a_corrective_observation_with_mask_0(toy_retriever):
    # Search-R1: a turn that stops on </search> without a <search> block is invalid; its own
    # corrective message follows (generation.py execute_predictions).
    turns = ["<think>oops</think> glass harp-clock </search>", "<answer>Lunne</answer>"]
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(backend, toy_retriever, "search_r1")
    assert traj.finish_reason == "answer"
    obs = [s for s in traj.segments if s.role == "observation"]
    assert len(obs) == 1 and obs[0].text.startswith("\nMy previous action is invalid.")
    assert obs[0].text.endswith("Let me try again.\n")
    assert traj.searches == []
    assert_token_exact(traj, backend)
    # Our small variant says why.
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": ["<search>  </search>", "<answer>x</answer>"]}])
    traj = run_one(backend, toy_retriever, "search_r1", variant="small")
    obs = [s for s in traj.segments if s.role == "observation"]
    assert "not valid" in obs[0].text and "empty" in obs[0].text


def test_systems_that_end_on_an_invalid_action(toy_retriever):
    # R1-Searcher: an empty query ends the item (query_inst_error); ReSearch: EOS without an answer.
    turns = ["<|begin_of_query|><|end_of_query|>"]
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(backend, toy_retriever, "r1_searcher")
    assert traj.finish_reason == "eos_without_answer" and traj.n_turns == 1
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": ["<think>no idea</think>"]}])
    traj = run_one(backend, toy_retriever, "research")
    assert traj.finish_reason == "eos_without_answer" and traj.prediction == ""


def test_research_stops_only_on_search_and_ends_on_eos(toy_retriever):
    # ReSearch's answer turn is not stopped at </answer>: it runs to EOS (trailing text included).
    turns = [
        "<think>a</think><search>glass harp-clock</search>",
        "<think>b</think><answer>\\boxed{Lunne}</answer> done",
    ]
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(backend, toy_retriever, "research")
    assert traj.finish_reason == "answer" and traj.prediction == "Lunne"
    assert traj.segments[-1].text.startswith("<think>b</think><answer>\\boxed{Lunne}</answer> done")
    assert traj.segments[-1].token_ids[-1] == backend.tokenizer.eos_token_id
    obs = traj.segments[2].text
    assert obs.startswith(" <result>\n") and obs.endswith("\n</result>")


def test_empty_research_query_is_answered_without_retrieval(toy_retriever):
    turns = ["<think>a</think><search> </search>", "<think>b</think><answer>\\boxed{x}</answer>"]
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(backend, toy_retriever, "research")
    assert traj.segments[2].text == " <result>\nnothing to search\n</result>" and traj.searches == []


def test_prorag_continues_after_eos_with_a_new_step(toy_retriever):
    turns = ["I think.</step>", "</step>\n<answer>Lunne</answer>"]
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(backend, toy_retriever, "prorag")
    assert traj.finish_reason == "answer" and traj.prediction == "Lunne"
    assert traj.segments[2].role == "observation" and traj.segments[2].text == "\n<step>\n"


def test_eos_without_answer(toy_retriever):
    # ReSearch ends the item on EOS (Search-R1 sends its corrective message: test_protocol_edges.py).
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": ["I do not know."]}])
    traj = run_one(backend, toy_retriever, "research")
    assert traj.finish_reason == "eos_without_answer"
    assert traj.prediction == ""
    assert traj.segments[-1].token_ids[-1] == backend.tokenizer.eos_token_id


def test_max_turns_then_one_final_no_search_turn(toy_retriever):
    # The model keeps searching; after 2 search turns it gets one final turn in which a search
    # tag is not a stop, so the text runs on to EOS and the item ends with max_turns.
    turns = ["<search>a</search>", "<search>b</search>", "<search>c</search> still searching"]
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(backend, toy_retriever, "search_r1", max_turns=2, variant="small")
    assert traj.finish_reason == "max_turns"
    assert len(traj.searches) == 2
    assert traj.n_turns == 3
    assert traj.segments[-1].text.startswith("<search>c</search> still")
    # Search-R1's own final turn still stops at </search> (its responses are cut there) and ends.
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(backend, toy_retriever, "search_r1", max_turns=2)
    assert traj.finish_reason == "max_turns" and traj.segments[-1].text == "<search>c</search>"


def test_final_turn_can_still_answer(toy_retriever):
    turns = ["<search>a</search>", "<answer>Lunne</answer>"]
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(backend, toy_retriever, "search_r1", max_turns=1)
    assert traj.finish_reason == "answer" and traj.prediction == "Lunne"


def test_max_tokens_per_turn_and_total(toy_retriever):
    long = "<think>" + "x" * 200 + "</think><answer>Lunne</answer>"
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": [long]}])
    traj = run_one(backend, toy_retriever, "research", max_new_tokens=50)  # a cut ends a ReSearch item
    assert traj.finish_reason == "max_tokens"
    assert traj.generated_tokens == 50
    # A total budget smaller than one turn's allowance also ends with max_tokens.
    backend2 = RecordingBackend([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    traj2 = run_one(backend2, toy_retriever, "search_r1", max_total_tokens=120)
    assert traj2.finish_reason == "max_tokens"
    assert traj2.generated_tokens + traj2.observation_tokens <= 120 + 400  # last observation may overshoot
    assert traj2.generated_tokens <= 120


def test_context_overflow(toy_retriever):
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    agent = SearchAgent(backend, toy_retriever, "search_r1", AgentConfig())
    n_prompt = len(agent.dialect.prompt_ids(backend.tokenizer, Q.question, chat=agent.use_chat))
    traj = run_one(backend, toy_retriever, "search_r1", max_context=n_prompt + 70, max_doc_tokens=16)
    assert traj.finish_reason == "context_overflow"
    assert len(traj.token_ids) <= n_prompt + 70


def test_doc_token_cap(toy_retriever):
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    traj = run_one(backend, toy_retriever, "search_r1", max_doc_tokens=10)
    doc = traj.searches[0].docs[0]
    assert doc.text.endswith(" ...")
    assert len(backend.tokenizer.encode(doc.text[: -len(" ...")], add_special_tokens=False)) == 10


class Boom:
    index_id = "boom"

    def search(self, queries, k):
        raise ConnectionError("retriever down")


def test_an_error_is_recorded_on_the_item_and_others_go_on(toy_retriever):
    backend = ScriptedBackend([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    agent = SearchAgent(backend, Boom(), "search_r1")
    other = Example("q2", "Say hi", ("hi",))
    trajs = agent.run_examples([Q, other])
    assert trajs[0].finish_reason == "error"
    assert "ConnectionError: retriever down" in trajs[0].error
    assert trajs[1].finish_reason == "answer" and trajs[1].error is None


def test_every_finish_reason_is_known():
    """The runtime tuple and the type a trajectory's ``finish_reason`` is checked against name the
    same reasons, in the same order."""
    assert FINISH_REASONS == get_args(FinishReason)


def test_slow_item_does_not_hold_others_back(toy_retriever):
    slow = Example("slow", "SLOW question about the glass harp-clock", ("Lunne",))
    fast = [Example(f"f{i}", f"fast question {i}", ("x",)) for i in range(4)]
    backend = ScriptedBackend(
        [
            {"match": "SLOW", "turns": SCRIPTS["search_r1"], "delay": 0.3},
            {"match": "fast", "turns": ["<answer>x</answer>"]},
        ]
    )
    order: list[str] = []
    agent = SearchAgent(backend, toy_retriever, "search_r1")
    t0 = time.perf_counter()
    trajs = agent.run_examples([slow, *fast], on_done=lambda t: order.append(t.example_id))
    elapsed = time.perf_counter() - t0
    assert [t.example_id for t in trajs] == ["slow", "f0", "f1", "f2", "f3"]  # input order kept
    assert order[-1] == "slow" and set(order[:4]) == {"f0", "f1", "f2", "f3"}
    # Three slow turns of 0.3 s run while the fast items finish: not 5 items × turns in sequence.
    assert elapsed < 0.3 * 3 + 1.0


def test_skip_and_samples(toy_retriever):
    backend = ScriptedBackend([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    agent = SearchAgent(backend, toy_retriever, "search_r1")
    trajs = agent.run_examples([Q], n_samples=3, skip={("q1", 1)}, policy_version=7)
    assert [t.sample_index for t in trajs] == [0, 2]
    assert all(t.policy_version == 7 for t in trajs)


def test_trajectory_roundtrip(toy_retriever):
    from harness.types import Trajectory

    backend = ScriptedBackend([{"match": "glass harp-clock", "turns": SCRIPTS["rag_r1"]}])
    traj = run_one(backend, toy_retriever, "rag_r1")
    again = Trajectory.from_dict(traj.to_dict())
    assert again == traj


def test_flashrag_pipeline_form_fills_pred_without_side_effects(toy_retriever):
    from flashrag.pipeline import BasicPipeline

    from pipelines.flashrag_compat import safe_config, to_flashrag_dataset

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    backend = ScriptedBackend([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    config = safe_config()
    pipe = SearchAgent(backend, toy_retriever, "search_r1", flashrag_config=config)
    assert isinstance(pipe, BasicPipeline) and pipe.retriever is toy_retriever
    dataset = to_flashrag_dataset([Q, Example("q2", "Say hi", ("hi",))], config)
    out = pipe.run(dataset, do_eval=False)
    assert out.pred == ["Lunne", "unknown"]
    assert out.data[0].output["trajectory"]["finish_reason"] == "answer"
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before


def test_run_inside_a_running_event_loop_uses_the_async_api(toy_retriever):
    backend = ScriptedBackend([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    agent = SearchAgent(backend, toy_retriever, "search_r1")

    async def main():
        return await agent.arun_examples([Q])

    assert asyncio.run(main())[0].prediction == "Lunne"


def test_few_shot_and_response_prefix(toy_retriever):
    turns = [" who? </think><search>glass harp-clock inventor</search>", "<think>ok</think><answer>Lunne</answer>"]
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": turns}])
    traj = run_one(
        backend, toy_retriever, "search_r1", few_shot=True, response_prefix="<think>", chat=False, variant="small"
    )
    prompt = traj.segments[0].text
    assert "Example:" in prompt and "Eiffel Tower" in prompt and prompt.count("Question:") == 2
    assert traj.segments[1].role == "prompt" and traj.segments[1].text == "<think>"
    assert traj.response_text.startswith("<think> who? </think>")
    assert traj.loss_mask[: traj.prompt_tokens] == [0] * traj.prompt_tokens
    from pipelines.dialects import get_dialect

    assert get_dialect("search_r1_small").validate_format(traj.response_text) == (True, "ok")
    assert_token_exact(traj, backend)


def test_weight_versions_reported_by_the_backend_are_recorded(byte_tok, toy_retriever):
    class Versioned(ScriptedBackend):
        """Reports version 3 for the first turn and 4 after (a sync landing mid-trajectory)."""

        async def agenerate(self, input_ids, params):
            c = await super().agenerate(input_ids, params)
            c.weight_version = "3" if self.calls == 1 else "4"
            return c

    script = [{"match": "glass harp-clock", "turns": SCRIPTS["research"]}]
    backend = Versioned(script)
    traj = SearchAgent(backend, toy_retriever, "research", AgentConfig(max_total_tokens=100000)).run_examples([Q])[0]
    assert traj.finish_reason == "answer" and traj.metadata["weight_versions"] == ["3", "4"]
    plain = ScriptedBackend(script)  # reports no version: nothing recorded
    traj = SearchAgent(plain, toy_retriever, "research", AgentConfig(max_total_tokens=100000)).run_examples([Q])[0]
    assert "weight_versions" not in traj.metadata


def test_template_file_and_variant_from_the_agent_config(tmp_path, toy_retriever):
    tmpl = tmp_path / "trained_with.txt"
    tmpl.write_text("Q: {question}\nThink, search, answer.\n")
    backend = RecordingBackend([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    traj = run_one(backend, toy_retriever, "search_r1", template=str(tmpl), chat=False)
    assert traj.segments[0].text == f"Q: {Q.question}\nThink, search, answer.\n"
    assert traj.prediction == "Lunne" and traj.metadata["dialect"] == "search_r1"
    traj = run_one(RecordingBackend([]), toy_retriever, "research", variant="small")
    assert traj.metadata["dialect"] == "research_small"


def test_item_latency_leaves_out_the_wait_before_its_first_request_is_served(toy_retriever):
    class Queued(ScriptedBackend):
        """Waits 0.3 s 'in the queue' before serving the first request, and says so (as hf does)."""

        async def agenerate(self, input_ids, params):
            first = self.calls == 0
            if first:
                await asyncio.sleep(0.3)
            c = await super().agenerate(input_ids, params)
            if first:
                c.meta["queue_s"] = 0.3
            return c

    backend = Queued([{"match": "glass harp-clock", "turns": SCRIPTS["search_r1"]}])
    traj = SearchAgent(backend, toy_retriever, "search_r1", AgentConfig(max_total_tokens=100000)).run_examples([Q])[0]
    assert traj.metadata["queue_s"] == 0.3 and traj.wall_time_s < 0.25


def test_a_tokenizer_with_no_chat_template_is_said_and_recorded(caplog, tmp_path):
    """Issue 44: a tokenizer with no chat template switched a chat model to the base-model prompt
    silently. It is a warning now, and the run's manifest records ``chat_template``."""
    import copy
    from dataclasses import replace

    from benchmarks.build import build_eval
    from harness.eval_config import DatasetConfig, EvalConfig, RetrieverConfig
    from harness.tokenization import byte_tokenizer

    plain = copy.deepcopy(byte_tokenizer())
    plain.chat_template = None
    agent = SearchAgent(ScriptedBackend([], tokenizer=plain), None, "search_r1")
    assert not agent.use_chat and "has no chat template" in caplog.text and "agent.chat=false" in caplog.text
    caplog.clear()
    assert not SearchAgent(ScriptedBackend([], tokenizer=plain), None, "search_r1", AgentConfig(chat=False)).use_chat
    assert "chat template" not in caplog.text  # asked for: nothing to warn of
    cfg = EvalConfig(method="search_r1", dataset=DatasetConfig(name="demo", limit=1), out=str(tmp_path))
    cfg = replace(cfg, retriever=RetrieverConfig(kind="memory"))
    assert build_eval(cfg, backend=ScriptedBackend([], tokenizer=plain)).manifest.chat_template is False
    assert build_eval(cfg, backend=ScriptedBackend([])).manifest.chat_template is True
