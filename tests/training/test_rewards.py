"""Rewards against hand-worked cases: a fake validator pins each term, the real dialects check wiring."""

from __future__ import annotations

import re

import pytest

from harness.types import Doc, SearchRecord, Segment, Trajectory
from pipelines.dialects.r1_searcher import r1_searcher_solution, r1_searcher_validate
from training.rewards import (
    EM,
    REWARDS,
    R1SearcherStage1,
    R1SearcherStage2,
    ResearchF1Format,
    SearchR1Format,
    build_reward,
    compose,
    retrieval_hit,
)


class FakeDialect:
    """Format is valid iff the text ends with 'END'; the answer is what follows the last 'A:'."""

    def validate_format(self, text: str) -> tuple[bool, str]:
        return (text.endswith("END"), "ok" if text.endswith("END") else "no END")

    def extract_answer(self, text: str) -> str | None:
        if "A:" not in text:
            return None
        return text.rsplit("A:", 1)[1].replace("END", "").strip() or None


FAKE = FakeDialect()


def traj(response, prediction="", answers=("Paris",), finish="answer", dialect="search_r1", searches=(), segs=()):
    return Trajectory(
        example_id="q",
        question="q",
        answers=list(answers),
        method="m",
        response_text=response,
        prediction=prediction,
        finish_reason=finish,
        metadata={"dialect": dialect},
        searches=list(searches),
        segments=list(segs),
    )


HIT = SearchRecord(0, "q", ["1"], [1.0], 0.1, docs=[Doc("1", "P", "Paris is big")])
MISS = SearchRecord(0, "q", ["2"], [1.0], 0.1, docs=[Doc("2", "L", "Lyon is big")])


def test_registry_has_every_reward():
    # Other test modules may register extra rewards; the shipped ones must all be there.
    shipped = {"em", "research_f1_format", "r1_searcher_stage1", "r1_searcher_stage2", "search_r1_format"}
    assert shipped <= set(REWARDS.names())


def test_em_scores_the_response_answer_not_the_prediction_field():
    em = EM(validator=FAKE)
    assert em(traj("A: the Paris END"))[0] == 1.0  # "the" is dropped by SQuAD normalisation
    assert em(traj("A: Lyon END", prediction="Paris"))[0] == 0.0  # the response's answer wins
    assert em(traj("no answer at all"))[0] == 0.0
    assert em(traj("", prediction="Paris"))[0] == 1.0  # no response text (baselines): the prediction


def test_em_answer_from_prompt_response_is_search_r1_qa_em():
    """Search-R1's / RAG-R1's qa_em.extract_solution on prompt + response: the last of at least
    two <answer> blocks. The prompt holds two (the instruction's tags and the example Beijing)."""

    prompt = Segment("prompt", [1], "Answer in <answer> and </answer>, e.g. <answer> Beijing </answer>. Q")
    answered = [prompt, Segment("model", [2], "<search>x</search>"), Segment("observation", [3], "<information>d")]
    answered.append(Segment("model", [4], "</information><answer> Paris </answer>"))
    em = build_reward({"name": "em", "answer_from": "prompt_response"})
    assert em(traj("", segs=answered))[0] == 1.0
    silent = [prompt, Segment("model", [2], "I do not know")]
    # No answer in the response: the prompt's example is scored (Beijing), not Paris.
    assert em(traj("I do not know", answers=("Beijing",), segs=silent))[0] == 1.0
    assert build_reward("em")(traj("I do not know", answers=("Beijing",), segs=silent))[0] == 0.0
    with pytest.raises(ValueError, match="answer_from"):
        build_reward({"name": "em", "answer_from": "prompt"})


def test_research_f1_format_table():
    r = ResearchF1Format(validator=FAKE)
    # "Paris city" vs "Paris": precision 1/2, recall 1/1 -> F1 = 2 * .5 * 1 / 1.5 = 2/3.
    assert r(traj("A: Paris city END"))[0] == pytest.approx(2 / 3)
    assert r(traj("A: Lyon END"))[0] == 0.1  # valid format, F1 0 -> the floor
    assert r(traj("A: Paris"))[0] == 0.0  # invalid format
    assert r(traj("A: Paris END", finish="max_tokens"))[0] == 0.0  # cut off before EOS
    assert ResearchF1Format(floor=0.25, validator=FAKE)(traj("A: Lyon END"))[0] == 0.25


