"""Answer metrics: plain functions of a prediction and the gold answers.

``em``, ``f1`` and ``acc`` follow FlashRAG's evaluator exactly (SQuAD normalisation; F1 is 0
when either side is yes/no/noanswer and they differ; ``acc`` is gold-substring-of-prediction),
and a test checks them against FlashRAG's own classes. ``cover_em`` is R1-Searcher's
definition (see :func:`cover_em`). Evaluation, reports and training rewards all use these;
there is no second copy.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

from harness.registry import Registry

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_SPECIAL = {"yes", "no", "noanswer"}


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop a/an/the, squeeze whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _golds(golds: str | Sequence[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    if any(g is None or isinstance(g, list | dict) for g in golds):
        raise ValueError(f"gold answers must be strings, got {list(golds)!r}")
    return [str(g) for g in golds]


def exact_match(pred: str, golds: str | Sequence[str]) -> float:
    p = normalize_answer(pred)
    return float(any(normalize_answer(g) == p for g in _golds(golds)))


def acc(pred: str, golds: str | Sequence[str]) -> float:
    """1 when a normalised gold answer is a substring of the normalised prediction."""
    p = normalize_answer(pred)
    return float(any(normalize_answer(g) in p for g in _golds(golds)))


def _token_prf(pred: str, gold: str, yes_no: bool = True) -> tuple[float, float, float]:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if yes_no and (p in _SPECIAL or g in _SPECIAL) and p != g:  # HotpotQA's rule, not SQuAD's
        return 0.0, 0.0, 0.0
    pt, gt = p.split(), g.split()
    common = Counter(pt) & Counter(gt)
    same = sum(common.values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(pt), same / len(gt)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1_score(pred: str, golds: str | Sequence[str]) -> float:
    return max((_token_prf(pred, g)[0] for g in _golds(golds)), default=0.0)


def f1_squad(pred: str, golds: str | Sequence[str]) -> float:
    """SQuAD v1.1's F1 (``evaluate.load("squad")``, HARR's reward.py ``f1_reward``): token F1, max
    over golds, without HotpotQA's yes/no/noanswer rule (``f1`` has it)."""
    return max((_token_prf(pred, g, yes_no=False)[0] for g in _golds(golds)), default=0.0)


def precision(pred: str, golds: str | Sequence[str]) -> float:
    return max((_token_prf(pred, g)[1] for g in _golds(golds)), default=0.0)


def recall(pred: str, golds: str | Sequence[str]) -> float:
    return max((_token_prf(pred, g)[2] for g in _golds(golds)), default=0.0)


_COVER_PUNCT = set(string.punctuation) | {"‘", "’", "´", "`"}


def normalize_cover(s: str) -> str:
    """R1-Searcher's normalisation for cover-EM (module docstring of :func:`cover_em`)."""
    # A boolean answer written as Python would ("True"/"False") means yes/no. R1-Searcher's
    # bool_mapping compares the raw string, so " True" (with a space) is not mapped.
    s = {"True": "yes", "False": "no"}.get(s, s)
    s = s.replace("_", " ").lower()
    s = "".join(" " if ch in _COVER_PUNCT else ch for ch in s)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def cover_em(pred: str, golds: str | Sequence[str]) -> float:
    """R1-Searcher's cover-EM (``cover_exact_match_score_1`` of its ``evaluation/metric_calc_rule.py``).

    Both sides: "True"/"False" → yes/no, "_" → space, lower-case, punctuation (plus ‘ ’ ´ `)
    → space, drop a/an/the, squeeze spaces. A prediction covers a gold answer when every token
    of the gold is among the prediction's tokens (order-free). Max over gold answers. As in the
    original, tokens come from ``split(" ")``, so a gold that normalises to nothing is covered
    exactly by a prediction that also normalises to nothing (both are ``[""]``).
    """
    ptoks = normalize_cover(pred).split(" ")
    best = 0.0
    for g in _golds(golds):
        if all(t in ptoks for t in normalize_cover(g).split(" ")):
            best = 1.0
    return best


def em_r1_searcher(pred: str, golds: str | Sequence[str]) -> float:
    """R1-Searcher's EM (``exact_match_score``): its cover-EM normalisation (punctuation → space,
    "_" → space, True/False → yes/no), then string equality; max over gold answers."""
    p = normalize_cover(pred)
    return float(any(normalize_cover(g) == p for g in _golds(golds)))


def f1_r1_searcher(pred: str, golds: str | Sequence[str]) -> float:
    """R1-Searcher's token F1 (``f1_score``): HotpotQA's F1 over its cover-EM normalisation."""
    best = 0.0
    p = normalize_cover(pred)
    for g in _golds(golds):
        gn = normalize_cover(g)
        if (p in _SPECIAL or gn in _SPECIAL) and p != gn:
            continue
        common = Counter(p.split()) & Counter(gn.split())
        same = sum(common.values())
        if same:
            prec, rec = same / len(p.split()), same / len(gn.split())
            best = max(best, 2 * prec * rec / (prec + rec))
    return best


