"""Rejection-sampling fine-tuning's filter (ProRAG stage 3): keep the sampled trajectories whose
outcome is right and whose steps a step scorer (ProRAG: the learned PRM) rates well enough.

Input: run directories of ``harness eval --n-samples K`` (K sampled trajectories per question).
Output: one run directory (``manifest.json``, ``trajectories.jsonl``, ``scores.jsonl``,
``results.json``) holding the kept trajectories, which ``algo.kind: sft`` reads as a source
``{kind: run, path: OUT}``, plus ``rft_summary.json`` (options, counts kept / dropped per reason
and per source) and ``decisions.jsonl`` (one line per input trajectory: kept or why not, its
step scores). The directory is written atomically: it exists complete or not at all.

The filter, in order (the first failing test names the reason):

1. ``error``: the item failed (never kept);
2. ``outcome``: ``metric`` (default ``em``) below ``min_outcome`` (default 1.0), or missing;
3. ``where``: an optional extra expression over the item's scores (``n_searches >= 1``), the
   same safe language as the SFT run source (:func:`training.sft.sft_data.parse_filter`);
4. ``no_steps``: no model turn (or the scorer returned no step);
5. ``duplicate``: the same response as an already kept sample of the same question (on by default,
   so K identical samples do not weigh K times);
6. ``step_score``: the steps from a :data:`training.rewards.STEP_SCORERS` scorer fail ``step_agg``
   against ``step_threshold``:

   - ``min``: every step scores at least the threshold;
   - ``mean``: the steps' mean does;
   - ``step``: ProRAG's own repository (``prorag/rft/filter_prm.py``) keeps each step whose PRM
     logit is ≥ 0 (sigmoid ≥ 0.5) and trains it with its whole prefix as context; here the
     trajectory is kept when one step passes, and its failing model turns become context
     (role ``observation``, loss mask 0; listed in ``metadata.rft.masked_segments``).

The threshold is in the scorer's own units (the ``rule`` scorer gives 0, 0.5 or 1 per turn).
Kept trajectories are renumbered ``sample_index`` 0, 1, ... per question across all sources
(their origin is in ``metadata.rft``), so several run directories merge without collisions.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from benchmarks.evaluate import aggregate
from harness.fsutil import atomic_dir, write_json_atomic
from harness.run_records import RunManifest
from harness.runlog import MANIFEST, RunDir
from harness.types import Segment, Trajectory
from training.rewards import StepScorer, build_step_scorer
from training.sft.sft_data import parse_filter, score_env

logger = logging.getLogger(__name__)

SUMMARY = "rft_summary.json"
DECISIONS = "decisions.jsonl"
STEP_AGGS = ("min", "mean", "step")
REASONS = ("error", "outcome", "where", "no_steps", "duplicate", "step_score")


@dataclass(frozen=True)
class RFTFilterConfig:
    """What :func:`rft_filter` keeps; see the module docstring."""

    metric: str = "em"
    min_outcome: float = 1.0
    where: str | None = None
    step_scorer: str | None = "rule"  # a STEP_SCORERS name; None: outcome only
    step_scorer_args: dict[str, Any] = field(default_factory=dict)
    step_agg: Literal["min", "mean", "step"] = "min"
    step_threshold: float = 0.5
    dedupe: bool = True

    def __post_init__(self) -> None:
        if self.step_agg not in STEP_AGGS:
            raise ValueError(f"step_agg must be one of {', '.join(STEP_AGGS)}, got {self.step_agg!r}")


@dataclass
class Decision:
    """One input trajectory's fate (a line of ``decisions.jsonl``)."""

    source: str
    id: str
    sample_index: int
    kept: bool
    reason: str | None = None  # why it was dropped (one of REASONS)
    outcome: float | None = None
    step_scores: list[float] | None = None
    new_sample_index: int | None = None


@dataclass
class RFTSummary:
    """``rft_summary.json``: the options and what happened to every input."""

    config: dict[str, Any]
    sources: list[str]
    n_in: int = 0
    n_kept: int = 0
    questions_in: int = 0
    questions_kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)

    def line(self) -> str:
        why = ", ".join(f"{k} {v}" for k, v in sorted(self.dropped.items(), key=lambda kv: -kv[1])) or "none"
        return (
            f"kept {self.n_kept} of {self.n_in} trajectories ({self.questions_kept} of {self.questions_in} "
            f"questions); dropped: {why}"
        )


