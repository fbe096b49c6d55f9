"""The evaluation core: :func:`evaluate` runs a built method over examples into a run directory.

Like lm-evaluation-harness's ``evaluator.evaluate``, it takes built objects and builds nothing
from names (``benchmarks.setup`` does that, like ``simple_evaluate``). Per item it scores the
trajectory and appends both to the run directory as the item finishes; at the end it
aggregates the latest score of every item into ``results.json``. Everything it writes is read
back through :class:`~harness.runlog.RunDir` and the typed records, so a report can recompute
scores from the trajectories alone (``harness report --rescore``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.metrics import em_last_answer_response, score_prediction
from harness.run_records import RESULTS_FROM_MANIFEST, ItemScore, RunManifest, RunResults
from harness.runlock import run_lock
from harness.runlog import RETRIABLE_ERROR_KINDS, RunDir
from harness.types import Example, Trajectory

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("em", "f1", "acc", "cover_em")
# Recorded for every item whatever the metric profile: what the model did (declined to answer or
# not), not how right it was, so that every run has it (and --rescore recomputes it). Not part of a
# run's configured metrics, so adding it changed no run's config hash.
BEHAVIOUR_METRICS = ("abstain",)
# Metrics computed from more than the prediction (the whole response, the question).
_TRAJECTORY_METRICS = ("em_last_answer", "judge")


def score_trajectory(
    traj: Trajectory,
    metrics: Iterable[str] = DEFAULT_METRICS,
    judge: Callable[..., float | None] | None = None,
    response_only: bool = True,
) -> ItemScore:
    """The score of one item. A failed item records 0 on every metric, but is never counted in a
    mean (:func:`scored_items`).

    ``em_last_answer`` (Search-R1's EM) reads the last ``<answer>`` of the whole response when
    the trajectory has one. ``response_only`` (harness's fix, on in the ``default`` profile): the
    prompt's example answer never counts; off (profile ``search_r1``), it is Search-R1's
    ``qa_em.extract_solution`` on prompt + response exactly (at least two matches, the last one;
    Search-R1's prompt holds two, so a response without an answer scores as "Beijing").
    ``judge`` (a :class:`benchmarks.judge.LLMJudge`) gives the ``judge``
    metric; its None (a failed call) stays None: missing, not wrong. Without a judge the
    ``judge`` metric is None too.
    """
    metrics = tuple(metrics) + tuple(m for m in BEHAVIOUR_METRICS if m not in metrics)
    plain = tuple(m for m in metrics if m not in _TRAJECTORY_METRICS)
    if traj.error is not None:
        values: dict[str, float | None] = dict.fromkeys(metrics, 0.0)
    else:
        values = dict(score_prediction(traj.prediction, list(traj.answers), metrics=plain))
        if "em_last_answer" in metrics:
            prompt = "" if response_only or not traj.segments else traj.segments[0].text
            values["em_last_answer"] = (
                em_last_answer_response(
                    traj.response_text, list(traj.answers), prompt, min_matches=1 if response_only else 2
                )
                if traj.response_text
                else score_prediction(traj.prediction, list(traj.answers), ("em_last_answer",))["em_last_answer"]
            )
        if "judge" in metrics:
            values["judge"] = (
                judge(traj.example_id, traj.question, list(traj.answers), traj.prediction or "") if judge else None
            )
        values = {m: values[m] for m in metrics}
    return ItemScore(
        id=traj.example_id,
        sample_index=traj.sample_index,
        metrics=values,
        prediction=traj.prediction,
        finish_reason=traj.finish_reason,
        n_searches=len(traj.searches),
        generated_tokens=traj.generated_tokens,
        wall_time_s=round(traj.wall_time_s, 4),
        error=traj.error,
        error_kind=traj.error_kind if traj.error is not None else None,
    )


def scored_items(scores: Iterable[ItemScore]) -> list[ItemScore]:
    """The items every mean harness shows is taken over (``results.json``, the report, the demo's
    tables): all but the failed ones. A failed item (``error``: the retriever or the server failed,
    never something the model did) has no score: it is counted apart (``errors``), not in ``n``,
    and left out of every mean, so a run with a dead retriever does not read as a weak model. A
    run whose items all failed has no score at all (None), never 0."""
    return [s for s in scores if not s.error]


def item_values(scores: Iterable[ItemScore], metric: str) -> dict[str, float]:
    """One value of ``metric`` per example id over :func:`scored_items` (with several samples per
    example, their mean: items, not samples, are the unit a mean and a bootstrap are over, since
    samples of one question are correlated). An item missing the value (a failed judge call, a
    metric the run never computed) is left out: missing, not wrong."""
    per_id: dict[str, list[float]] = {}
    for s in scored_items(scores):
        value = s.metric(metric)
        if value is not None:
            per_id.setdefault(s.id, []).append(float(value))
    return {k: float(np.mean(v)) for k, v in per_id.items()}


def metric_mean(scores: Iterable[ItemScore], metric: str) -> float | None:
    """The mean of ``metric`` over the items (:func:`item_values`); None when none has a value."""
    values = list(item_values(scores, metric).values())
    return float(np.mean(values)) if values else None


def behaviour(
    scores: Iterable[ItemScore], correct: str, unanswerable: Iterable[str] | None = None
) -> dict[str, float | None]:
    """Abstention and cost over the scored items (:func:`scored_items`); ``correct``: the metric
    that says an answer is right (a run's headline, EM by default); ``unanswerable``: ids of the
    questions whose gold answer is nowhere in the searched corpus (``harness index check``), when
    known. docs/evaluation.md ("Abstention and cost") defines each value and its source:

    - ``abstention``: the share of items whose prediction declines (``abstain``);
    - ``tokens_per_correct`` / ``searches_per_correct``: generated tokens / searches over all
      scored samples, divided by the sum of ``correct`` over them (None when nothing is correct);
    - with ``unanswerable``: ``answerable_accuracy`` (mean ``correct`` over the other questions),
      ``unanswerable_abstention`` (mean ``abstain`` over those) and ``n_unanswerable``.
    """
    scores = list(scores)
    items = scored_items(scores)
    right = sum(float(s.metric(correct) or 0.0) for s in items)
    out: dict[str, float | None] = {
        "abstention": metric_mean(scores, "abstain"),
        "tokens_per_correct": sum(s.generated_tokens for s in items) / right if right else None,
        "searches_per_correct": sum(s.n_searches for s in items) / right if right else None,
    }
    if unanswerable is not None:
        out_ids = set(unanswerable)
        acc = [v for k, v in item_values(scores, correct).items() if k not in out_ids]
        abst = [v for k, v in item_values(scores, "abstain").items() if k in out_ids]
        out["answerable_accuracy"] = float(np.mean(acc)) if acc else None
        out["unanswerable_abstention"] = float(np.mean(abst)) if abst else None
        out["n_unanswerable"] = float(len({s.id for s in items} & out_ids))
    return out


def unanswerable_ids(answerability: dict[str, Any] | None) -> list[str] | None:
    """The ids of a run's questions whose answer is not in the corpus, from its manifest's
    ``answerability`` (None when ``harness index check`` has not recorded them)."""
    if not answerability or "unanswerable" not in answerability:
        return None
    return [str(i) for i in answerability["unanswerable"]]


def aggregate(
    scores: Sequence[ItemScore], manifest: RunManifest, metrics: Iterable[str] = DEFAULT_METRICS
) -> RunResults:
    """``results.json``: means over the scored items (:func:`metric_mean`: failed items are left
    out and counted in ``errors``), latency percentiles, counts, completeness."""
    metrics = tuple(metrics)

    def mean(values: Iterable[float | None]) -> float | None:
        vals = [v for v in values if v is not None]
        return float(np.mean(vals)) if vals else None

    failed = [s for s in scores if s.error]
    everything, scores = scores, scored_items(scores)
    lat = [s.wall_time_s for s in scores if s.wall_time_s is not None]
    return RunResults(
        **{k: getattr(manifest, k) for k in RESULTS_FROM_MANIFEST},
        n=len(scores),
        n_total=manifest.n_total,
        complete=len(scores) >= manifest.n_total,
        errors=len(failed),
        error_kinds=dict(Counter(error_label(s) for s in failed)),
        metrics={m: metric_mean(everything, m) for m in metrics},
        missing={m: k for m in metrics if (k := sum(1 for s in scores if s.metric(m) is None))},
        mean_searches=mean(s.n_searches for s in scores),
        mean_generated_tokens=mean(s.generated_tokens for s in scores),
        latency_p50_s=float(np.percentile(lat, 50)) if lat else None,
        latency_p95_s=float(np.percentile(lat, 95)) if lat else None,
        finish_reasons=dict(Counter(str(s.finish_reason) for s in scores)),
        correct_metric=metrics[0] if metrics else None,
        behaviour=behaviour(everything, metrics[0], unanswerable_ids(manifest.answerability)) if metrics else {},
    )


def error_label(score: ItemScore) -> str:
    """The exception type of a failed item (``RetrievalError``), for one-line summaries."""
    return (score.error or "").split(":", 1)[0].strip() or (score.error_kind or "error")


def error_summary(results: RunResults) -> str | None:
    """``14 items failed: RetrievalError ×14; rerun to retry them`` (None when nothing failed)."""
    if not results.errors:
        return None
    kinds = ", ".join(f"{k} ×{n}" for k, n in sorted(results.error_kinds.items(), key=lambda kv: -kv[1]))
    return f"{results.errors} item{'s' if results.errors != 1 else ''} failed: {kinds}; rerun to retry them"


class InfrastructureDown(RuntimeError):
    """The retriever or the generation server stayed down: the run stopped early (exit 1). What
    finished is on disk; the same command resumes once the server is back."""


class BreakerTripped(RuntimeError):
    """``limit`` items in a row failed for an infrastructure reason: raised on the event loop by
    :class:`FailureBreaker` so that the items still running are cancelled at once
    (:func:`pipelines.concurrency.run_bounded`); :meth:`FailureBreaker.check` decides off the loop."""


HEALTH_PAUSE_S = 5.0  # from the trip until the health of the servers is checked again


class FailureBreaker:
    """Stops a run whose infrastructure is down instead of letting every remaining item fail
    slowly (each after its retries). Called with each item's score on the event loop, it never
    blocks: after ``limit`` items in a row failed for an infrastructure reason it raises
    :class:`BreakerTripped`, which ends the method's run and cancels the items still running.
    Then, off the loop, :meth:`check` waits until :data:`HEALTH_PAUSE_S` after the trip (the
    winding down counts), calls ``health`` (the preflight) and returns when it passes (the run
    goes on with the items not tried yet); when it raises, it raises :class:`InfrastructureDown`
    naming the component and how many items failed. So a dead server stops a run within about
    :data:`HEALTH_PAUSE_S` of the trip, whatever the concurrency."""

    _WHAT = {"retrieval": "retriever", "backend": "generation backend", "timeout": "retriever or backend (timeouts)"}

    def __init__(self, limit: int, health: Callable[[], None] | None, done: int, total: int, where: str) -> None:
        self.limit, self.health, self.done, self.total, self.where = limit, health, done, total, where
        self.streak: list[ItemScore] = []
        self.failed = 0  # items that failed in this process
        self.tripped_at: float | None = None

    def __call__(self, score: ItemScore) -> None:
        self.done += 1
        self.failed += bool(score.error)
        if self.tripped_at is None:  # an item finishing while the run winds down is only counted
            self.streak = self.streak + [score] if score.error_kind in RETRIABLE_ERROR_KINDS else []
            if not self.limit or len(self.streak) < self.limit:
                return
            self.tripped_at = time.monotonic()
            logger.warning("%d items in a row failed (%s): stopping the items still running", self.limit, self._what())
        raise BreakerTripped(f"{len(self.streak)} items in a row failed")

    def _what(self) -> str:
        kinds = Counter(s.error_kind for s in self.streak)
        return self._WHAT.get(kinds.most_common(1)[0][0], "infrastructure") if kinds else "infrastructure"

    def check(self) -> None:
        """After a trip, off the event loop: pause, then the health check (see the class)."""
        assert self.tripped_at is not None, "check() follows a trip"
        what, last = self._what(), (self.streak[-1].error if self.streak else "")
        pause = max(0.0, self.tripped_at + HEALTH_PAUSE_S - time.monotonic())
        logger.warning("pausing %.0f s, then checking the health of the %s", pause, what)
        time.sleep(pause)
        try:
            if self.health is not None:
                self.health()
        except Exception as e:  # any failure of the health call means: still down
            raise InfrastructureDown(
                f"{what} down: {self.failed} item{'s' if self.failed != 1 else ''} failed ({len(self.streak)} in a "
                f"row, the last: {last}) and the health check failed ({type(e).__name__}: {e}). Stopped after "
                f"{self.done} of {self.total} items ({self.where}); finished items are saved: rerun the same "
                "command to resume once it is back"
            ) from None
        logger.warning("the health check passed: going on")
        self.streak, self.tripped_at = [], None


def evaluate(
    method: Any,
    examples: Sequence[Example],
    run_dir: str | Path | RunDir,
    metrics: Iterable[str] = DEFAULT_METRICS,
    manifest: RunManifest | None = None,
    on_item: Callable[[ItemScore], None] | None = None,
    n_samples: int = 1,
    judge: Callable[..., float | None] | None = None,
    response_only: bool = True,
    health: Callable[[], None] | None = None,
    stop_after_failures: int = 0,
    schedule: str = "async",
) -> RunResults:
    """Run (or resume) ``method`` on ``examples`` into ``run_dir``; returns the results.

    ``method`` is anything with the method protocol (``pipelines.methods.Method``):
    ``run_examples(examples, n_samples=..., on_done=..., skip=..., schedule=...)``. ``manifest`` describes the
    run (a minimal one is made from the method's name when omitted); an existing run directory
    resumes when its manifest matches, skipping finished items and re-running failed ones.
    ``on_item`` is called with each new score (a progress display). ``judge`` scores the
    ``judge`` metric (:class:`benchmarks.judge.LLMJudge`); items whose verdict is missing are
    asked again at the end of the run (cached verdicts cost nothing). The run directory is locked
    for the whole run: a second writer gets :class:`~harness.runlock.RunLockedError` at once.
    ``stop_after_failures`` items failing in a row for an infrastructure reason pause the run and
    call ``health``; when that fails too the run stops with :class:`InfrastructureDown` (the
    results of what finished are written first). 0: never stop. ``schedule``: how the method
    schedules its items (``pipelines.method.SCHEDULES``: ``async`` or the turn-synchronous ``sync``).
    """
    metrics = tuple(metrics)
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    with run_lock(run.path, "eval"):  # two writers would run (and log) every item twice
        return _evaluate(
            method,
            examples,
            run,
            metrics,
            manifest,
            on_item,
            n_samples,
            judge,
            response_only,
            health,
            stop_after_failures,
            schedule,
        )


def _evaluate(
    method: Any,
    examples: Sequence[Example],
    run: RunDir,
    metrics: tuple[str, ...],
    manifest: RunManifest | None,
    on_item: Callable[[ItemScore], None] | None,
    n_samples: int,
    judge: Callable[..., float | None] | None,
    response_only: bool,
    health: Callable[[], None] | None,
    stop_after_failures: int,
    schedule: str,
) -> RunResults:
    if manifest is None:
        manifest = RunManifest(method=getattr(method, "method", type(method).__name__), dataset="?", split="")
    manifest.n_total = len(examples) * n_samples
    resumed = run.open(manifest)
    skip = run.finished_keys()
    if resumed:
        logger.info("resuming %s: %d of %d items already done", run.path, len(skip), manifest.n_total)

    breaker = FailureBreaker(stop_after_failures, health, len(skip), manifest.n_total, str(run.path))
    tried = set(skip)  # what this process has run (or skips): after a passed health check, the rest runs

    def on_done(traj: Trajectory) -> None:
        score = score_trajectory(traj, metrics, judge, response_only)
        run.append(traj, score)
        tried.add(score.key)
        if on_item is not None:
            on_item(score)
        breaker(score)  # raising here ends the method's run: the items still running are cancelled

    t0 = time.perf_counter()
    wanted = {(e.id, j) for e in examples for j in range(n_samples)}
    while True:
        try:
            method.run_examples(examples, n_samples=n_samples, on_done=on_done, skip=set(tried), schedule=schedule)
            break
        except BreakerTripped:
            try:
                breaker.check()  # the event loop has ended: pausing here blocks no item
            except InfrastructureDown:
                run.write_results(aggregate([s for s in run.scores() if s.key in wanted], manifest, metrics))
                raise
    logger.debug("%s: ran in %.1f s", run.path, time.perf_counter() - t0)
    if judge is not None and "judge" in metrics:
        _rejudge_missing(run, wanted, metrics, judge)
    results = aggregate([s for s in run.scores() if s.key in wanted], manifest, metrics)
    run.write_results(results)
    return results


def _rejudge_missing(run: RunDir, wanted: set[tuple[str, int]], metrics: tuple[str, ...], judge: Callable) -> None:
    """Ask the judge again for finished items whose verdict is missing (a failed call, or a run
    scored before a judge was configured); a new verdict is appended as the item's latest score."""
    scores = {s.key: s for s in run.scores() if s.key in wanted}
    for traj in run.trajectories():
        s = scores.get((traj.example_id, traj.sample_index))
        if s is None or s.error or s.metric("judge") is not None:
            continue
        verdict = judge(traj.example_id, traj.question, list(traj.answers), traj.prediction or "")
        if verdict is not None:
            run.append_score(replace(s, metrics={**s.metrics, "judge": verdict}))
