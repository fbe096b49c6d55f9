"""Metric profiles: the metrics each seed paper reports, computed as that paper's scorer does.

``--metric-profile NAME`` (``harness eval``, ``score``, ``report``, ``replicate``) selects one.
The first metric of a profile is its headline (the number the paper's tables print). ``judge``
is the LLM-as-judge metric (:mod:`benchmarks.judge`); it is computed only when a judge endpoint
is configured, otherwise it is left out and the output says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.config import ConfigError, section
from harness.registry import Registry

JUDGE = "judge"


@dataclass(frozen=True)
class MetricProfile:
    """A paper's metric set: ``metrics`` (headline first) and where the definitions come from."""

    name: str
    metrics: tuple[str, ...]
    source: str
    judge_prompt: str | None = None  # configs/judges/<name>.yaml: the paper's own judge prompt
    # Harness's fix: an answer is read from the response only, so the prompt's example answer
    # never counts. Off in `search_r1`: its qa_em reads prompt + response (two matches needed;
    # its prompt has two, so a response without an answer is scored as "Beijing").
    answer_in_response_only: bool = True

    @property
    def headline(self) -> str:
        return self.metrics[0]

    @property
    def uses_judge(self) -> bool:
        return JUDGE in self.metrics

    def without_judge(self) -> tuple[str, ...]:
        return tuple(m for m in self.metrics if m != JUDGE)


PROFILES: Registry[MetricProfile] = Registry("metric profile")
for _p in (
    MetricProfile(
        "default", ("em", "f1", "acc", "cover_em"), "harness: FlashRAG's EM/F1/acc and R1-Searcher's cover-EM"
    ),
    MetricProfile(
        "search_r1",
        ("em_last_answer", "f1"),
        "PeterGriffinJin/Search-R1 verl/utils/reward_score/qa_em.py (compute_score_em: SQuAD-normalised EM "
        "of the last <answer> of prompt + response, at least two matches); the paper's tables report EM",
        answer_in_response_only=False,
    ),
    MetricProfile(
        "r1_searcher",
        ("cover_em", "em_r1_searcher", "f1_r1_searcher", JUDGE),
        "RUCAIBox/R1-Searcher evaluation/metric_calc_rule.py (cover_exact_match_score_1, exact_match_score, "
        "f1_score) and evaluation/metric_calc_gpt_as_judge.py (LLM-as-judge)",
        judge_prompt="r1_searcher",
    ),
    MetricProfile(
        "research",
        ("em", JUDGE),
        "Agent-RL/ReSearch: EM from its FlashRAG fork's evaluator and LLM-as-judge from "
        "scripts/evaluation/llm_judge.py (configs/judges/research.yaml)",
        judge_prompt="research",
    ),
    MetricProfile("rag_r1", ("em",), "inclusionAI/AWorld-RL RAG-R1: EM (the metric its paper reports)"),
    MetricProfile(
        "harr",
        ("em", "f1_squad"),
        "zyc140345/HARR scripts/evaluate_rag.py (compute_metric: SQuAD EM and F1 from evaluate.load('squad'))",
    ),
    MetricProfile(
        "prorag",
        ("em", "f1_prorag"),
        "lilinwz/ProRAG prorag/utils/metric.py (calculate_f1_score: lower-cased whitespace tokens, no "
        "punctuation or article removal) and EM",
    ),
):
    PROFILES.register(_p.name, _p)


def get_profile(name: str) -> MetricProfile:
    """The registered profile ``name`` (a clear error listing the known ones otherwise)."""
    return PROFILES.get(name)


def profile_metrics(name: str, judge_configured: bool) -> tuple[str, ...]:
    """The metrics a run computes under profile ``name``: ``judge`` only with a judge endpoint."""
    p = get_profile(name)
    return p.metrics if judge_configured else p.without_judge()


def apply_profile(data: dict, profile: str | None) -> dict:
    """A raw eval config (``data``) with ``metric_profile`` and its ``metrics`` filled in.

    ``profile`` (the ``--metric-profile`` flag) wins over ``metric_profile`` in the data; metrics
    given explicitly (``metrics=[...]``) are kept. A configured judge (``judge.url``) adds the
    ``judge`` metric when the profile has none; without one the profile's ``judge`` is dropped.
    """
    out = dict(data)
    name = profile or out.get("metric_profile") or "default"
    if not isinstance(name, str):
        raise ConfigError(f"metric_profile must be a profile's name, not {name!r:.60}")
    p = get_profile(name)
    out["metric_profile"] = name
    judge_on = bool(section(out, "judge", "the LLM judge's options: url, model, ...").get("url"))
    if judge_on and p.judge_prompt and "prompt" not in out["judge"]:
        out["judge"] = {**out["judge"], "prompt": p.judge_prompt}  # the paper's own judge prompt
    if "metrics" not in out:
        metrics = list(profile_metrics(name, judge_on))
        if judge_on and JUDGE not in metrics:
            metrics.append(JUDGE)
        out["metrics"] = metrics
    elif not isinstance(out["metrics"], list):
        raise ConfigError(f"metrics must be a list of metric names, not {out['metrics']!r:.60}")
    elif not judge_on and p.uses_judge:
        out["metrics"] = [m for m in out["metrics"] if m != JUDGE]
    return out


def judge_note(profile: str, metrics: set[str]) -> str | None:
    """A line for the user when the profile's paper also reports an LLM judge and the run has
    none (None otherwise)."""
    if get_profile(profile).uses_judge and JUDGE not in metrics:
        return f"LLM judge: not configured (the {profile} profile's paper also reports one; pass --judge-url)"
    return None