def test_r1_searcher_stage1_table():
    # reward_server_llama_stage1.py: ±1 cover-EM, +.5 retrieval, +.5 format.
    r = R1SearcherStage1(validator=FAKE)
    assert r(traj("A: the Paris city END", searches=[MISS]))[0] == 2.0  # covers "Paris"
    assert r(traj("A: x END", searches=[MISS]))[0] == 0.0  # -1 + .5 + .5
    assert r(traj("A: x END"))[0] == -0.5  # format only
    assert r(traj("A: x", searches=[MISS]))[0] == -0.5  # retrieval only
    assert r(traj("junk"))[0] == -1.0  # no answer: -1
    assert R1SearcherStage1(answer_term=0.0, validator=FAKE)(traj("A: x END", searches=[MISS]))[0] == 1.0


def test_r1_searcher_stage2_table():
    r = R1SearcherStage2(validator=FAKE)  # the Qwen server's −2 by default
    assert r(traj("A: Paris city END"))[0] == pytest.approx(2 / 3)
    assert r(traj("A: Lyon END"))[0] == 0.0
    assert r(traj("A: Paris"))[0] == -1.0  # right answer, bad format: F1 − 2
    assert R1SearcherStage2(server="llama", validator=FAKE)(traj("A: Paris"))[0] == 0.0  # F1 − 1
    assert R1SearcherStage2(format_penalty=-1.0, validator=FAKE)(traj("junk"))[0] == -1.0
    with pytest.raises(ValueError, match="server"):
        R1SearcherStage2(server="mistral")


def test_r1_searcher_stage2_validator_follows_the_server():
    docs = "<|begin_of_query|>q<|end_of_query|>\n\n<|begin_of_documents|>\n(1)D\n<|end_of_documents|>\n\n"
    # The Llama server has no "Assistant" check and no 10-word limit; the Qwen server has both.
    long = docs + "Assistant says.</think>\n\n<answer>Paris " + "and more words " * 4 + "</answer>"
    llama, qwen = R1SearcherStage2(server="llama"), R1SearcherStage2(server="qwen")
    f1 = llama(traj(long, dialect="r1_searcher"))[1]["f1"]
    assert 0 < f1 < 1
    assert llama(traj(long, dialect="r1_searcher"))[0] == pytest.approx(f1)  # valid for Llama
    assert qwen(traj(long, dialect="r1_searcher"))[0] == pytest.approx(f1 - 2)  # invalid for Qwen
    bad = docs + "<think>again</think>\n\n<answer>Paris</answer>"
    assert llama(traj(bad, dialect="r1_searcher"))[0] == pytest.approx(0.0)  # 1 − 1


def test_search_r1_format_every_branch():
    r = SearchR1Format(validator=FAKE)  # v0.3: structure .2, final format .1, retrieval 0
    assert r(traj("A: Paris END"))[0] == 1.0  # EM, valid
    assert r(traj("A: Paris"))[0] == pytest.approx(0.8)  # EM, invalid: 1 - .2
    assert r(traj("A: Lyon END"))[0] == pytest.approx(0.2)  # wrong, valid
    assert r(traj("A: Lyon"))[0] == pytest.approx(0.1)  # wrong, invalid, parseable
    assert r(traj("END"))[0] == pytest.approx(0.2)  # no answer, valid
    assert r(traj("junk"))[0] == 0.0  # no answer, invalid
    with_ret = SearchR1Format(retrieval_score=0.1, validator=FAKE)
    assert with_ret(traj("A: Lyon END", searches=[HIT]))[0] == pytest.approx(0.3)  # .2 + .1
    assert with_ret(traj("A: Lyon END", searches=[MISS]))[0] == pytest.approx(0.2)
    assert with_ret(traj("A: Lyon", searches=[HIT]))[0] == pytest.approx(0.1)  # retrieval only counts if valid


