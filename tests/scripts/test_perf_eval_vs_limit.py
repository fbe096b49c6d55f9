"""The recording and the replay request of ``scripts/perf/eval_vs_limit.py``, without an engine
(the replay against a real SGLang is ``tests/engines/test_replay_limit.py``)."""

from __future__ import annotations

import pytest

from harness.backends.scripted import ScriptedBackend
from harness.retrieval.memory import InMemoryRetriever
from harness.types import Doc, Example
from pipelines.methods import build_method
from scripts.perf.eval_vs_limit import Call, RecordingBackend, replay_payload, same_work


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


def test_the_replay_is_one_batch_of_recorded_lengths_ignoring_eos():
    calls = [Call((1, 2, 3), 7), Call((1, 2, 3, 9), 2, cached=3)]
    body = replay_payload(calls)
    assert body["input_ids"] == [[1, 2, 3], [1, 2, 3, 9]]
    assert [sp["max_new_tokens"] for sp in body["sampling_params"]] == [7, 2]
    assert all(sp["ignore_eos"] and sp["temperature"] == 0.0 for sp in body["sampling_params"])
    assert [sp["max_new_tokens"] for sp in replay_payload(calls, warm_up=True)["sampling_params"]] == [1, 1]
    with pytest.raises(ValueError, match="no model call"):
        replay_payload([])
    assert same_work(calls, calls[::-1]) and not same_work(calls, [calls[0], Call((1, 2, 3, 9), 3)])
