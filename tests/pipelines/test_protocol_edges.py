"""Malformed and edge-case turns, run through THE agent loop, against what each original's own
evaluation code does with them (stray closing tags, EOS without tags, token-limit cuts, two
answers, upper-case tags, whitespace). Each case names the original's rule it checks; the
expected values were worked out by hand from that code at the commits in configs/dialects/."""

from __future__ import annotations

import pytest

from harness.backends.scripted import ScriptedBackend
from harness.types import Example
from pipelines.dialects import DIALECTS, SYSTEMS, get_dialect, resolve_dialect
from pipelines.dialects.search_r1 import qa_em_answer
from pipelines.search_agent import AgentConfig, SearchAgent

Q = Example("q1", "Which river flows through Eddavik?", ("Lunne",))


class InOrder(ScriptedBackend):
    """Emits its turns in call order (the stop/EOS/length rules are the scripted backend's), so a
    turn the dialect rewrites (R1-Searcher's strip) or cuts still advances the script."""

    def __init__(self, turns: list[str]) -> None:
        super().__init__([])
        self.turns = turns

    def _pick(self, context: str):
        return (self.turns[self.calls - 1] if self.calls <= len(self.turns) else self.default), None


def run(dialect: str, turns: list[str], retriever, **cfg):
    cfg.setdefault("max_total_tokens", 8192)
    backend = InOrder(turns)
    traj = SearchAgent(backend, retriever, dialect, AgentConfig(**cfg)).run_examples([Q])[0]
    assert traj.error is None, traj.error
    return traj, backend


def texts(traj, role):
    return [s.text for s in traj.segments if s.role == role]


# ---- Search-R1: generation.py (_postprocess_responses, postprocess_predictions, execute_predictions)
def test_search_r1_stray_closing_answer_before_a_search_does_not_end_the_item(toy_retriever):
    # No stop strings in the original: the turn runs on and is cut at its first </search>.
    traj, _ = run(
        "search_r1", ["Maybe </answer> no: <search>Eddavik river</search>", "<answer>Lunne</answer>"], toy_retriever
    )
    assert [s.query for s in traj.searches] == ["Eddavik river"]
    assert traj.finish_reason == "answer" and traj.prediction == "Lunne"


def test_search_r1_cut_at_the_first_search_even_after_an_answer(toy_retriever):
    traj, _ = run("search_r1", ["<answer> Lunne </answer> or <search>x</search> tail", "unused"], toy_retriever)
    # The cut keeps text up to </search>; the FIRST block (the answer) is the action.
    assert texts(traj, "model") == ["<answer> Lunne </answer> or <search>x</search>"]
    assert traj.finish_reason == "answer" and traj.prediction == "Lunne" and traj.searches == []


def test_search_r1_two_answers_cut_after_the_first_and_eos_dropped(toy_retriever):
    traj, backend = run("search_r1", ["<answer>Lunne</answer> <answer>Eddavik</answer>"], toy_retriever)
    model = traj.segments[-1]
    assert model.text == "<answer>Lunne</answer>" and backend.tokenizer.eos_token_id not in model.token_ids
    assert traj.prediction == "Lunne"


@pytest.mark.parametrize("dialect", ["search_r1", "rag_r1"])
def test_search_r1_and_rag_r1_drop_the_eos_of_a_turn_that_is_not_cut(dialect, toy_retriever):
    """generation.py (and RAG-R1's generation_mq.py) decode each turn with skip_special_tokens=True
    and re-encode it: a turn that ends on EOS without a cut (no </search>, no </answer>) is kept
    without its EOS, so the EOS is neither trained nor in the next turn's context."""
    d = resolve_dialect(dialect, mode="train")
    traj, backend = run(d, ["I am not sure.", "<answer>Lunne</answer>"], toy_retriever)
    eos = backend.tokenizer.eos_token_id
    first = traj.segments[1]
    assert first.role == "model" and first.text == "I am not sure." and eos not in first.token_ids
    assert first.token_ids == backend.tokenizer.encode("I am not sure.", add_special_tokens=False)
    # research keeps its EOS (its loop never re-encodes): the item ends on it
    kept, _ = run("research", ["<think>a</think><answer>\\boxed{Lunne}</answer>"], toy_retriever)
    assert kept.segments[-1].token_ids[-1] == eos