def test_retrieval_hit_reads_observation_segments():
    obs = Segment("observation", [1, 2], "<information>Doc 1(Title: X) paris, France</information>")
    assert retrieval_hit(traj("", segs=[obs]))
    assert not retrieval_hit(traj("", segs=[obs], answers=("Lyon",)))


def test_compose_and_build_from_config():
    r = compose(("em", 2.0, EM(validator=FAKE)), ("s1", 0.5, R1SearcherStage1(validator=FAKE)))
    total, parts = r(traj("A: Paris END", searches=[HIT]))
    assert total == pytest.approx(2.0 * 1.0 + 0.5 * 2.0)  # s1: +1 cover-EM, +.5, +.5
    assert parts["em"] == 1.0 and parts["s1/searched"] == 1.0
    built = build_reward([{"name": "r1_searcher_stage2", "weight": 0.5}, "em"])
    # R1-Searcher's own check (reward_server_qwen_zero.py) wants the think block closed once and
    # the documents numbered "(1)...": the fixture before this change had neither.
    good = (
        "I look it up. <|begin_of_query|>q<|end_of_query|>\n\n<|begin_of_documents|>\n(1)D\n<|end_of_documents|>\n\n"
        "So.</think>\n\n<answer>Paris</answer>"
    )
    total, _ = built(traj(good, dialect="r1_searcher"))
    assert total == pytest.approx(0.5 * 1.0 + 1.0)
    assert build_reward({"name": "research_f1_format", "floor": 0.3}).floor == 0.3


# ---- the real dialects (pipelines.dialects) ---------------------------------------------------
GOOD = (
    "<think>x</think><search>q</search>\n\n<information>\nDoc 1(Title: P) Paris is big\n</information>\n\n"
    "<answer>Paris</answer>"
)


def test_real_dialects():
    assert build_reward("em")(traj(GOOD))[0] == 1.0
    assert build_reward("search_r1_format")(traj(GOOD + " extra"))[0] == pytest.approx(0.8)
    r = build_reward("research_f1_format")
    ok = "<think>a</think><answer>\\boxed{Paris city}</answer>"
    assert r(traj(ok, dialect="research"))[0] == pytest.approx(2 / 3)
    assert r(traj("<answer>Paris</answer>", dialect="research"))[0] == 0.0  # no \boxed{}: invalid
    s1 = build_reward("r1_searcher_stage1")
    assert s1(traj("no tags", dialect="r1_searcher"))[0] == -1.0  # no answer tags: the −1 term only


def test_r1_searcher_stage1_uses_its_own_checks():
    s1 = build_reward("r1_searcher_stage1")
    good = (
        " Look. <|begin_of_query|>q<|end_of_query|>\n\n<|begin_of_documents|>\n(1)D\n<|end_of_documents|>\n\n"
        "So.</think>\n\n<answer>a long answer that is more than ten words is fine in stage one</answer>"
    )
    # Not covering "Paris": −1, +.5 retrieval, +.5 format (stage 2 would reject the length).
    assert s1(traj(good, dialect="r1_searcher"))[0] == 0.0
    no_docs = " So.</think>\n\n<answer>Paris</answer>"
    assert s1(traj(no_docs, dialect="r1_searcher", searches=[MISS]))[0] == 1.5  # +1 cover-EM, format only
    broken = good.replace("(1)D", "D")  # documents not numbered as the original inserts them
    assert s1(traj(broken, dialect="r1_searcher"))[0] == -0.5


