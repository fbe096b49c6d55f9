"""THE reasoning-with-search agent: one loop, on token ids, for evaluation and RL rollouts.

For each question the loop keeps the model's context as a list of token ids and a list of
:class:`~harness.types.Segment` s (prompt / model / observation). A model segment is exactly
the ids the backend generated; an observation segment is the ids of the inserted text, encoded
on its own and appended. History is never decoded and re-encoded, so the concatenated segment
ids are exactly what the model was fed, and the loss mask (1 on model tokens only) is exact.

Items run independently as asyncio tasks: a slow item never holds the others back, and the
backend batches whatever requests are in flight. An exception in one item is recorded on its
trajectory (``finish_reason="error"``, ``error_kind`` saying whether the infrastructure failed)
and the run goes on.

:class:`SearchAgent` is one object with two faces. It is a FlashRAG ``BasicPipeline``:
``run(dataset)`` fills ``pred`` and a ``trajectory`` output on each item of a FlashRAG
``Dataset`` and, with ``do_eval``, scores them with FlashRAG's ``Evaluator``. It is also the
harness method (``pipelines.methods.Method``): ``arun(example)`` for one item and
``run_examples(examples)`` for many, which ``harness eval`` and RL rollouts call. Both faces run
the same loop.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.backends.base import Backend, BackendError, Completion, SamplingParams
from harness.config import require_at_least
from harness.errors import error_kind
from harness.retrieval.base import Retriever
from harness.retrieval.state import accepts_state, state_for
from harness.types import Doc, Example, SearchRecord, Segment, Trajectory
from pipelines.dialects import Dialect, resolve_dialect
from pipelines.flashrag_compat import FlashRAGGenerator, from_flashrag_dataset, pipeline_base, safe_config
from pipelines.method import Method

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    """Limits and settings of the agent loop.

    ``max_turns`` counts turns followed by an observation (a search, a corrective message, a
    continuation). ``final_turn``: one more turn without search after them; ``None`` takes the
    dialect's (on only where the original has one: Search-R1, RAG-R1 ``train``, and our small
    variants). ``mode``: ``eval`` or ``train`` for a dialect whose evaluation and training code
    disagree (RAG-R1); ``None`` is the dialect's default (``eval``; RL rollouts pass ``train``).
    """

    max_turns: int = 4
    max_new_tokens: int = 256  # per turn
    max_total_tokens: int = 1024  # generated + observation tokens after the prompt
    max_context: int | None = None  # defaults to the backend's
    min_room: int = 8  # fewer free context tokens than this ends the item (context_overflow)
    topk: int = 3
    max_doc_tokens: int | None = 128  # cap on each inserted document's text (None: whole, as R1-Searcher)
    # Cap on each query's documents (None: no cap): a dialect whose original cuts each query's
    # rendered block (RAG-R1's train mode, Dialect.observe_cut: the "Doc i: ..." block at
    # data.max_obs_length, generation_mq.py _process_documents) cuts it so; elsewhere the
    # documents' texts count, in rank order: the one that crosses it is cut, later ones dropped.
    max_query_doc_tokens: int | None = None
    # Cap on a search's whole observation, in tokens of the text as the dialect writes it (labels,
    # titles, tags included): its first max_obs_tokens tokens, the closing tag cut off with the
    # rest when it is long (None: no cap). Search-R1's generation.py _process_next_obs cuts each
    # observation's token ids at data.max_obs_length so.
    max_obs_tokens: int | None = None
    chat: bool = True  # use the tokenizer's chat template when it has one
    few_shot: bool = False  # put the dialect's one-shot demonstration in the prompt
    response_prefix: str = ""  # text the response starts with (e.g. "<think>"), fed as prompt (mask 0)
    final_turn: bool | None = None
    mode: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    max_concurrency: int = 64
    seed: int = 0
    # "exact": the system's own protocol; "small": our wording for small models (<dialect>_small).
    variant: str = "exact"
    template: str | None = None  # a prompt-template file replacing the dialect's (configs/dialects/)
    # A chat template file (configs/chat_templates/*.jinja) replacing the tokenizer's own, for the
    # dialects that render through one (tool_call); None: the tokenizer's.
    chat_template: str | None = None

    def __post_init__(self) -> None:
        require_at_least(self, 0, "max_turns", "temperature")
        require_at_least(self, 1, "max_new_tokens", "max_total_tokens", "min_room", "topk", "max_doc_tokens")
        require_at_least(self, 1, "max_query_doc_tokens", "max_obs_tokens")
        require_at_least(self, 1, "max_concurrency", "max_context")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class SearchAgent(pipeline_base(), Method):  # type: ignore[misc]
    """The loop for one dialect over a backend and a retriever; a FlashRAG pipeline (see module docstring).

    ``flashrag_config``: the FlashRAG ``Config`` its ``BasicPipeline`` side uses (its
    ``Evaluator`` metrics), kept as ``flashrag_config``; by default
    :func:`~pipelines.flashrag_compat.safe_config`. ``config`` is the :class:`AgentConfig`.
    """

    pauses_between_steps = True  # arun(prefix=, max_steps=): the sync schedule can run it

    def __init__(
        self,
        backend: Backend,
        retriever: Retriever | None,
        dialect: str | Dialect = "research",
        config: AgentConfig | None = None,
        method: str | None = None,
        flashrag_config: Any = None,
    ) -> None:
        config = config or AgentConfig()
        self.dialect = resolve_dialect(dialect, config.variant, config.template, config.mode)
        if config.chat_template is not None:
            self.dialect = self.dialect.with_chat_template(config.chat_template)
        self.final_turn = self.dialect.final_turn if config.final_turn is None else config.final_turn
        # The dialect owns the prompt, so FlashRAG's PromptTemplate (which reads a model config
        # from disk) is not built: the dialect stands in its place.
        self.flashrag_config = flashrag_config or safe_config()
        super().__init__(self.flashrag_config, prompt_template=self.dialect)
        # BasicPipeline keeps FlashRAG's Config as ``config``; here ``config`` is the loop's
        # AgentConfig (FlashRAG's own methods read ``evaluator``, set above, not ``config``).
        self.config = config
        self.backend = backend
        self.retriever = retriever  # after BasicPipeline.__init__, which sets it to None
        self.method = method or self.dialect.name
        self.tokenizer = backend.tokenizer
        self.max_context = self.config.max_context or backend.max_context
        has_template = getattr(self.tokenizer, "chat_template", None) or self.dialect.chat_template
        self.use_chat = self.config.chat and bool(has_template)
        if self.config.chat and not self.use_chat and self.dialect.placement != "raw":
            # Not silent: a chat model prompted in the base form answers differently (the run's
            # manifest records it too: chat_template false).
            logger.warning(
                "%s: the tokenizer of %s has no chat template, so prompts use the dialect's base-model form; "
                "give a tokenizer with one, or set agent.chat=false to ask for the base form",
                self.method, getattr(backend, "model", None) or getattr(self.tokenizer, "name_or_path", "the model"),
            )  # fmt: skip
        if self.dialect.tools is not None and self.use_chat and self.dialect.chat_template is None:
            template = getattr(self.tokenizer, "chat_template", None)
            if isinstance(template, str) and "tools" not in template:
                # Not silent: the prompt will not show the tool schema (SmolLM2's template takes none).
                logger.warning(
                    "%s: the tokenizer's chat template takes no tools, so the prompt lists none; set "
                    "agent.chat_template (configs/chat_templates/, e.g. smollm2_tools.jinja)",
                    self.method,
                )
        # FlashRAG's pipelines expose their generator; the loop itself works on token ids.
        self.generator = FlashRAGGenerator(backend, self.sampling())

    # ---- FlashRAG's pipeline interface -----------------------------------------------------
    def run(self, dataset: Any, do_eval: bool = True, pred_process_fun: Any = None, **kw: Any) -> Any:
        """FlashRAG's ``run``: every item's ``pred`` and ``trajectory`` (a dict) are filled in,
        then FlashRAG's ``evaluate`` scores them when ``do_eval``. ``kw`` go to :meth:`run_examples`."""
        trajectories = self.run_examples(from_flashrag_dataset(dataset), **kw)
        dataset.update_output("pred", [t.prediction for t in trajectories])
        dataset.update_output("trajectory", [t.to_dict() for t in trajectories])
        return self.evaluate(dataset, do_eval=do_eval, pred_process_fun=pred_process_fun)

    # ---- public API ------------------------------------------------------------------------
    def sampling(self, sample_index: int = 0, **overrides: Any) -> SamplingParams:
        c = self.config
        params = SamplingParams(
            max_new_tokens=c.max_new_tokens,
            temperature=c.temperature,
            top_p=c.top_p,
            seed=None if c.temperature == 0 else c.seed + sample_index,
            # Evaluation reads no logprobs (no metric uses them); asking costs the engine a
            # log-softmax per token and the wire a float per token. RL rollouts ask for them
            # (training.rl.rollout.collect sets logprobs=True).
            logprobs=False,
        )
        return params.with_(**overrides) if overrides else params

    @property
    def max_concurrency(self) -> int:
        return self.config.max_concurrency

    async def arun(
        self,
        example: Example,
        sample_index: int = 0,
        sampling: SamplingParams | None = None,
        policy_version: int = 0,
        prefix: Trajectory | None = None,
        max_steps: int | None = None,
    ) -> Trajectory:
        """One item, start to finish. Never raises: errors are recorded on the trajectory.

        Resuming (MCTS, training.data.mcts): ``prefix`` is an earlier trajectory of this example whose
        loop stopped between steps (``finish_reason == "paused"``); the loop continues from its
        segments, counters and searches, exactly as if it had never stopped. ``max_steps`` stops
        the loop after that many steps (a step is one model turn plus its observation) with
        ``finish_reason="paused"`` unless the item ended first; ``max_steps=1`` runs one step.
        The prefix itself is never modified.
        """
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        traj = self._start(example, sample_index, policy_version, prefix)
        start = time.perf_counter()
        try:
            await self._loop(example, traj, sampling or self.sampling(sample_index), max_steps)
        except Exception as e:  # one item's fault stays on that item
            logger.warning("item %s failed: %s: %s", example.id, type(e).__name__, e)
            traj.finish_reason = "error"
            traj.error = f"{type(e).__name__}: {e}"
            traj.error_kind = error_kind(e)
        # The item starts when its first request starts being served: time spent queued behind
        # other items before that (an in-process backend reports it) is not this item's latency.
        traj.wall_time_s += time.perf_counter() - start - traj.metadata.get("queue_s", 0.0)
        traj.response_text = "".join(s.text for s in traj.segments[1:])  # after the prompt proper
        if traj.finish_reason == "error":
            traj.prediction = traj.prediction or self.dialect.extract_answer(traj.response_text) or ""
        elif traj.finish_reason != "paused":
            traj.prediction = self._prediction(traj)
        return traj

    def _prediction(self, traj: Trajectory) -> str:
        """The item's answer as the dialect's original reads it (:class:`~pipelines.dialects.Dialect`
        ``answer_from``, ``no_answer``, ``length_cut_answer``, ``prompt_answers_count``)."""
        d = self.dialect
        if traj.metadata.get("length_cut") and d.length_cut_answer is not None:
            return d.length_cut_answer
        answered = traj.metadata.pop("answer", None) if traj.finish_reason == "answer" else None
        if d.answer_from == "action" and answered is not None:
            return answered
        if d.answer_from == "action" and d.no_answer is not None:
            return d.no_answer
        text = traj.response_text
        if d.prompt_answers_count and traj.segments:
            text = traj.segments[0].text + text
        found = d.extract_answer(text)
        return found if found is not None else (d.no_answer or "")

    # ---- the loop --------------------------------------------------------------------------
    def _start(self, example: Example, sample_index: int, policy_version: int, prefix: Trajectory | None) -> Trajectory:
        """A fresh trajectory, or a copy of a paused ``prefix`` to continue (its lists copied)."""
        if prefix is None:
            return Trajectory.of(
                example,
                self.method,
                sample_index=sample_index,
                policy_version=policy_version,
                metadata={"dialect": self.dialect.name, "chat": self.use_chat},
            )
        if prefix.example_id != example.id:
            raise ValueError(f"prefix belongs to example {prefix.example_id!r}, not {example.id!r}")
        if prefix.finish_reason != "paused" or not prefix.segments or prefix.segments[0].role != "prompt":
            raise ValueError(
                f"can only resume a paused trajectory that starts with its prompt "
                f"(example {example.id!r}: finish_reason={prefix.finish_reason!r})"
            )
        traj = replace(
            prefix,
            segments=[replace(s, token_ids=list(s.token_ids)) for s in prefix.segments],
            searches=list(prefix.searches),
            metadata=copy.deepcopy(prefix.metadata),
            sample_index=sample_index,
            policy_version=policy_version,
            prediction="",
            error=None,
            error_kind=None,
        )
        traj.metadata.pop("queue_s", None)  # this continuation's own queueing, if any
        return traj

    async def _loop(
        self, example: Example, traj: Trajectory, base: SamplingParams, max_steps: int | None = None
    ) -> None:
        c, d = self.config, self.dialect
        if not traj.segments:  # a fresh item: the prompt (a resumed one already has it)
            prompt_ids = d.prompt_ids(self.tokenizer, example.question, chat=self.use_chat, few_shot=c.few_shot)
            traj.segments.append(Segment("prompt", prompt_ids, self.tokenizer.decode(prompt_ids)))
            if c.response_prefix:
                # Part of the response text (so tags it opens are balanced) but not the model's tokens.
                prefix_ids = self.tokenizer.encode(c.response_prefix, add_special_tokens=False)
                traj.segments.append(Segment("prompt", prefix_ids, c.response_prefix))
            traj.prompt_tokens = sum(len(s.token_ids) for s in traj.segments)
        context: list[int] = [t for s in traj.segments for t in s.token_ids]
        # The loop's state is a function of the segments, so a resumed item continues exactly:
        # every step but the last appended one observation, and search_turns counts those steps.
        used = sum(len(s.token_ids) for s in traj.segments if s.role != "prompt")  # after the prompt
        search_turns = sum(1 for s in traj.segments if s.role == "observation")
        steps = 0  # steps taken in this call

        while True:
            if max_steps is not None and steps >= max_steps:
                traj.finish_reason = "paused"
                return
            allow_search = search_turns < c.max_turns
            if not allow_search and not self.final_turn:
                self._finish(traj, "max_turns", d.limit_label)
                return
            room = self.max_context - len(context)
            budget = c.max_total_tokens - used
            if budget <= 0:
                traj.finish_reason = "max_tokens"
                return
            if room < c.min_room:
                traj.finish_reason = "context_overflow"
                return
            max_new = min(base.max_new_tokens, budget, room)
            params = base.with_(max_new_tokens=max_new, stop=d.stops(allow_search))

            comp = await self._generate(context, params, traj)
            traj.n_turns += 1
            if comp.finish_reason == "abort":
                raise BackendError(f"backend aborted the request: {comp.meta.get('message', '')}".strip())
            ids, text, logprobs = self._cut(list(comp.token_ids), comp.text, comp.logprobs)
            cut = len(ids) < len(comp.token_ids)  # the dialect cut the turn: it ends as a stop does
            if d.drop_eos and comp.stopped_on_eos and not cut and ids and ids[-1] in self._eos_ids(comp):
                # the original re-encodes the decoded turn: no EOS token (Dialect.drop_eos)
                ids, logprobs = ids[:-1], None if logprobs is None else logprobs[:-1]
            eos, length = comp.stopped_on_eos and not cut, comp.finish_reason == "length" and not cut
            before = "".join(s.text for s in traj.segments)  # prompt + response so far (RAG-R1's eval reads it)
            action = d.parse_action(text, eos=eos, length=length, context=before)
            if d.rewrite is not None and (new := d.rewrite(text, action)) is not None:
                # The original continues from its own text (R1-Searcher strips the turn): re-encoded.
                text, ids, logprobs = new, self.tokenizer.encode(new, add_special_tokens=False), None
            traj.segments.append(Segment("model", ids, text, logprobs, version=_version(comp.weight_version)))
            context.extend(ids)
            traj.generated_tokens += len(ids)
            used += len(ids)
            if action.label:
                traj.metadata["original_finish"] = action.label

            if action.kind == "answer":
                if action.answer is not None:
                    traj.metadata["answer"] = action.answer
                traj.finish_reason = "answer"
                return
            if length and d.on_length == "end":
                # Which limit stopped it: the item's own budget, the context, or the turn cap.
                bound_by_context = room <= min(base.max_new_tokens, budget)
                traj.finish_reason = "context_overflow" if bound_by_context else "max_tokens"
                traj.metadata["length_cut"] = True
                return
            if not allow_search:
                # The final no-search turn ended without an answer.
                self._finish(traj, "max_turns", d.limit_label)
                return
            if eos and d.on_eos == "end" or action.kind == "end":
                traj.finish_reason = "eos_without_answer"
                return
            if action.kind == "search":
                obs = await self._search(action.queries, search_turns, traj)
            elif action.kind == "continue":
                obs = d.continue_text or ""
            else:
                obs = d.corrective_text(action.reason or "no search query or answer found")
                if obs is None:  # the system ends the item on an invalid action
                    traj.finish_reason = "eos_without_answer"
                    return
            search_turns += 1
            obs_ids = self.tokenizer.encode(obs, add_special_tokens=False)
            if action.kind == "search" and c.max_obs_tokens is not None and len(obs_ids) > c.max_obs_tokens:
                # the original keeps the observation's first ids (Search-R1: next_obs_ids[:, :max_obs_length])
                obs_ids = obs_ids[: c.max_obs_tokens]
                obs = self.tokenizer.decode(obs_ids, skip_special_tokens=True)
            if d.chat_observation is not None and self.use_chat:
                # The template's tool message after the generated turn, less the end-of-turn token
                # the model already generated: the turn's ids stay as generated (continuous tokens).
                ended = eos and bool(ids) and ids[-1] in self._eos_ids(comp)
                obs = d.chat_observation(d, self.tokenizer, obs, self.tokenizer.decode(ids[-1:]) if ended else "")
                obs_ids = self.tokenizer.encode(obs, add_special_tokens=False)
            if len(context) + len(obs_ids) > self.max_context - c.min_room:
                # The observation does not fit: stop here rather than feed a truncated context.
                traj.finish_reason = "context_overflow"
                return
            pre = d.trained_obs_prefix if action.kind == "search" and obs.startswith(d.trained_obs_prefix) else ""
            if pre:  # the original trains the observation's first characters (Dialect.trained_obs_prefix)
                pre_ids, obs = self.tokenizer.encode(pre, add_special_tokens=False), obs[len(pre) :]
                traj.segments.append(Segment("model", pre_ids, pre))
                obs_ids = self.tokenizer.encode(obs, add_special_tokens=False)
                context.extend(pre_ids)
                used += len(pre_ids)
            traj.segments.append(Segment("observation", obs_ids, obs))
            context.extend(obs_ids)
            traj.observation_tokens += len(obs_ids)
            used += len(obs_ids)
            steps += 1

    @staticmethod
    def _finish(traj: Trajectory, reason: Any, label: str) -> None:
        traj.finish_reason = reason
        if label:
            traj.metadata["original_finish"] = label

    def _eos_ids(self, comp: Completion) -> set[int]:
        """The ids a turn that stopped on EOS may end with: the matched stop id, the tokenizer's EOS."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return {i for i in (comp.matched_stop, eos) if isinstance(i, int)}

    def _cut(
        self, ids: list[int], text: str, logprobs: list[float] | None
    ) -> tuple[list[int], str, list[float] | None]:
        """The turn as the dialect's original keeps it (``Dialect.cut``): the shortest prefix of
        the generated tokens whose text reaches the cut; the rest (an EOS included: Search-R1
        re-encodes the cut text) is dropped."""
        at = self.dialect.cut(text) if self.dialect.cut is not None else None
        if at is None:
            return ids, text, logprobs

        def reach(n: int) -> int:  # length of the text of the first n tokens (as the turn's text is decoded)
            return len(self.tokenizer.decode(ids[:n], skip_special_tokens=True))

        lo, hi = 0, len(ids)  # the smallest n whose text reaches the cut
        while lo < hi:
            mid = (lo + hi) // 2
            if reach(mid) >= at:
                hi = mid
            else:
                lo = mid + 1
        if lo >= len(ids):  # nothing after the cut, not even an EOS: the turn stays whole
            return ids, text, logprobs
        cut_text = self.tokenizer.decode(ids[:lo], skip_special_tokens=True)
        return ids[:lo], cut_text, None if logprobs is None else logprobs[:lo]

    async def _generate(self, context: list[int], params: SamplingParams, traj: Trajectory) -> Completion:
        t0 = time.perf_counter()
        try:
            completion = await self.backend.agenerate(list(context), params)
        finally:
            traj.generation_time_s += time.perf_counter() - t0
        if traj.n_turns == 0 and completion.meta.get("queue_s"):
            traj.metadata["queue_s"] = float(completion.meta["queue_s"])
        # The weights that served each turn, as the backend reports them (RL: a rollout must come
        # from the synced policy; a weight update landing mid-trajectory shows as two versions).
        if completion.weight_version is not None:
            versions = traj.metadata.setdefault("weight_versions", [])
            if completion.weight_version not in versions:
                versions.append(completion.weight_version)
        return completion

    def _turns(self, traj: Trajectory) -> list[tuple[str | None, str | None]]:
        """HARR's history (``generator.py``): per earlier model turn, its last query block and its
        last reasoning block (the sub-answer), unstripped; the current turn is not included.

        A turn's text is what the model wrote plus any prompt-role text fed just before it as part
        of the response (``response_prefix``, e.g. the ``<think>`` that opens turn 1): HARR's
        generator writes that tag itself, so without it turn 1's sub-answer would never parse."""
        d = self.dialect
        turns: list[str] = []
        pending = ""  # response-side prompt text (the response prefix) awaiting its model turn
        for s in traj.segments[1:]:  # segment 0 is the prompt proper
            if s.role == "prompt":
                pending += s.text
            elif s.role == "model":
                turns.append(pending + s.text)
                pending = ""
            else:
                pending = ""
        return [(_last(d.query_open, d.query_close, t), _last(d.think_open, d.think_close, t)) for t in turns[:-1]]

    async def _search(self, queries: tuple[str, ...], turn: int, traj: Trajectory) -> str:
        if not queries:  # a search with nothing to look up: the dialect says what comes back
            return self.dialect.observation_text((), [])
        if self.retriever is None:
            raise RuntimeError("the agent asked for a search but no retriever is configured")
        t0 = time.perf_counter()
        # History-aware retrievers (HARR) get the trajectory so far through the protocol's `state`.
        # The key (example, sample) lets a sampling retriever seed each call, whatever the concurrency.
        key = f"{traj.example_id}#{traj.sample_index}"
        kw = (
            {"state": [state_for(traj.question, traj.searches, key, self._turns(traj))] * len(queries)}
            if accepts_state(self.retriever)
            else {}
        )
        # Retrievers are synchronous (BM25/FAISS/HTTP); a thread keeps other items moving.
        results = await asyncio.to_thread(self.retriever.search, list(queries), self.config.topk, **kw)
        samples = getattr(results, "samples", None) or [None] * len(queries)  # stochastic retrievers' records
        latency = time.perf_counter() - t0
        traj.retrieval_time_s += latency
        c, d = self.config, self.dialect
        capped = [list(docs) for docs in results]
        if c.max_doc_tokens is not None:
            capped = [[cap_doc(self.tokenizer, doc, c.max_doc_tokens) for doc in docs] for docs in capped]
        blocks = c.max_query_doc_tokens is not None and d.observe_cut is not None  # the original cuts blocks
        if c.max_query_doc_tokens is not None and not blocks:
            capped = [cap_doc_list(self.tokenizer, docs, c.max_query_doc_tokens) for docs in capped]
        for q, docs, sample in zip(queries, capped, samples, strict=True):
            traj.searches.append(SearchRecord.from_docs(turn, q, docs, latency / len(queries), sample))
        if blocks:
            return d.observe_cut(d, queries, capped, lambda text: self._first_tokens(text, c.max_query_doc_tokens))
        return d.observation_text(queries, capped)

    def _first_tokens(self, text: str, n: int) -> str:
        """``text``'s first ``n`` tokens, decoded without special tokens (RAG-R1's _process_documents)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= n else self.tokenizer.decode(ids[:n], skip_special_tokens=True)


def _last(open_tag: str, close_tag: str, text: str) -> str | None:
    found = re.findall(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), text, flags=re.DOTALL)
    return found[-1] if found else None


# Capped texts per tokenizer: a passage comes back for many samples, turns and questions, and
# encoding it again each time was among an evaluation's top costs outside the engine (profiled).
_CAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CAPPED_MAX = 100_000  # entries per tokenizer before the cache starts over


def cap_doc(tokenizer: Any, doc: Doc, max_tokens: int) -> Doc:
    """The cap on an inserted document's text: its first ``max_tokens`` tokens, then `` ...``."""
    try:
        cache = _CAPPED.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that takes no weak reference: no cache
        cache = {}
    key = (doc.text, max_tokens)
    if key not in cache:
        ids = tokenizer.encode(doc.text, add_special_tokens=False)
        if len(cache) >= _CAPPED_MAX:
            cache.clear()
        cache[key] = None if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]) + " ..."
    text = cache[key]
    return doc if text is None else Doc(id=doc.id, title=doc.title, text=text, score=doc.score)


def cap_doc_list(tokenizer: Any, docs: Sequence[Doc], max_tokens: int) -> list[Doc]:
    """One query's documents within ``max_tokens`` tokens of their texts, in rank order: whole
    while they fit, the one that crosses the cap cut to what is left (its first tokens, decoded
    without special tokens, as RAG-R1 truncates), the rest dropped."""
    out: list[Doc] = []
    left = max_tokens
    for doc in docs:
        ids = tokenizer.encode(doc.text, add_special_tokens=False)
        if len(ids) <= left:
            out.append(doc)
            left -= len(ids)
            continue
        if left > 0:
            text = tokenizer.decode(ids[:left], skip_special_tokens=True)
            out.append(Doc(id=doc.id, title=doc.title, text=text, score=doc.score))
        break
    return out


def _version(weight_version: str | None) -> int | None:
    """A backend's weight version as the policy version (an int) where it is one."""
    try:
        return int(weight_version) if weight_version is not None else None
    except ValueError:  # a server started with its own label
        return None