@pytest.mark.parametrize("first", ["I am not sure.", "<ANSWER>Lunne</ANSWER>", "</search"])
def test_search_r1_eos_without_a_block_gets_the_corrective_message_and_goes_on(first, toy_retriever):
    traj, _ = run("search_r1", [first, "<answer>Lunne</answer>"], toy_retriever)
    assert texts(traj, "observation") == [get_dialect("search_r1").corrective]
    assert traj.finish_reason == "answer" and traj.prediction == "Lunne"


def test_search_r1_length_cut_without_a_block_goes_on(toy_retriever):
    traj, _ = run("search_r1", ["<think>" + "x" * 80, "<answer>Lunne</answer>"], toy_retriever, max_new_tokens=40)
    assert len(traj.segments[1].token_ids) == 40
    assert texts(traj, "observation") == [get_dialect("search_r1").corrective] and traj.prediction == "Lunne"


def test_search_r1_whitespace_in_a_query_is_stripped_and_the_final_turn_runs(toy_retriever):
    turns = ["<search>  Eddavik river \n</search>", "<search>again</search>", "<search>more</search>"]
    traj, _ = run("search_r1", turns, toy_retriever, max_turns=2)
    assert [s.query for s in traj.searches] == ["Eddavik river", "again"]
    # max_turns turns, then the original's final no-search turn; its search is not run.
    assert traj.n_turns == 3 and traj.finish_reason == "max_turns" and traj.prediction == ""


def test_search_r1_qa_em_reads_prompt_plus_response_and_needs_two_answers():
    prompt = get_dialect("search_r1").raw_text("who?")
    assert qa_em_answer(prompt + "<answer> a </answer> <answer> b </answer>") == "b"
    # The prompt itself holds two matches ("<answer> and </answer>", "<answer> Beijing </answer>"):
    # without an answer of its own, a response is scored as the example.
    assert qa_em_answer(prompt + "no answer") == "Beijing"
    assert qa_em_answer("<answer> a </answer>") is None  # a prompt without the example: one is not enough


# ---- ReSearch: active_pipeline.py ReSearchPipeline.run_item ---------------------------------
def test_research_boxed_answer_then_length_cut_predicts_empty(toy_retriever):
    turns = ["<think>ok</think><answer>\\boxed{Lunne}</answer> and then it rambles on and on"]
    traj, _ = run("research", turns, toy_retriever, max_new_tokens=45)
    assert traj.finish_reason == "max_tokens" and traj.prediction == ""


def test_research_two_answers_first_block_last_boxed_and_upper_case_tags(toy_retriever):
    traj, _ = run("research", ["<answer>\\boxed{a} \\boxed{Lunne}</answer><answer>\\boxed{b}</answer>"], toy_retriever)
    assert traj.finish_reason == "answer" and traj.prediction == "Lunne"
    traj, _ = run("research", ["<ANSWER>\\boxed{Lunne}</ANSWER>"], toy_retriever)
    assert traj.finish_reason == "eos_without_answer" and traj.prediction == ""


def test_research_search_query_whitespace_and_empty_search(toy_retriever):
    traj, _ = run(
        "research",
        ["<search>\n Eddavik river </search>", "<search> </search>", "<answer>\\boxed{x}</answer>"],
        toy_retriever,
    )
    assert [s.query for s in traj.searches] == ["Eddavik river"]
    assert texts(traj, "observation")[1] == " <result>\nnothing to search\n</result>"