def test_prorag_reward_by_hand_with_its_dialect():
    from training.rewards import prorag_f1

    r = build_reward("prorag")
    # The prompt opens the first <step>; a valid response: step answer (S F), or (S Q R S A)* S F.
    valid = "I know.</step>\n<answer>Paris city</answer>"
    # F1("Paris city", "Paris") = 2·(1/2·1)/(1/2+1) = 2/3 ≥ 0.2 → 2·2/3 = 4/3; format +1.
    assert r(traj(valid, dialect="prorag"))[0] == pytest.approx(4 / 3 + 1)
    # F1 below the 0.2 gate counts 0: "a b c d e f Paris" vs "Paris": P 1/7, R 1 → F1 0.25 (kept);
    # with 9 other tokens P = 1/10 → F1 = 2·0.1/1.1 = 0.1818 < 0.2 → 0, format +1 → 1.
    many = "I know.</step>\n<answer>a b c d e f g h i Paris</answer>"
    assert r(traj(many, dialect="prorag"))[0] == pytest.approx(1.0)
    assert prorag_f1("a b c d e f Paris", "Paris") == pytest.approx(0.25)
    # Broken order (subquery without retrieval) → format −1; the answer still scores.
    broken = "x</step>\n<subquery>q</subquery>\n<step>y</step>\n<answer>Paris</answer>"
    assert r(traj(broken, dialect="prorag"))[0] == pytest.approx(2.0 - 1.0)
    # No answer at all: 0 − 1.
    assert r(traj("thinking</step>", dialect="prorag"))[0] == pytest.approx(-1.0)
    # ProRAG's F1 does not strip punctuation (SQuAD's would): "Paris." vs "Paris" → 0, gated.
    assert prorag_f1("Paris.", "Paris") == 0.0


# ---- a response that writes the next dialogue turn itself ---------------------------------------
# ReSearch's compute_score (src/verl/utils/reward_score/re_search.py:149-179 at 3b2fd14) splits the
# decoded prompt + response on "<|im_start|>assistant\n" (else "Assistant:"), validates piece [1]
# and then requires it to end with the EOS token; R1-Searcher's reward servers
# (train/reward_server_qwen_zero.py:150-173, reward_server_llama_stage2.py:149-172 at 631167c)
# append one EOS and score the text after the LAST marker.
RESEARCH_CHAT_PROMPT = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
RESEARCH_BASE_PROMPT = "A conversation between User and Assistant. ... User: Q. Assistant:"


def research_traj(prompt, *model_and_obs, finish="answer"):
    segs = [Segment("prompt", [0], prompt)]
    segs += [Segment("observation" if i % 2 else "model", [i + 1], t) for i, t in enumerate(model_and_obs)]
    return traj("".join(model_and_obs), dialect="research", segs=segs, finish=finish)


def test_research_reward_validates_up_to_a_written_next_turn_and_then_misses_the_eos():
    r = build_reward("research_f1_format")
    answered = "<think>a</think><answer>\\boxed{Paris}</answer>"
    assert r(research_traj(RESEARCH_CHAT_PROMPT, answered))[0] == 1.0
    assert r(research_traj(RESEARCH_BASE_PROMPT, " " + answered))[0] == 1.0
    # The whole response is well formed (paired thinks, one answer), but the original's piece
    # ends at the written "<|im_start|>assistant\n": valid, yet it cannot end with the EOS -> 0.
    chat = answered + "\n<|im_start|>assistant\n<think>b</think>"
    assert research_traj(RESEARCH_CHAT_PROMPT, chat).response_text == chat
    assert r(research_traj(RESEARCH_CHAT_PROMPT, chat)) == (0.0, {"f1": 1.0, "format_valid": 0.0})
    base = " " + answered + "\nUser: thanks. Assistant: you are welcome"
    assert r(research_traj(RESEARCH_BASE_PROMPT, base))[0] == 0.0
    # A base prompt's marker inside a retrieved document cuts the piece as well.
    search, obs = " <think>a</think><search>q</search>", " <result>\nAssistant: a title\n</result>"
    assert r(research_traj(RESEARCH_BASE_PROMPT, search, obs, answered))[0] == 0.0
    assert r(research_traj(RESEARCH_BASE_PROMPT, search, obs.replace("Assistant:", "A"), answered))[0] == 1.0
    # The chat marker is looked for first: a chat prompt's response may say "Assistant:" freely.
    assert r(research_traj(RESEARCH_CHAT_PROMPT, "<think>Assistant: me</think>" + answered[16:]))[0] == 1.0