def f1_prorag(pred: str, golds: str | Sequence[str]) -> float:
    """ProRAG's token F1 (``prorag/utils/metric.py``, ``calculate_f1_score``): lower-cased
    whitespace tokens with no punctuation or article removal; max over gold answers."""
    best = 0.0
    pt = pred.lower().split()
    for g in _golds(golds):
        gt = g.lower().split()
        same = sum((Counter(pt) & Counter(gt)).values()) if pt and gt else 0
        if same:
            prec, rec = same / len(pt), same / len(gt)
            best = max(best, 2 * prec * rec / (prec + rec))
    return best


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def last_answer(text: str) -> str | None:
    """The last ``<answer>…</answer>`` of ``text``, stripped (Search-R1's ``extract_solution``); None
    when there is none."""
    matches = _ANSWER_TAG.findall(text)
    return matches[-1].strip() if matches else None


def em_last_answer(pred: str, golds: str | Sequence[str]) -> float:
    """Search-R1's EM (``qa_em.compute_score_em``): the last ``<answer>`` of the text under SQuAD
    normalisation, equal to a gold answer. Text with no ``<answer>`` tag is taken as an already
    extracted answer (a prediction column); :func:`em_last_answer_response` is the strict form."""
    answer = last_answer(pred)
    return exact_match(pred if answer is None else answer, golds)


def em_last_answer_response(response: str, golds: str | Sequence[str], prompt: str = "", min_matches: int = 1) -> float:
    """Search-R1's EM of a whole response: 0 when it holds no ``<answer>…</answer>``.

    Search-R1 (``qa_em.extract_solution``) scores ``prompt + response`` and needs at least two
    matches (``min_matches=2``; its prompt holds two). The default, harness's fix, reads the
    response alone and needs one.
    """
    matches = _ANSWER_TAG.findall(prompt + response)
    return 0.0 if len(matches) < min_matches or not matches else exact_match(matches[-1].strip(), golds)


#: Predictions that decline to answer, normalised (:func:`normalize_answer`): no answer at all (a
#: response without one: what the R1-Searcher dialect's own "no answer" string stands for too) and
#: "I don't know" (R1-Searcher's ``no_answer``, ``evaluation/eval_search_loacl.py``; the answer MASH
#: and BAPO reward), and "None" (HARR's generator: ``str(response)`` of a rollout that never
#: answered, ``pipelines.dialects`` ``harr``; a gold answer "none" would be scored as declining, which
#: none of the shipped benchmarks has). A test keeps every registered dialect's ``no_answer``
#: string in this set.
ABSTENTIONS = frozenset({"", "i dont know", "i do not know", "none"})


def abstained(pred: str, golds: str | Sequence[str] = ()) -> float:
    """1 when the prediction declines to answer (:data:`ABSTENTIONS`), else 0; the gold answers
    play no part (a behaviour, not a correctness: OverSearchQA, arXiv 2601.05503, scores abstention
    on unanswerable questions)."""
    return float(normalize_answer(pred or "") in ABSTENTIONS)


Metric = Callable[[str, Sequence[str]], float]
METRICS: Registry[Metric] = Registry("metric")
for _name, _fn in (
    ("em", exact_match),
    ("f1", f1_score),
    ("f1_squad", f1_squad),
    ("acc", acc),
    ("cover_em", cover_em),
    ("precision", precision),
    ("recall", recall),
    ("em_r1_searcher", em_r1_searcher),
    ("f1_r1_searcher", f1_r1_searcher),
    ("em_last_answer", em_last_answer),
    ("f1_prorag", f1_prorag),
    ("abstain", abstained),
):
    METRICS.register(_name, _fn)


def score_prediction(
    pred: str, golds: str | Sequence[str], metrics: Sequence[str] = ("em", "f1", "acc", "cover_em")
) -> dict[str, float]:
    """Every requested metric of one prediction.

    ``pred`` is a string (``None``: no answer, scored as ""); anything else (a list, say) is a
    ``ValueError``, as is an empty list of gold answers. Gold answers that normalise to "" are
    scored as FlashRAG scores them: an empty prediction matches them under EM (the loaders warn
    about such items).
    """
    if pred is not None and not isinstance(pred, str):
        raise ValueError(f"a prediction must be a string, got {type(pred).__name__}: {pred!r}"[:200])
    if not isinstance(golds, str) and len(golds) == 0:
        raise ValueError("no gold answers to score against")
    pred = pred or ""
    return {m: METRICS.get(m)(pred, golds) for m in metrics}
