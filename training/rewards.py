"""Rewards: registered, composable, built on the benchmark metrics (no second copy of EM/F1).

A reward maps a finished :class:`~harness.types.Trajectory` to ``(float, parts)``, where ``parts``
is a dict of its components for logging. Format validity and answer extraction come from the
trajectory's dialect (``pipelines.dialects``) and always look at the RESPONSE only
(``traj.response_text``), never the prompt: Search-R1's own scorer decodes prompt + response and
would otherwise pick up the prompt's example answer (REFERENCE §2, "Answer extraction trap").
For the systems' own dialects these are the systems' exact checks (each system's module under
``pipelines.dialects``): Search-R1's ``is_valid_sequence``, ReSearch's ``validate_format``
(think/search/result order and ``\boxed{}``), R1-Searcher's stage-2 format checks and ProRAG's
``format_reward``; the ``<name>_small`` variants carry our looser check.

Definitions (and where they come from):

- ``em`` (Search-R1 ``qa_em.py``): exact match of the last answer of the response
  (``answer_from: prompt_response``: of prompt + response, as the original reads it).
- ``research_f1_format`` (ReSearch, REFERENCE §1): token F1 when the format is valid and the model
  ended with an answer (``finish_reason == "answer"``, i.e. not cut off before EOS); ``floor``
  (0.1) when that holds but F1 is 0; 0 otherwise.
- ``r1_searcher_stage1`` (``train/reward_server_llama_stage1.py``): ±1 (``answer_term``: +1 when
  the answer covers a gold answer under R1-Searcher's cover-EM, −1 otherwise or without answer
  tags), +0.5 when the retrieval blocks are well formed (with R1-Searcher's own dialect: the
  server's seven tag counts equal and ≥ 1; otherwise: at least one search), +0.5 for the format
  (no ``<think>``, one ``</think>``, ``<answer>``, ``</answer>``).
- ``r1_searcher_stage2`` (``reward_server_llama_stage2.py`` / ``reward_server_qwen_zero.py``,
  ``server: llama|qwen``): R1-Searcher's F1 of the answer (0 without answer tags), minus 1 (Llama
  server) or 2 (Qwen server) when that server's format checks fail.
- ``prorag`` (ProRAG ``prorag/rl/reward.py``): 2·F1 when F1 ≥ 0.2 (else 0) plus ±1 format; see
  :class:`ProRAGOutcome`.
- ``search_r1_format`` (Search-R1 v0.3, ``verl/utils/reward_score/qa_em_format.py``
  ``compute_score_em``): see :class:`SearchR1Format`; the v0.3 training scripts pass
  ``structure_format_score=0.2``, ``final_format_score=0.1``, ``retrieval_score=0``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from benchmarks.metrics import cover_em, exact_match, f1_r1_searcher, f1_score, normalize_answer
from harness.config import ConfigError, from_dict
from harness.registry import Registry
from harness.types import Trajectory
from pipelines.dialects import Dialect, get_dialect
from pipelines.dialects.r1_searcher import r1_searcher_solution, r1_searcher_validate_llama
from pipelines.dialects.research import research_scored_turn
from pipelines.dialects.search_r1 import qa_em_answer
from training.algo_config import AlgoConfig
from training.prm_window import ScoringWindow

if TYPE_CHECKING:
    import torch

RewardOut = tuple[float, dict[str, float]]
RewardFn = Callable[[Trajectory], RewardOut]
# What checks a response's format: a dialect, or a plain callable ``text -> (ok, reason)``.
Validator = Dialect | Callable[[str], tuple[bool, str]]


# ---- format validity and answer extraction (from the dialect, or an injected validator) ------
def _dialect(traj: Trajectory, validator: Validator | None) -> Validator:
    """The object that validates/extracts: ``validator`` if given, else the trajectory's dialect."""
    if validator is not None:
        return validator

    return get_dialect(traj.metadata.get("dialect", "search_r1"))


def format_ok(traj: Trajectory, validator: Validator | None = None, text: str | None = None) -> bool:
    """Is the response (or ``text``, the part of it a reward scores) well formed for its dialect?
    ``validator`` may be a dialect-like object (with ``validate_format``) or a plain callable
    ``text -> (ok, reason)``."""
    v = _dialect(traj, validator)
    check = v.validate_format if hasattr(v, "validate_format") else v
    return bool(check(traj.response_text if text is None else text)[0])