# ---- R1-Searcher: evaluation/eval_search_loacl.py ------------------------------------------
def test_r1_searcher_strips_the_turn_before_end_of_query_but_not_the_query(toy_retriever):
    turns = [" I need it. <|begin_of_query|> Eddavik river \n<|end_of_query|>", "</think>\n\n<answer> Lunne </answer>"]
    traj, _ = run("r1_searcher", turns, toy_retriever)
    assert texts(traj, "model")[0] == "I need it. <|begin_of_query|> Eddavik river<|end_of_query|>"
    assert [s.query for s in traj.searches] == [" Eddavik river \n"]
    # The prediction is the answering turn's pred_ans, not stripped.
    assert traj.finish_reason == "answer" and traj.prediction == " Lunne "
    assert traj.metadata["original_finish"] == "finished"
    # The re-encoded turn is exactly what the next turn was fed after.
    assert traj.segments[1].token_ids == InOrder([]).tokenizer.encode(traj.segments[1].text, add_special_tokens=False)


@pytest.mark.parametrize(
    ("turns", "cfg", "label"),
    [
        (["I am not sure."], {}, "shot_down"),  # EOS, no tags
        (["<answer>Lunne" + " x" * 40], {"max_new_tokens": 30}, "shot_down"),  # token-limit cut
        (["<|begin_of_query|>'\"...<|end_of_query|>"], {}, "query_inst_error"),  # nothing left of the query
        (
            ["<|begin_of_query|>a<|end_of_query|>", "<|begin_of_query|>b<|end_of_query|>", "<answer>Lunne</answer>"],
            {"max_turns": 2},
            "many_retrieve",
        ),  # fmt: skip
    ],
)
def test_r1_searcher_no_answer_is_i_dont_know_with_the_originals_finish(turns, cfg, label, toy_retriever):
    traj, _ = run("r1_searcher", turns, toy_retriever, **cfg)
    assert traj.prediction == "I don't know." and traj.metadata["original_finish"] == label
    if label == "many_retrieve":  # no extra final turn: the answer the model would give is never asked
        assert traj.n_turns == 2 and traj.finish_reason == "max_turns"


# ---- RAG-R1: two modes ---------------------------------------------------------------------
def test_rag_r1_eval_mode_is_eval_multiquery(toy_retriever):
    d = get_dialect("rag_r1")
    assert d.mode == "eval" and d.stops() == ("</search>",) and not d.final_turn
    assert d.raw_text(" who founded Eddavik ").endswith("Question:  who founded Eddavik \n")  # no strip, no '?'
    turns = [
        "<answer>x</answer> hmm <search> Eddavik river , </search>",  # </answer> is no stop
        "<search></search>",  # empty: an empty <information> block, no retrieval
        "<answer> Eddavik </answer> no, <answer> Lunne </answer>",  # EOS: the last answer, unstripped
    ]
    traj, _ = run("rag_r1", turns, toy_retriever)
    assert [s.query for s in traj.searches] == ["Eddavik river"]
    assert texts(traj, "observation")[1] == "\n<information>\n\n</information>\n"
    assert traj.prediction == " Lunne " and d.validate_format("anything") == (True, d.validate_format("")[1])


def test_rag_r1_eval_mode_length_cut_searches_the_last_query_of_the_sequence(toy_retriever):
    # get_query reads the whole decoded sequence: after a cut with no query of its own, the
    # prompt's example query is searched; at EOS without an answer, the prompt's example answer counts.
    traj, _ = run("rag_r1", ["<think>" + "x" * 60, "I give up."], toy_retriever, max_new_tokens=30)
    assert [s.query for s in traj.searches] == ["query_1", "query_2"]
    assert traj.finish_reason == "eos_without_answer" and traj.prediction == " Beijing "


