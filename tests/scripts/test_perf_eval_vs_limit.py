"""The recording and the replay request of ``scripts/perf/eval_vs_limit.py``, without an engine
(the replay against a real SGLang is ``tests/engines/test_replay_limit.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.backends.hf_prefix import common_prefix
from harness.backends.scripted import ScriptedBackend
from harness.retrieval.memory import InMemoryRetriever
from harness.types import Doc, Example
from pipelines.methods import build_method
from scripts.perf.eval_vs_limit import (
    Call,
    RecordingBackend,
    generate_payload,
    plan_replay,
    reachable_hits,
    same_work,
)


def test_the_recording_is_each_turn_s_input_and_generated_length():
    examples = [Example(f"q{i}", f"question number {i}?", ("a",)) for i in range(4)]
    script = [
        {"match": ex.question, "turns": [f"<search> s{k} </search>" for k in range(i % 3)] + ["<answer> a </answer>"]}
        for i, ex in enumerate(examples)
    ]
    backend = RecordingBackend(ScriptedBackend(script))
    agent = build_method("search_r1", backend, InMemoryRetriever([Doc("d", "t", "x")]), {"max_concurrency": 2})
    trajs = agent.run_examples(examples)
    expected = []
    for t in trajs:  # each model turn's context is every segment before it
        for i, s in enumerate(t.segments):
            if s.role == "model":
                context = tuple(tok for seg in t.segments[:i] for tok in seg.token_ids)
                expected.append((context, len(s.token_ids)))
    got = dict((c.input_ids, c.generated) for c in backend.calls)
    assert len(backend.calls) == len(got) == sum(t.n_turns for t in trajs) == 1 + 2 + 3 + 1
    assert set(got) == {context for context, _ in expected}
    # What the engine generated: the kept turn, plus the EOS the dialect cuts after an answer.
    assert sorted(got[context] - kept for context, kept in expected) == [0, 0, 0, 1, 1, 1, 1]
    assert backend.tokenizer is backend.inner.tokenizer  # everything else is the wrapped backend's


def test_the_payload_is_one_batch_of_exact_lengths_ignoring_eos():
    body = generate_payload([[1, 2, 3], [1, 2, 3, 9]], [7, 0])
    assert body["input_ids"] == [[1, 2, 3], [1, 2, 3, 9]]
    assert [sp["max_new_tokens"] for sp in body["sampling_params"]] == [7, 0]
    assert all(sp["ignore_eos"] and sp["temperature"] == 0.0 for sp in body["sampling_params"])
    with pytest.raises(ValueError, match="no input"):
        generate_payload([], [])
    with pytest.raises(ValueError, match="no model call"):
        plan_replay([])
    calls = [Call((1, 2, 3), 7), Call((1, 2, 3, 9), 2, cached=3)]
    assert same_work(calls, calls[::-1]) and not same_work(calls, [calls[0], Call((1, 2, 3, 9), 3)])


def lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The shared helper (harness.backends.hf_prefix) on token tuples."""
    return common_prefix(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))


# Two questions of two turns each after a shared 3-token template (5 6 7): turn 2 is turn 1's
# input and output, then a retrieved document (40s / 60s).
Q1T1 = Call((5, 6, 7, 10, 11), 2, cached=0, output_ids=(20, 21))
Q1T2 = Call((5, 6, 7, 10, 11, 20, 21, 40, 41, 42), 1, cached=7, output_ids=(22,))
Q2T1 = Call((5, 6, 7, 12, 13), 2, cached=3, output_ids=(30, 31))
Q2T2 = Call((5, 6, 7, 12, 13, 30, 31, 60, 61), 3, cached=7, output_ids=(32, 33, 34))
CALLS = [Q1T1, Q2T2, Q1T2, Q2T1]  # the order of a run's completions, not of the questions


def test_reachable_hits_stop_where_no_earlier_call_could_have_cached_more():
    # A first turn can find the template (another question's); a second turn its first turn's
    # input and output, not the document. Never its own later turn, which contains all of it.
    assert reachable_hits(CALLS) == [3, 7, 7, 3]
    # The engine's own report wins if it found more (here: a duplicate question cached before).
    assert reachable_hits([Call(Q1T1.input_ids, 2, cached=5, output_ids=(20, 21)), Q2T1]) == [5, 3]
    assert lcp((1, 2, 3), (1, 2)) == 2 and lcp((), (1,)) == 0


def test_the_planned_replay_finds_exactly_the_reachable_prefix_in_a_radix_cache():
    plan = plan_replay(CALLS)
    assert plan.lengths == [2, 3, 1, 2] and plan.hits == [3, 7, 7, 3]
    for ids, call, h in zip(plan.inputs, CALLS, plan.hits, strict=True):
        assert len(ids) == len(call.input_ids)  # the same work: one token's value changed, no length
        assert ids[:h] == list(call.input_ids[:h]) and ids[h + 1 :] == list(call.input_ids[h + 1 :])
        assert ids[h] != call.input_ids[h]
    markers = [ids[h] for ids, h in zip(plan.inputs, plan.hits, strict=True)]
    assert len(set(markers)) == len(markers)
    seen = {t for c in CALLS for t in c.input_ids + c.output_ids}
    assert set(markers) <= seen  # ids the tokenizer produced
    # A radix cache holding the warm-up prefixes and every other replayed input (admitted
    # earlier, generating anything): each call's longest match is its reachable prefix.
    assert sorted(map(tuple, plan.warm)) == [(5, 6, 7), (5, 6, 7, 10, 11, 20, 21), (5, 6, 7, 12, 13, 30, 31)]
    for i, ids in enumerate(plan.inputs):
        others = [tuple(w) for w in plan.warm] + [tuple(o) + (99,) * 5 for j, o in enumerate(plan.inputs) if j != i]
        assert max(lcp(tuple(ids), o) for o in others) == plan.hits[i]
    # Without the marker the first turns would find their whole input in their second turns' warm-up.
    assert lcp(Q1T1.input_ids, tuple(plan.warm[1])) == len(Q1T1.input_ids)
