"""Metrics: hand-computed cases, R1-Searcher cover-EM, and parity with FlashRAG's evaluator."""

from __future__ import annotations

import pytest

from benchmarks.metrics import (
    METRICS,
    acc,
    cover_em,
    exact_match,
    f1_score,
    normalize_answer,
    normalize_cover,
    score_prediction,
)


def test_normalize_answer():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("Ünïcödé São Paulo") == "ünïcödé são paulo"


@pytest.mark.parametrize(
    "pred, golds, em, f1, ac",
    [
        ("Paris", ["paris"], 1.0, 1.0, 1.0),
        ("the city of Paris", ["Paris"], 0.0, 2 * (1 / 3) * 1 / (1 / 3 + 1), 1.0),  # tokens: city, of, paris
        ("yes", ["no"], 0.0, 0.0, 0.0),
        ("yes it is", ["yes"], 0.0, 0.0, 1.0),  # yes/no rule: prediction normalises to 'yes it is' != 'yes'
        ("", ["Paris"], 0.0, 0.0, 0.0),
        ("New York City", ["NYC", "New York"], 0.0, 0.8, 1.0),  # P=2/3 R=1 -> F1=0.8 against 'new york'
    ],
)
def test_em_f1_acc_by_hand(pred, golds, em, f1, ac):
    assert exact_match(pred, golds) == em
    assert f1_score(pred, golds) == pytest.approx(f1)
    assert acc(pred, golds) == ac


@pytest.mark.parametrize(
    "pred, golds, expected",
    [
        ("Paris, France", ["France"], 1.0),
        ("France Paris", ["Paris France"], 1.0),  # order-free
        ("Paris", ["Paris France"], 0.0),  # every gold token is needed
        ("True", ["yes"], 1.0),
        ("False", ["no"], 1.0),
        ("o_neill", ["O'Neill"], 1.0),  # "_" and "'" both become spaces: "o neill"
        ("Bob`s café", ["bob s café"], 1.0),
        ("the answer is James Madison", ["james madison", "madison"], 1.0),
        ("", ["x"], 0.0),
    ],
)
def test_cover_em(pred, golds, expected):
    assert cover_em(pred, golds) == expected


def test_normalize_cover_characters():
    assert normalize_cover("‘Quoted’ ´x´ `y` The_End") == "quoted x y end"


def test_registry_and_score_prediction():
    assert {"em", "f1", "acc", "cover_em"} <= set(METRICS.names())
    assert score_prediction("Paris", ["paris"]) == {"em": 1.0, "f1": 1.0, "acc": 1.0, "cover_em": 1.0}
    assert score_prediction(None, ["x"], ["em"]) == {"em": 0.0}


PREDS = [
    ("Paris", ["Paris"]),
    ("paris.", ["Paris", "City of Light"]),
    ("The Paris", ["paris"]),
    ("yes", ["yes"]),
    ("yes", ["no"]),
    ("no", ["No."]),
    ("noanswer", ["noanswer"]),
    ("I think yes", ["yes"]),
    ("James Madison", ["james madison"]),
    ("Madison", ["James Madison"]),
    ("It was James Madison in 1812", ["james madison"]),
    ("", ["something"]),
    ("São Paulo", ["Sao Paulo", "São Paulo"]),
    ("the the the", ["the"]),
    ("Chief of Protocol", ["Chief of Protocol"]),
    ("chief protocol officer", ["Chief of Protocol"]),
    ("1,234", ["1234"]),
    ("Titan IIIE rocket", ["Titan IIIE"]),
    ("Animorphs series", ["Animorphs"]),
    ("a b c d", ["c d e f", "a"]),
]


def test_identical_to_flashrag_evaluator():
    from flashrag.evaluator.metrics import ExactMatch, F1_Score, Sub_ExactMatch

    config = {"dataset_name": "demo"}
    fem, ff1, facc = ExactMatch(config), F1_Score(config), Sub_ExactMatch(config)
    for pred, golds in PREDS:
        assert exact_match(pred, golds) == fem.calculate_em(pred, golds), (pred, golds)
        assert f1_score(pred, golds) == pytest.approx(ff1.token_level_scores(pred, golds)["f1"]), (pred, golds)
        assert acc(pred, golds) == facc.calculate_sub_em(pred, golds), (pred, golds)


def test_f1_squad_has_no_yes_no_rule():
    """SQuAD v1.1's F1 (HARR's reward): "yes it is" against "yes": 1 common token, precision 1/3,
    recall 1 -> 2·(1/3)/(4/3) = .5; HotpotQA's rule (f1) gives 0 when a yes/no gold differs."""
    from benchmarks.metrics import METRICS

    assert METRICS.get("f1_squad")("yes it is", ["yes"]) == pytest.approx(0.5)
    assert METRICS.get("f1")("yes it is", ["yes"]) == 0.0
    assert METRICS.get("f1_squad")("The Paris", ["paris", "lyon"]) == 1.0