def test_rag_r1_train_mode_is_generation_mq(toy_retriever):
    d = resolve_dialect("rag_r1", mode="train")
    assert d.final_turn and d.raw_text(" who founded Eddavik ").endswith("Question: who founded Eddavik?\n")
    traj, _ = run(
        "rag_r1", ["I am not sure.", "<answer> Lunne </answer> <search>q</search>"], toy_retriever, mode="train"
    )
    assert texts(traj, "observation") == [d.corrective]
    assert traj.prediction == "Lunne" and traj.searches == []


# ---- ProRAG: inference.py, prorag/rl/reward.py ---------------------------------------------
def test_prorag_length_cut_continues_with_a_new_step(toy_retriever):
    traj, _ = run(
        "prorag", ["I think " + "x" * 60, "</step>\n<answer>Lunne</answer>"], toy_retriever, max_new_tokens=30
    )
    assert texts(traj, "observation") == ["\n<step>\n"] and traj.prediction == "Lunne"


def test_prorag_answers_case_and_stray_tags(toy_retriever):
    # The turn loop is case-sensitive (inference.py): <ANSWER> is not an answer, a new step follows.
    turns = ["</step>\n<ANSWER>Lunne</ANSWER>", "</subquery>", "</step>\n<answer> Lunne </answer><answer>b</answer>"]
    traj, _ = run("prorag", turns, toy_retriever)
    assert texts(traj, "observation") == ["\n<step>\n", "\n<retrieval>Error in query parsing</retrieval>\n<step>\n"]
    assert traj.prediction == "Lunne"  # the first block, stripped
    # The reward's extraction (reward.py outcome_reward) ignores case.
    assert get_dialect("prorag").extract_answer("</step>\n<ANSWER> Lunne </Answer>") == "Lunne"


def test_prorag_no_answer_within_max_hop_predicts_empty(toy_retriever):
    traj, _ = run("prorag", ["</step>\n<subanswer>a</subanswer>"] * 3, toy_retriever, max_turns=3)
    assert traj.n_turns == 3 and traj.finish_reason == "max_turns" and traj.prediction == ""


# ---- all seeds -----------------------------------------------------------------------------
def test_the_final_answer_now_turn_is_off_where_the_original_has_none():
    exact = {n: DIALECTS.get(n) for n in SYSTEMS}
    assert {n for n, d in exact.items() if d.final_turn} == {"search_r1"}  # generation.py's final turn
    assert resolve_dialect("rag_r1", mode="train").final_turn  # generation_mq.py is Search-R1's loop
    for d in exact.values():  # every seed dialect's file lists its known differences (the list may be empty)
        assert isinstance(d.differences, tuple)


@pytest.mark.parametrize("name", SYSTEMS.names())
def test_each_dialect_file_lists_its_known_differences_per_mode(name):
    from pipelines.dialects import shipped_template

    listed = shipped_template(name)["differences"]
    d = get_dialect(name)
    assert set(listed) == (set(d.modes) or {"single"})
    for mode in listed:
        assert resolve_dialect(name, mode=mode if d.modes else None).differences == tuple(listed[mode])


def test_r1_searcher_train_mode_is_its_training_rollout(byte_tok, toy_retriever):
    # prompts_dataset.py: the chat template, its own system text, then "<think>".
    d = resolve_dialect("r1_searcher", mode="train")
    text = d.render("Which river?", byte_tok)
    assert text.endswith("<think>") and "You are a helpful assistant." in text and d.stops() == ("<|end_of_query|>",)
    # experience_maker.py: query stripped and squeezed; at most max_turns retrievals, then the next
    # generation is kept and the rollout ends; the reward reads the answer from the response.
    turns = [
        ' a <|begin_of_query|>  "Eddavik"\t river <|end_of_query|>',
        "<|begin_of_query|>x<|end_of_query|>",
        "<answer> Lunne </answer> done",
    ]
    traj, _ = run("r1_searcher", turns, toy_retriever, mode="train", max_turns=2)
    assert [s.query for s in traj.searches] == ["Eddavik river", "x"]
    assert traj.n_turns == 3 and traj.prediction == "Lunne"