def model_spans(traj: Trajectory) -> list[tuple[int, int, int]]:
    """(segment index, token start, token end) of every model segment on the token axis."""
    out, pos = [], 0
    for i, seg in enumerate(traj.segments):
        if seg.role == "model":
            out.append((i, pos, pos + len(seg.token_ids)))
        pos += len(seg.token_ids)
    return out


def _failing_segments(traj: Trajectory, steps: list[tuple[int, int, float]], threshold: float) -> list[int]:
    """Model segments that overlap a step scoring below ``threshold``."""
    bad = [(a, b) for a, b, s in steps if s < threshold]
    return [i for i, a, b in model_spans(traj) if any(a < y and x < b for x, y in bad)]


class _Filter:
    """Applies one config to trajectories in turn, remembering the kept responses per question."""

    def __init__(self, cfg: RFTFilterConfig, scorer: StepScorer | None) -> None:
        self.cfg, self.scorer = cfg, scorer
        self.where = parse_filter(cfg.where) if cfg.where else None
        self.seen: dict[str, set[str]] = {}
        self.next_index: Counter[str] = Counter()

    def __call__(self, source: str, traj: Trajectory, score: Any) -> tuple[Decision, Trajectory | None]:
        c = self.cfg
        d = Decision(source, traj.example_id, traj.sample_index, kept=False)
        if score is None or score.error or traj.error or traj.finish_reason == "error":
            d.reason = "error"
            return d, None
        if c.metric not in score.metrics:  # a typo would otherwise drop everything as "outcome"
            raise ValueError(f"{source}: its scores have no metric {c.metric!r} (have: {', '.join(score.metrics)})")
        d.outcome = score.metric(c.metric)
        if d.outcome is None or d.outcome < c.min_outcome:
            d.reason = "outcome"
            return d, None
        if self.where is not None and not self.where(score_env(score)):
            d.reason = "where"
            return d, None
        if not model_spans(traj):
            d.reason = "no_steps"
            return d, None
        response = "".join(s.text for s in traj.segments if s.role != "prompt")
        if c.dedupe and response in self.seen.get(traj.example_id, set()):
            d.reason = "duplicate"
            return d, None
        masked: list[int] = []
        if self.scorer is not None:
            steps = [(int(a), int(b), float(s)) for a, b, s in self.scorer.score_steps(traj)]
            d.step_scores = [s for _, _, s in steps]
            if not steps:
                d.reason = "no_steps"
                return d, None
            if not self._steps_pass(d.step_scores):
                d.reason = "step_score"
                return d, None
            if c.step_agg == "step":
                masked = _failing_segments(traj, steps, c.step_threshold)
        self.seen.setdefault(traj.example_id, set()).add(response)
        d.kept, d.new_sample_index = True, self.next_index[traj.example_id]
        self.next_index[traj.example_id] += 1
        return d, self._kept_copy(traj, d, masked)

    def _steps_pass(self, scores: list[float]) -> bool:
        t, agg = self.cfg.step_threshold, self.cfg.step_agg
        if agg == "min":
            return min(scores) >= t
        if agg == "mean":
            return sum(scores) / len(scores) >= t
        return max(scores) >= t  # "step": at least one step is trained

    @staticmethod
    def _kept_copy(traj: Trajectory, d: Decision, masked: list[int]) -> Trajectory:
        segments = [
            Segment("observation", s.token_ids, s.text, None) if i in masked else s for i, s in enumerate(traj.segments)
        ]
        rft = {"source": d.source, "sample_index": d.sample_index, "step_scores": d.step_scores}
        if masked:
            rft["masked_segments"] = masked
        return replace(traj, segments=segments, sample_index=d.new_sample_index, metadata={**traj.metadata, "rft": rft})


def _common(values: list[Any], mixed: str) -> Any:
    distinct = sorted({v for v in values if v is not None}, key=str)
    return distinct[0] if len(distinct) == 1 else (mixed if distinct else None)