def extract_answer(traj: Trajectory, validator: Validator | None = None, text: str | None = None) -> str | None:
    """The last answer of the RESPONSE (or of ``text``); falls back to ``traj.prediction`` when
    there is no response text (e.g. baselines) or the validator cannot extract."""
    v = _dialect(traj, validator)
    text = traj.response_text if text is None else text
    if text and hasattr(v, "extract_answer"):
        return v.extract_answer(text)
    return traj.prediction or None


def retrieval_hit(traj: Trajectory) -> bool:
    """Does any observation (or retrieved document) contain a normalised gold answer?

    Search-R1's ``is_retrieval_correct`` checks the ``<information>`` blocks; we check the
    observation segments' text and, for trajectories without segments, the recorded documents.
    """
    golds = [g for g in (normalize_answer(a) for a in traj.answers) if g]
    texts = [s.text for s in traj.segments if s.role == "observation"]
    texts += [d.contents for s in traj.searches for d in s.docs]
    return any(g in normalize_answer(t) for t in texts for g in golds)


# ---- the rewards -------------------------------------------------------------------------------
@dataclass(frozen=True)
class EM:
    """Search-R1: 1 when the response's last answer exactly matches a gold answer (SQuAD
    normalisation), else 0.

    ``answer_from``: ``response`` (the default, harness's fix) reads the response only;
    ``prompt_response`` is Search-R1's and RAG-R1's training reward itself (``qa_em.py``
    ``extract_solution`` on the decoded prompt + response, observations included: the last of at
    least two ``<answer>`` blocks, so a response without one is scored on the prompt's example
    answer), as evaluation's metric profile ``search_r1`` reads it."""

    validator: Any = None
    answer_from: str = "response"

    def __post_init__(self) -> None:
        if self.answer_from not in ("response", "prompt_response"):
            raise ValueError(f"em: answer_from must be 'response' or 'prompt_response', got {self.answer_from!r}")

    def __call__(self, traj: Trajectory) -> RewardOut:
        if self.answer_from == "prompt_response":
            answer = qa_em_answer("".join(s.text for s in traj.segments))
        else:
            answer = extract_answer(traj, self.validator)
        em = exact_match(answer, traj.answers) if answer else 0.0
        return em, {"em": em}


@dataclass(frozen=True)
class ResearchF1Format:
    """ReSearch: F1 if the format is valid and the model ended with an answer, ``floor`` when
    that holds but F1 is 0, 0 otherwise (invalid format, or no EOS / cut off)."""

    floor: float = 0.1
    validator: Any = None

    def __call__(self, traj: Trajectory) -> RewardOut:
        # compute_score reads the decoded prompt + response between the prompt's assistant marker
        # and the next one: a response that writes a next turn is validated up to it, and then
        # fails the EOS check (research_scored_turn). Without a marker: the response.
        turn = research_scored_turn("".join(s.text for s in traj.segments)) if traj.segments else None
        text, to_end = turn if turn is not None else (traj.response_text, True)
        ok = traj.finish_reason == "answer" and to_end and format_ok(traj, self.validator, text)
        answer = extract_answer(traj, self.validator, text)
        f1 = f1_score(answer, traj.answers) if answer else 0.0
        # ReSearch's compute_score returns 0 when the \boxed{} cannot be extracted, even with a
        # valid format (validate_format only checks that "\boxed{" and a "}" are present).
        r = (f1 if f1 > 0 else self.floor) if ok and answer is not None else 0.0
        return r, {"f1": f1, "format_valid": float(ok)}


@dataclass(frozen=True)
class R1SearcherStage1:
    """R1-Searcher stage 1 (``train/reward_server_llama_stage1.py``): ``answer_term`` ±1 on
    cover-EM, plus ``retrieval_bonus`` for well-formed retrieval blocks, plus ``format_bonus`` for
    the think/answer tag counts (it teaches the model to call search at all)."""

    retrieval_bonus: float = 0.5
    format_bonus: float = 0.5
    answer_term: float = 1.0  # the server's ±1 cover-EM term (0: the paper's retrieval + format only)
    validator: Any = None

    def __call__(self, traj: Trajectory) -> RewardOut:
        stage1 = getattr(_dialect(traj, self.validator), "options", {}).get("stage1_checks")
        # R1-Searcher's own dialect: the server's solution (after the last turn marker, EOS appended)
        text = r1_searcher_solution(traj.response_text, "llama") if stage1 is not None else None
        if stage1 is not None:
            # R1-Searcher's own dialect: its stage-1 server's two checks (well-formed retrieval
            # blocks, think/answer tag counts), not the stricter stage-2 format check.
            retrieval_ok, format_ok_ = stage1(text)
            searched, ok = float(retrieval_ok), float(format_ok_)
        else:
            searched = float(len(traj.searches) > 0)
            ok = float(format_ok(traj, self.validator))
        # The server scores −1 without answer tags; the dialect's extraction is None then.
        answer = extract_answer(traj, self.validator, text)
        covered = float(bool(answer is not None and cover_em(answer, traj.answers)))
        answer_r = self.answer_term if covered else -self.answer_term
        r = answer_r + self.retrieval_bonus * searched + self.format_bonus * ok
        return r, {"cover_em": covered, "searched": searched, "format_valid": ok}