# ---- HARR's history-aware state (generator.py): each earlier turn's sub-query and sub-answer
class StateRecorder:
    """A toy retriever that takes HARR's ``state`` and keeps each call's (query, state)."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def search(self, queries, k, state=None):
        self.calls.append((list(queries), state))
        return self.inner.search(queries, k)


def test_harr_history_parses_turn_one_when_the_response_prefix_opens_its_think(toy_retriever):
    # With response_prefix "<think>" the tag that opens turn 1's reasoning sits in a prompt
    # segment; HARR's generator writes it itself, so its sub-answer must still parse.
    rec = StateRecorder(toy_retriever)
    turns = [
        "Eddavik is a town.</think><search>Eddavik river</search>",
        "<think>It is the Lunne.</think><search>Lunne river</search>",
        "<answer>Lunne</answer>",
    ]
    traj, _ = run("search_r1", turns, rec, response_prefix="<think>", final_turn=False, max_turns=5)
    assert traj.prediction == "Lunne" and len(rec.calls) == 2
    first, second = rec.calls[0][1][0], rec.calls[1][1][0]
    assert first.turns == ()  # nothing before the first call
    assert [(s.query, s.answer) for s in second.turns] == [("Eddavik river", "Eddavik is a town.")]


# ---- document caps: per document (max_doc_tokens) and per query's list (max_query_doc_tokens)
def test_a_query_document_list_is_cut_at_its_token_cap():
    from harness.tokenization import byte_tokenizer
    from pipelines.search_agent import cap_doc_list
    from tests.pipelines.conftest import TOY_DOCS

    tok = byte_tokenizer()  # one token per byte: lengths 58, 53, 32
    docs = TOY_DOCS[:3]
    assert [len(d.text) for d in docs] == [58, 53, 32]
    # 58 fits whole, 100 - 58 = 42 bytes of the second, the third is dropped (RAG-R1's cut).
    out = cap_doc_list(tok, docs, 100)
    assert [d.id for d in out] == ["d1", "d2"] and out[0].text == docs[0].text
    assert out[1].text == docs[1].text[:42]
    assert cap_doc_list(tok, docs, 58) == [docs[0]]  # exactly full: the next one gets nothing
    assert cap_doc_list(tok, docs, 1000) == docs


def test_documents_go_in_whole_without_a_per_document_cap(toy_retriever):
    turns = ["<search>Mira Solberg glass harp-clock</search>", "<answer>Lunne</answer>"]
    whole, _ = run("search_r1", turns, toy_retriever, max_doc_tokens=None, topk=2)
    capped, _ = run("search_r1", turns, toy_retriever, max_doc_tokens=10, topk=2)
    listed, _ = run("search_r1", turns, toy_retriever, max_doc_tokens=None, max_query_doc_tokens=70, topk=2)
    full = [d.text for d in whole.searches[0].docs]
    assert full == [d.text for d in toy_retriever.search(["Mira Solberg glass harp-clock"], 2)[0]]
    assert all(d.text.endswith(" ...") for d in capped.searches[0].docs)
    got = [d.text for d in listed.searches[0].docs]
    assert got[0] == full[0] and got[1] == full[1][: 70 - len(full[0])] and sum(map(len, got)) == 70


def test_search_r1_cuts_the_whole_observation_at_max_obs_tokens(toy_retriever):
    """generation.py _process_next_obs: the observation's token ids (the '\\n\\n<information>' tag,
    the 'Doc i(Title: t)' labels and the text) cut to their first max_obs_length; the closing tag
    goes with the rest. Documents' text alone is what max_query_doc_tokens counts; this counts all."""
    turns = ["<search>Eddavik river</search>", "<answer>Lunne</answer>"]
    whole, backend = run("search_r1", turns, toy_retriever)
    (obs,) = [s for s in whole.segments if s.role == "observation"]
    assert len(obs.token_ids) > 12 and obs.text.endswith("</information>\n\n")
    cut, _ = run("search_r1", turns, toy_retriever, max_obs_tokens=12)
    (short,) = [s for s in cut.segments if s.role == "observation"]
    assert short.token_ids == obs.token_ids[:12]
    assert short.text == backend.tokenizer.decode(obs.token_ids[:12], skip_special_tokens=True)
    assert "</information>" not in short.text and cut.prediction == "Lunne"
    # a corrective message is not a search's observation: it is never cut
    corr, _ = run("search_r1", ["no block here", "<answer>Lunne</answer>"], toy_retriever, max_obs_tokens=3)
    assert texts(corr, "observation") == [get_dialect("search_r1").corrective]