def expand_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run directories from the given paths: a run directory itself (it has a manifest), or a
    folder of them (``harness eval --out DIR`` with several datasets), taken in name order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / MANIFEST).is_file():
            out.append(p)
            continue
        children = sorted(c for c in p.iterdir() if (c / MANIFEST).is_file()) if p.is_dir() else []
        if not children:
            raise FileNotFoundError(f"{p}: neither a run directory (no {MANIFEST}) nor a folder of run directories")
        out += children
    return out


def rft_filter(
    run_dirs: list[str | Path], out: str | Path, cfg: RFTFilterConfig, scorer: StepScorer | None = None
) -> RFTSummary:
    """Filter the trajectories of ``run_dirs`` (run directories, or folders of them) into the run
    directory ``out`` (see the module docstring). ``scorer``: a built step scorer (default: built
    from ``cfg``). ``out`` is replaced only when it is empty or a previous filter output."""
    out = Path(out)
    _check_out(out)
    run_dirs = expand_run_dirs(run_dirs)
    if scorer is None and cfg.step_scorer:
        scorer = build_step_scorer(cfg.step_scorer, cfg.step_scorer_args)
    filt = _Filter(cfg, scorer)
    summary = RFTSummary(config=asdict(cfg), sources=[str(p) for p in run_dirs])  # after expansion
    decisions: list[Decision] = []
    kept: list[tuple[Trajectory, Any]] = []
    manifests = []
    questions_in: set[str] = set()
    for rd in run_dirs:
        run = RunDir(rd)
        manifests.append(run.manifest)  # refuses a folder that is not a run directory
        scores = {s.key: s for s in run.scores()}
        counts: Counter[str] = Counter()
        for traj in run.trajectories():
            questions_in.add(traj.example_id)
            d, new = filt(str(rd), traj, scores.get((traj.example_id, traj.sample_index)))
            decisions.append(d)
            counts["kept" if d.kept else str(d.reason)] += 1
            if new is not None:
                s = scores[(traj.example_id, traj.sample_index)]
                extra = {}
                if d.step_scores:
                    extra = {"step_min": min(d.step_scores), "step_mean": sum(d.step_scores) / len(d.step_scores)}
                kept.append((new, replace(s, sample_index=new.sample_index, metrics={**s.metrics, **extra})))
        summary.per_source[str(rd)] = dict(counts)
    summary.n_in, summary.n_kept = len(decisions), len(kept)
    summary.questions_in, summary.questions_kept = len(questions_in), len({t.example_id for t, _ in kept})
    summary.dropped = dict(Counter(d.reason for d in decisions if not d.kept))
    manifest = RunManifest(
        method=_common([m.method for m in manifests], "mixed"),
        dataset=_common([m.dataset for m in manifests], "mixed"),
        split=_common([m.split for m in manifests], "mixed") or "",
        config={"rft": asdict(cfg), "sources": summary.sources},
        model=_common([m.model for m in manifests], "mixed"),
        backend=_common([m.backend for m in manifests], "mixed"),
        retriever=_common([m.retriever for m in manifests], "mixed"),
        n_total=len(kept),
    )
    with atomic_dir(out, kind="rft") as tmp:
        run = RunDir(tmp)
        run.open(manifest)
        _write_jsonl(tmp / "trajectories.jsonl", (t.to_dict() for t, _ in kept))
        _write_jsonl(tmp / "scores.jsonl", (s.to_dict() for _, s in kept))
        metrics = list(dict.fromkeys(m for _, s in kept for m in s.metrics))
        run.write_results(aggregate([s for _, s in kept], manifest, metrics))
        _write_jsonl(tmp / DECISIONS, (asdict(d) for d in decisions))
        write_json_atomic(tmp / SUMMARY, asdict(summary))
    logger.info("rft filter → %s: %s", out, summary.line())
    return summary


def _write_jsonl(path: Path, records: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")


def _check_out(out: Path) -> None:
    """``out`` may be new, empty, or an earlier filter output (replaced); nothing else is."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory for the kept run")
    if any(out.iterdir()) and not (out / SUMMARY).exists():
        raise ValueError(f"--out {out} holds something other than an RFT filter's output; not replacing it")