@dataclass(frozen=True)
class R1SearcherStage2:
    """R1-Searcher stage 2: R1-Searcher's F1 of the answer (0 without answer tags), minus the
    server's penalty when its format checks fail: ``server="llama"``
    (``reward_server_llama_stage2.py``: −1; no "Assistant" check, no 10-word limit) or ``"qwen"``
    (``reward_server_qwen_zero.py``: −2; the dialect's own checks). ``format_penalty`` overrides
    the server's value; ``validator`` overrides its checks."""

    server: str = "qwen"
    format_penalty: float | None = None
    validator: Any = None

    def __post_init__(self) -> None:
        if self.server not in ("llama", "qwen"):
            raise ValueError(f"r1_searcher_stage2: server must be 'llama' or 'qwen', not {self.server!r}")

    def __call__(self, traj: Trajectory) -> RewardOut:
        validator, text = self.validator, None
        exact = _dialect(traj, None).name == "r1_searcher"
        if validator is None and exact:
            # the server's solution: after the last turn marker, one EOS appended (r1_searcher_solution)
            text = r1_searcher_solution(traj.response_text, self.server)
        # The Llama server's checks are the exact protocol's (its prompt opens <think>, so the
        # response has none): our small-model wording, where the model writes <think> itself, keeps
        # its own lenient check, as everywhere else.
        if validator is None and self.server == "llama" and exact:
            validator = r1_searcher_validate_llama
        ok = format_ok(traj, validator, text)
        answer = extract_answer(traj, self.validator, text)  # None without answer tags: F1 0, as the servers
        f1 = f1_r1_searcher(answer, traj.answers) if answer else 0.0
        penalty = self.format_penalty if self.format_penalty is not None else (1.0 if self.server == "llama" else 2.0)
        return (f1 if ok else f1 - abs(penalty)), {"f1": f1, "format_valid": float(ok)}


def prorag_f1(prediction: str, gold: str) -> float:
    """ProRAG's ``calculate_f1_score`` (``prorag/utils/metric.py``): token F1 over lower-cased
    whitespace tokens, no SQuAD normalisation (punctuation and articles count)."""
    p, g = prediction.lower().split(), gold.lower().split()
    if not p or not g:
        return 0.0
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


@dataclass(frozen=True)
class ProRAGOutcome:
    """ProRAG's RL outcome reward (``prorag/rl/reward.py`` ``outcome_reward``): ``scale``·F1 of the
    first ``<answer>`` block when F1 ≥ ``gate`` (else 0), plus the format term +1 / −1 from the
    prorag dialect's validator (ProRAG's ``format_reward``). F1 is ProRAG's own (:func:`prorag_f1`).

    Differences, and why: ProRAG scores against one gold string; a dataset here may list several
    answers, so the best F1 over them is taken (identical with one answer). ProRAG's answer regex
    ignores case (``<ANSWER>``); the dialect's extraction does not (the model is prompted with the
    lower-case tags, and the format term already fails such a response)."""

    scale: float = 2.0
    gate: float = 0.2
    validator: Any = None

    def __call__(self, traj: Trajectory) -> RewardOut:
        answer = extract_answer(traj, self.validator)
        f1 = max((prorag_f1(answer, g) for g in traj.answers), default=0.0) if answer is not None else 0.0
        acc = self.scale * f1 if f1 >= self.gate else 0.0
        fmt = 1.0 if format_ok(traj, self.validator) else -1.0
        return acc + fmt, {"f1": f1, "format_valid": float(fmt > 0)}