def test_rag_r1_train_cuts_each_querys_whole_doc_block_at_max_query_doc_tokens():
    """generation_mq.py _passages2string -> _process_documents: each query's stripped
    'Doc i: <contents>' block, labels and titles counted, cut to its first max_obs_length token ids
    and decoded. Byte tokens: the block 'Doc 1: T\\nxxxxxxxxxx\\nDoc 2: U\\nyy' cut at 12 is
    'Doc 1: T\\nxxx' (the documents' texts alone, 10 + 2 tokens, would have fit whole)."""
    import json

    from harness.retrieval.memory import InMemoryRetriever
    from harness.types import Doc

    retriever = InMemoryRetriever([Doc("a", "T", "x" * 10), Doc("b", "U", "yy")])
    d = resolve_dialect("rag_r1", mode="train")
    turns = ["<search>T</search>", "<answer>Lunne</answer>"]
    traj, _ = run(d, turns, retriever, max_doc_tokens=None, max_query_doc_tokens=12, topk=2)
    (obs,) = texts(traj, "observation")
    payload = json.loads(obs.removeprefix("\n<information>\n").removesuffix("\n</information>\n"))
    assert payload == {"query": ["T"], "documents": ["Doc 1: T\nxxx"]}
    # RAG-R1's evaluation prints the documents whole: there the cap is on the documents' texts
    whole, _ = run(
        resolve_dialect("rag_r1", mode="eval"), turns, retriever, max_doc_tokens=None, max_query_doc_tokens=12, topk=2
    )
    assert "Doc 1: T\\nxxxxxxxxxx\\nDoc 2: U\\nyy" in texts(whole, "observation")[0]


def test_r1_searcher_train_trains_the_newlines_it_inserts_after_a_query(toy_retriever):
    """experience_maker.py:1264-1293: the loss mask runs from '<|begin_of_documents|>\\n' to
    'end_of_documents|>\\n\\n', so the '\\n\\n' inserted after '<|end_of_query|>' is trained as if the
    model wrote it (a model segment without log-probs); evaluation trains nothing."""
    turns = ["Look.<|begin_of_query|>Eddavik river<|end_of_query|>", "So.</think>\n\n<answer>Lunne</answer>"]
    traj, _ = run(resolve_dialect("r1_searcher", mode="train"), turns, toy_retriever)
    roles = [(s.role, s.text[:24]) for s in traj.segments[1:]]
    assert roles[:3] == [
        ("model", "Look.<|begin_of_query|>E"),
        ("model", "\n\n"),
        ("observation", "<|begin_of_documents|>\n("),
    ]
    assert traj.segments[2].logprobs is None and sum(traj.segments[2].loss_mask) == 2  # byte tokens
    assert traj.response_text.count("<|end_of_query|>\n\n<|begin_of_documents|>") == 1
    ev, _ = run(resolve_dialect("r1_searcher", mode="eval"), turns, toy_retriever)
    assert [s.role for s in ev.segments[1:3]] == ["model", "observation"]
    assert ev.segments[2].text.startswith("\n\n<|begin_of_documents|>")