def test_r1_searcher_qwen_server_scores_the_text_after_a_written_next_turn():
    qwen = R1SearcherStage2(server="qwen")
    # The model writes "\nAssistant: <think>" and answers again: the server's solution is the text
    # after that last marker (+ EOS): " Actually.</think>\n\n<answer>Paris</answer><|endoftext|>",
    # which passes every check (no "Assistant" left in it): F1 1, no penalty.
    written = "So.</think>\n\n<answer>Lyon</answer>\nAssistant: <think> Actually.</think>\n\n<answer>Paris</answer>"
    assert qwen(traj(written, dialect="r1_searcher")) == (1.0, {"f1": 1.0, "format_valid": 1.0})
    assert r1_searcher_solution(written, "qwen") == "Actually.</think>\n\n<answer>Paris</answer><|endoftext|>"
    # The dialect's own check (evaluation's format) reads the same text.
    assert r1_searcher_validate(None, written)[0]


def test_r1_searcher_servers_read_an_unclosed_last_answer_to_the_eos_text():
    """strip_sequence(query) + eos_token: the last <answer> has no </answer> after it, so the
    prediction runs to the EOS text. Qwen: "Paris<|endoftext|>" normalises to "paris endoftext":
    F1 2·(1/2·1)/(1/2 + 1) = 2/3, and two <answer> tags fail the format: 2/3 − 2.  Llama:
    "Paris<|eot_id|>" -> "paris eot id" (underscores become spaces): F1 2·(1/3)/(4/3) = .5, − 1."""
    text = "So.</think>\n\n<answer>Lyon</answer> or <answer>Paris"
    assert R1SearcherStage2(server="qwen")(traj(text, dialect="r1_searcher"))[0] == pytest.approx(2 / 3 - 2)
    llama = R1SearcherStage2(server="llama")(traj(text + "<|eot_id|>", dialect="r1_searcher"))
    assert llama[0] == pytest.approx(0.5 - 1) and llama[1]["f1"] == pytest.approx(0.5)
    # EOS runs at the end are stripped before the one EOS is appended.
    assert r1_searcher_solution("a<|eot_id|><|eot_id|>", "llama") == "a<|eot_id|>"
    # Stage 1 (the Llama stage-1 server, cover-EM): "paris eot id" still covers "Paris".
    s1 = build_reward("r1_searcher_stage1")
    assert s1(traj(text, dialect="r1_searcher"))[1]["cover_em"] == 1.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "em", True: 1}, "unknown config key true in 'algo.reward.em'"),  # `on: 1` in YAML
        ({"name": "research_f1_format", "flor": 0.1}, "did you mean 'algo.reward.research_f1_format.floor'"),
        ({"name": "research_f1_format", "floor": "x"}, "algo.reward.research_f1_format.floor: expected a number"),
        ([{"name": "em"}, {"name": "em", "params": {}}], "unknown config key 'algo.reward.em.params'"),
        ({"floor": 0.1}, "a reward given as a mapping needs its name"),
    ],
)
def test_a_reward_option_that_does_not_fit_is_named(spec, message):
    """Issue 44: a reward's options went to its class as keywords: a non-string key or an unknown
    option was a TypeError traceback from the trainer's build."""
    from harness.config import ConfigError
    from training.rewards import build_reward

    with pytest.raises(ConfigError, match=re.escape(message)):
        build_reward(spec)
    assert build_reward({"name": "research_f1_format", "floor": 0.2}).floor == 0.2


def test_the_llama_servers_checks_apply_to_the_exact_protocol_not_the_small_wording():
    """R1-Searcher's Llama stage-2 server refuses a response with <think> (its prompt opens it).
    Our small-model wording has the model write <think> itself: its well-formed answer keeps the
    dialect's own check (the demo's stage 2 gave every such answer the -1 penalty, and the
    preflight refused the recipe)."""
    small = "<think> So the answer is Paris. </think>\n<answer> Paris </answer>"
    llama = R1SearcherStage2(server="llama")
    assert llama(traj(small, dialect="r1_searcher_small")) == (1.0, {"f1": 1.0, "format_valid": 1.0})
    assert llama(traj(small, dialect="r1_searcher"))[1]["format_valid"] == 0.0  # the exact protocol: no <think>