@dataclass(frozen=True)
class ProRAGAnswerF1:
    """ProRAG's MCTS terminal reward (``prorag/prm/mcts.py`` ``_compute_terminal_reward``): the F1
    (:func:`prorag_f1`) of the answer, 0 without one; no gate and no format term, so it lies in
    [0, 1]. Several gold answers: the best F1 over them."""

    validator: Any = None

    def __call__(self, traj: Trajectory) -> RewardOut:
        answer = extract_answer(traj, self.validator)
        f1 = max((prorag_f1(answer, g) for g in traj.answers), default=0.0) if answer is not None else 0.0
        return f1, {"f1": f1}


@dataclass(frozen=True)
class SearchR1Format:
    """Search-R1 v0.3's EM-with-format reward (``qa_em_format.compute_score_em``), term by term:

    ============================  ===============  =======================================
    answer                        format valid     format invalid
    ============================  ===============  =======================================
    parsed and EM                 ``score`` (1)    ``score − structure_format_score`` (0.8)
    parsed, wrong                 ``s + r`` (0.2)  ``final_format_score`` (0.1)
    none                          ``s + r`` (0.2)  0
    ============================  ===============  =======================================

    with ``s = structure_format_score`` and ``r = retrieval_score`` only when a gold answer
    appears in an observation (``is_retrieval_correct``, checked only for valid formats).
    Defaults are the v0.3 scripts' ``reward_model.*`` values (the function's own defaults are 0).
    """

    structure_format_score: float = 0.2
    final_format_score: float = 0.1
    retrieval_score: float = 0.0
    score: float = 1.0
    validator: Any = None

    def __call__(self, traj: Trajectory) -> RewardOut:
        ok = format_ok(traj, self.validator)
        answer = extract_answer(traj, self.validator)
        retrieved = ok and retrieval_hit(traj)
        em = exact_match(answer, traj.answers) if answer is not None else 0.0
        if answer is not None and em:
            r = self.score if ok else self.score - self.structure_format_score
        elif ok:
            r = self.structure_format_score + (self.retrieval_score if retrieved else 0.0)
        else:
            r = self.final_format_score if answer is not None else 0.0
        return r, {"em": em, "format_valid": float(ok), "retrieved_gold": float(retrieved)}


@dataclass(frozen=True)
class Composed:
    """A weighted sum of rewards; each part is logged as ``name`` and its components as
    ``name/component``."""

    parts: tuple[tuple[str, float, RewardFn], ...] = field(default_factory=tuple)

    def __call__(self, traj: Trajectory) -> RewardOut:
        total, info = 0.0, {}
        for name, weight, fn in self.parts:
            r, parts = fn(traj)
            total += weight * r
            info[name] = r
            info.update({f"{name}/{k}": v for k, v in parts.items()})
        return total, info


def compose(*parts: tuple[str, float, RewardFn]) -> Composed:
    """``compose(("em", 1.0, EM()), ("stage1", 0.5, R1SearcherStage1()))``: a weighted sum."""
    return Composed(tuple(parts))


REWARDS: Registry = Registry("reward")
REWARDS.register("em", EM)
REWARDS.register("research_f1_format", ResearchF1Format)
REWARDS.register("r1_searcher_stage1", R1SearcherStage1)
REWARDS.register("r1_searcher_stage2", R1SearcherStage2)
REWARDS.register("search_r1_format", SearchR1Format)
REWARDS.register("prorag", ProRAGOutcome)
REWARDS.register("prorag_f1", ProRAGAnswerF1)


def build_reward(spec: str | dict | Sequence[str | dict]) -> RewardFn:
    """Build a reward from config: ``"em"``, ``{"name": "research_f1_format", "floor": 0.1}``,
    or a list of such entries (dicts may carry ``weight``, default 1) to compose."""
    if isinstance(spec, str):
        return REWARDS.get(spec)()
    if isinstance(spec, dict):
        if not isinstance(spec.get("name"), str):
            raise ConfigError(
                f"algo.reward: a reward given as a mapping needs its name (one of {', '.join(REWARDS.names())})"
            )
        params = {k: v for k, v in spec.items() if k not in ("name", "weight")}
        cls = REWARDS.get(spec["name"])
        # its options checked as every config section is (did-you-mean, types, a key YAML read as no string)
        return from_dict(cls, params, f"algo.reward.{spec['name']}") if dataclasses.is_dataclass(cls) else cls(**params)
    return compose(
        *(
            (s["name"], float(s.get("weight", 1.0)), build_reward(s))
            if isinstance(s, dict)
            else (s, 1.0, build_reward(s))
            for s in spec
        )
    )


# ---- step scores (ProRAG's process rewards) ---------------------------------------------------
Step = tuple[int, int, float]  # (token_start, token_end) in the trajectory's token axis, score


class StepScorer(Protocol):
    """Scores the reasoning steps of a rollout (ProRAG). A step is a half-open span of token
    positions in ``trajectory.token_ids``. A learned PRM plugs in by implementing this."""

    def score_steps(self, trajectory: Trajectory) -> list[Step]: ...


class RuleStepScorer:
    """The shipped rule-based step scorer: one step per model turn (model segment).

    - a turn that issued a search scores ``hit`` (1.0) when a retrieved document contains a
      normalised gold answer, else 0.0;
    - the turn that ends the rollout with an answer scores ``format_score`` (0.5), the format
      term of ProRAG's step reward; any other turn scores 0.

    A search belongs to the model turn whose text contains its query; without text, search
    turn k is matched to the k-th model turn.
    """

    def __init__(self, hit: float = 1.0, format_score: float = 0.5) -> None:
        self.hit, self.format_score = hit, format_score

    def score_steps(
        self, trajectory: Trajectory, positions: list[tuple[int, int]] | None = None
    ) -> list[Step] | list[float]:
        """Returns [(token_start, token_end, score)] per model turn. Legacy form: given target
        ``positions`` (one span per model turn, as ``Batch.step_spans``), returns the scores only."""
        golds = [g for g in (normalize_answer(a) for a in trajectory.answers) if g]
        spans, texts, pos = [], [], 0
        for seg in trajectory.segments:
            if seg.role == "model":
                spans.append((pos, pos + len(seg.token_ids)))
                texts.append(seg.text)
            pos += len(seg.token_ids)
        scores = [0.0] * len(spans)
        for s in trajectory.searches:
            k = next((i for i, t in enumerate(texts) if t and s.query and s.query in t), s.turn)
            if 0 <= k < len(scores):
                hit = any(g in normalize_answer(d.contents) for d in s.docs for g in golds)
                scores[k] = max(scores[k], self.hit if hit else 0.0)
        if scores and trajectory.finish_reason == "answer":
            scores[-1] = max(scores[-1], self.format_score)
        if positions is not None:
            return scores[: len(positions)]
        return [(a, b, sc) for (a, b), sc in zip(spans, scores, strict=True)]


STEP_SCORERS: Registry = Registry("step scorer")
STEP_SCORERS.register("rule", RuleStepScorer)
# A learned PRM (training.prm.prm, trained with algo.kind=prm on MCTS records), in process or served.
STEP_SCORERS.register("prm", "training.prm.prm_scorer:PRMStepScorer")


def build_step_scorer(name: str, options: dict[str, Any] | None = None) -> StepScorer:
    """The :data:`STEP_SCORERS` scorer ``name`` built with ``options`` (``prm``: ``path`` or ``url``,
    ``format_term``); an option the scorer does not take is an error that names the ones it does."""
    cls = STEP_SCORERS.get(name)
    options = dict(options or {})
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a builtin or C type: nothing to check against
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in options if k not in params and not takes_any]
    if unknown:
        accepted = ", ".join(p for p in params if params[p].kind is not inspect.Parameter.VAR_POSITIONAL) or "none"
        raise ValueError(f"step scorer {name!r} takes no option {', '.join(unknown)} (it takes: {accepted})")
    return cls(**options)


def algo_step_scorer(algo: AlgoConfig, device: str | torch.device | None = None) -> StepScorer:
    """The step scorer of a training recipe: ``algo.step_scorer``, and for ``prm`` its
    ``algo.step_scorer_path`` (a PRM folder, loaded on ``device``, the policy's, once per node)
    or ``algo.step_scorer_url`` (``harness serve prm``), ``algo.step_scorer_format`` and what the
    PRM scores of each prefix + step (``algo.step_scorer_append_eos``, ``_max_len``, ``_keep``)."""
    name = algo.step_scorer
    if name == "prm":
        window = ScoringWindow(algo.step_scorer_append_eos, algo.step_scorer_max_len, algo.step_scorer_keep)
        options = {
            "path": algo.step_scorer_path,
            "url": algo.step_scorer_url,
            "format_term": algo.step_scorer_format,
            "window": window,
        }
        if algo.step_scorer_path:
            options["device"] = device
        return build_step_scorer(name, options)
    if algo.step_scorer_path or algo.step_scorer_url:
        raise ValueError(f"algo.step_scorer_path/url are for step_scorer=prm, not {name!r}")
    return build_step_scorer(name)
