"""Agent dialects: each seed system's protocol as its own code runs it, plus our small-model variants.

``research``, ``search_r1``, ``r1_searcher``, ``rag_r1`` and ``prorag`` follow ReSearch,
Search-R1, R1-Searcher, RAG-R1 and ProRAG: the prompt template (a data file under
``configs/dialects/`` citing repository, file and commit), where it sits (system / user / raw),
question normalisation, stops, how a turn is cut, what follows a malformed turn, an EOS or a
token-limit cut, the observation text, the answer, the corrective message and the format check
of each system's reward (:mod:`.protocols`). They follow the evaluation code; RAG-R1, whose
evaluation script and training loop disagree, has two modes (``eval``, the default for
``harness eval``, and ``train``, the default for rollouts; :meth:`Dialect.with_mode`). What is
still known to differ from an original is listed under ``differences`` in its dialect file
(printed by ``harness prompt``); the token-level loop is one such difference for every system.

``<name>_small`` (for the first four) keep our own wording and lenient parsing for small models
(:mod:`.small`); ``AgentConfig.variant="small"`` selects them. ``AgentConfig.template=FILE``
replaces a dialect's template with the one a checkpoint was trained with.

Where FlashRAG's ports differ from the originals, the originals are implemented;
``FLASHRAG_DIFFERENCES`` lists what differs, per dialect.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.registry import Registry
from pipelines.dialects import protocols as P
from pipelines.dialects import small
from pipelines.dialects.base import (
    TEMPLATE_DIR,
    Action,
    Dialect,
    doc_contents,
    load_template_file,
    shipped_template,
    title_and_text,
)
from pipelines.dialects.small import extract_boxed, split_parallel_queries

__all__ = [
    "DIALECTS",
    "FLASHRAG_DIFFERENCES",
    "TEMPLATE_DIR",
    "Action",
    "Dialect",
    "doc_contents",
    "extract_boxed",
    "get_dialect",
    "load_template_file",
    "resolve_dialect",
    "split_parallel_queries",
    "title_and_text",
]

DIALECTS: Registry[Dialect] = Registry("dialect")

# What FlashRAG's own ports (flashrag/pipeline/reasoning_pipeline.py, RUC-NLPIR/FlashRAG at
# 1ee524901aa3daf009f97b7a31e7a1b58eee8206) do differently from the original code.
FLASHRAG_DIFFERENCES: dict[str, tuple[str, ...]] = {
    "search_r1": (
        "observation: FlashRAG wraps documents as '\\n\\n<information>\\n' + docs + '\\n</information>\\n\\n' "
        "(newlines inside the tags, last document's newline kept); Search-R1's generation.py writes "
        "'\\n\\n<information>' + docs.strip() + '</information>\\n\\n'",
        "question: FlashRAG does not strip the question or append '?'; Search-R1 does",
        "invalid action: FlashRAG ends the item with the raw output as prediction; Search-R1 appends its "
        "corrective message ('My previous action is invalid. ...') and goes on",
        "parsing: FlashRAG answers only when the turn ends with </answer> (or <|endoftext|>) and takes the "
        "last <answer> block of that turn, and searches the last <search> block, stripped; Search-R1 acts on "
        "the FIRST <search>/<answer> block of the turn and scores the last <answer> of the sequence",
        "turn limit: FlashRAG runs max_retrieval_num=5 generations and then gives 'No valid answer found'; "
        "Search-R1 runs max_turns=4 search turns and then one final turn",
        "each turn's output is .strip()-ed before the observation is appended (Search-R1 keeps it)",
        "stops include '</answer>\\n', '</answer>\\n\\n' and ' </search>' variants as separate strings",
    ),
    "r1_searcher": (
        "prompt: FlashRAG's ReasoningPipeline.user_prompt writes a literal backslash-n in "
        "'</think>\\\\n\\\\n<answer>'; R1-Searcher's eval_search_loacl.py has two real newlines",
        "prompt placement: FlashRAG's PromptTemplate wraps the prompt in the model's chat template when it "
        "has one; R1-Searcher uses the raw base-model prompt, never a chat template",
        "documents: FlashRAG formats '(i)Title: t Text: x'; R1-Searcher's corpus line is "
        "'title   text' (KILT 100-word split, id removed)",
        "observation: FlashRAG appends '\\n\\n<|begin_of_documents|>\\n' + docs + '\\n<|end_of_documents|>\\n\\n' "
        "(an extra newline before the closing tag); R1-Searcher has none",
        "query: FlashRAG searches the last query block, stripped; R1-Searcher takes the text after the last "
        "<|begin_of_query|>, removes quotes, '...' and turns tabs into spaces, and does not strip it",
        "turn limit: FlashRAG max_retrieval_num=5; R1-Searcher stops at the 10th generation (k == 9)",
        "no documents: FlashRAG writes nothing; R1-Searcher writes 'None'",
    ),
    "research": (
        "FlashRAG's main repository has no ReSearch port; ReSearch ships its own FlashRAG fork whose "
        "ReSearchPipeline is what this dialect follows (EOS ends the answer turn, \\boxed{} answers)",
    ),
    "rag_r1": (
        "FlashRAG has no RAG-R1 port; mode eval follows RAG-R1's evaluation/eval_multiquery.py, mode train its "
        "rag_r1/llm_agent/generation_mq.py",
    ),
    "prorag": ("FlashRAG has no ProRAG port; this dialect follows ProRAG's inference.py",),
    "harr": ("FlashRAG has no HARR port; this dialect follows HARR's generator.py search_r1_generate",),
}

# Search-R1's rollout has no stop strings (a turn runs to EOS or the token limit and is then
# cut); stopping at the first </search> gives the same text. </answer> cannot be a stop: a later
# </search> moves the cut past it (_postprocess_responses).
_SEARCH_R1_STOPS = ("</search>",)
# Search-R1's generation.py on every turn: cut, then the first block; EOS/length without one
# gets the corrective message; a final no-search turn after max_turns; the score reads the last
# <answer> of the sequence (qa_em).
_SEARCH_R1_LOOP: dict[str, Any] = dict(
    cut=P.search_r1_cut,
    drop_eos=True,  # generation.py decodes each turn with skip_special_tokens=True and re-encodes it
    on_eos="parse",
    on_length="parse",
    final_turn=True,
    answer_from="response",
    corrective=P.SEARCH_R1_CORRECTIVE,
    search_stops=_SEARCH_R1_STOPS,
    final_stops=_SEARCH_R1_STOPS,
)


def _register(name: str, extra_options: dict[str, Any] | None = None, **kw: Any) -> None:
    """Register the exact dialect ``name``: its template file (``configs/dialects/<name>.yaml``)
    with the protocol in ``kw`` (and per-mode protocols in ``kw["modes"]``)."""
    t = shipped_template(name)
    differences = t.get("differences") or {}
    if not isinstance(differences, dict):
        raise ValueError(f"configs/dialects/{name}.yaml: 'differences' maps a mode to a list")
    modes = kw.pop("modes", {})
    if modes and len({frozenset(o) for o in modes.values()}) != 1:
        raise ValueError(f"dialect {name!r}: every mode must set the same fields (switching must not leak one)")
    modes = {m: {**o, "differences": tuple(differences.get(m, ()))} for m, o in modes.items()}
    d = Dialect(
        name=name,
        system=t["system"],
        template=t["template"],
        base_template=t.get("base_template"),
        placement=t["placement"],
        question_mark=bool(t.get("question_mark", False)),
        source={**t["source"], "template_file": f"configs/dialects/{name}.yaml"},
        options={
            "flashrag_differences": FLASHRAG_DIFFERENCES.get(name, ()),
            "notes": tuple(t.get("notes", ())),
            **(extra_options or {}),
        },
        differences=tuple(differences.get(kw.get("mode", "single"), ())),
        modes=modes,
        **kw,
    )
    DIALECTS.register(name, d.with_mode(d.mode) if modes else d)


def _register_exact() -> None:
    _register(
        "search_r1",
        parse=P.search_r1_parse,
        observe=P.search_r1_observe,
        extract=P.last_answer,
        validate=P.search_r1_valid_sequence,
        answer_rule="the last <answer>...</answer> of the response, stripped (qa_em reads prompt + response "
        "and needs two: metric profile search_r1)",
        **_SEARCH_R1_LOOP,
    )
    _register(
        "rag_r1",
        parse=P.rag_r1_parse,
        observe=P.rag_r1_observe,
        extract=P.last_answer,
        validate=P.search_r1_valid_sequence,
        max_queries=3,
        doc_style="json",
        answer_rule="",
        search_stops=(),
        final_stops=(),
        mode="eval",
        modes={
            # evaluation/eval_multiquery.py
            "eval": dict(
                parse=P.rag_r1_eval_parse,
                observe=P.rag_r1_eval_observe,
                extract=P.rag_r1_eval_answer,
                validate=P.no_format_check,
                search_stops=("</search>",),
                final_stops=("</search>",),
                on_eos="end",
                on_length="parse",
                answer_from="response",
                prompt_answers_count=True,
                question_mark=False,
                cut=None,
                drop_eos=True,  # eval_multiquery.py decodes each turn (skip_special_tokens) and re-encodes
                observe_cut=None,  # eval_multiquery.py prints each document whole
                final_turn=False,
                corrective=None,
                answer_rule="the last <answer>...</answer> of prompt + response, unstripped (the prompt's "
                "example 'Beijing' when the response has none); EM only, no format check",
            ),
            # rag_r1/llm_agent/generation_mq.py (Search-R1's loop) and the training data's '?'
            "train": dict(
                parse=P.rag_r1_parse,
                observe=P.rag_r1_observe,
                observe_cut=P.rag_r1_observe_cut,
                extract=P.last_answer,
                validate=P.search_r1_valid_sequence,
                prompt_answers_count=False,
                question_mark=True,
                answer_rule="the last <answer>...</answer> of the response, stripped",
                **_SEARCH_R1_LOOP,
            ),
        },
    )
    _register(
        "research",
        parse=P.research_parse,
        observe=P.research_observe,
        extract=P.research_answer,
        validate=P.research_validate,
        search_stops=("</search>",),
        final_stops=(),
        obs_open="<result>",
        obs_close="</result>",
        boxed_answer=True,
        length_cut_answer="",
        answer_rule="the last \\boxed{} inside the first <answer>...</answer> of the response, read at EOS; "
        "'' after a token-limit cut",
    )
    r1 = shipped_template("r1_searcher")
    _register(
        "r1_searcher",
        observe=P.r1_searcher_observe,
        validate=P.r1_searcher_validate,
        query_open="<|begin_of_query|>",
        query_close="<|end_of_query|>",
        obs_open="<|begin_of_documents|>",
        obs_close="<|end_of_documents|>",
        rewrite=P.r1_searcher_rewrite,
        # Read by training.rewards.R1SearcherStage1: the stage-1 server's own two checks.
        extra_options={"stage1_checks": P.r1_searcher_stage1},
        parse=P.r1_searcher_parse,
        extract=P.r1_searcher_answer,
        search_stops=(),
        final_stops=(),
        mode="eval",
        modes={
            # evaluation/eval_search_loacl.py
            "eval": dict(
                trained_obs_prefix="",  # evaluation trains nothing
                parse=P.r1_searcher_parse,
                search_stops=("<|im_end|>", "<|endoftext|>", "<|end_of_query|>", "</answer>"),
                final_stops=("<|im_end|>", "<|endoftext|>", "<|end_of_query|>", "</answer>"),
                template=r1["template"],
                base_template=None,
                placement="raw",
                prompt_suffix="",
                no_answer="I don't know.",
                limit_label="many_retrieve",
                final_turn=False,
                answer_from="action",
                answer_rule="the answering turn's text between its last <answer> and </answer>, not stripped; "
                '"I don\'t know." without one',
            ),
            # OpenRLHF-RAG experience_maker.py + prompts_dataset.py (--apply_chat_template)
            "train": dict(
                # experience_maker.py:1264-1293 masks from '<|begin_of_documents|>\n' on
                trained_obs_prefix="\n\n",
                parse=P.r1_searcher_train_parse,
                search_stops=("<|end_of_query|>",),
                final_stops=("<|end_of_query|>",),
                template=r1["train_template"],
                base_template=r1["train_base_template"],
                placement="system",
                prompt_suffix="<think>",
                no_answer=None,
                limit_label="",
                # t == 8: the 9th generation is kept and the rollout ends (agent.max_turns 8)
                final_turn=True,
                answer_from="response",
                answer_rule="the reward server's: the text between the last <answer> and </answer> of the "
                "response, stripped",
            ),
        },
    )
    # HARR's own rollouts of its Search-R1 generator (generator.py search_r1_generate): the
    # frozen generator its retriever RL drives.
    _register(
        "harr",
        parse=P.harr_parse,
        observe=P.harr_observe,
        extract=P.last_answer,
        validate=P.no_format_check,
        search_stops=("</search>", "</answer>"),
        final_stops=("</search>", "</answer>"),
        corrective=P.HARR_NO_SEARCH,
        on_eos="parse",
        on_length="parse",
        final_turn=False,
        drop_eos=True,  # the next prompt is text (prompt += output_text), re-encoded by the server
        no_answer="None",  # str(response) of a rollout that never answered
        answer_rule="the last non-empty <answer>...</answer> of the answering turn, unstripped; 'None' without one",
    )
    _register(
        "prorag",
        parse=P.prorag_parse,
        observe=P.prorag_observe,
        extract=P.first_answer,
        validate=P.prorag_validate,
        search_stops=("</subquery>", "</subanswer>", "</answer>", "<|im_end|>"),
        final_stops=("</subquery>", "</subanswer>", "</answer>", "<|im_end|>"),
        corrective=P.PRORAG_QUERY_ERROR,
        continue_text=P.PRORAG_NEXT_STEP,
        on_eos="parse",
        on_length="parse",
        no_answer="",
        query_open="<subquery>",
        query_close="</subquery>",
        obs_open="<retrieval>",
        obs_close="</retrieval>",
        think_open="<step>",
        think_close="</step>",
        # Read by training.mcts: ProRAG's format_check of a step (prorag/prm/filter.py).
        extra_options={"step_check": P.prorag_step_ok},
        answer_rule="the answering turn's first <answer>...</answer>, stripped ('' without one); the "
        "reward reads the completion's first, tags case-insensitive",
    )


def _register_small() -> None:
    specs = {
        "research": dict(obs_open="<result>", obs_close="</result>", boxed_answer=True),
        "search_r1": {},
        "r1_searcher": dict(
            query_open="<|begin_of_query|>",
            query_close="<|end_of_query|>",
            obs_open="<|begin_of_documents|>",
            obs_close="<|end_of_documents|>",
        ),
        "rag_r1": dict(max_queries=3, doc_style="json"),
    }
    for system, tags in specs.items():
        probe = Dialect(
            name="", system="", template="", placement="user", parse=small.parse, observe=small.observe,
            extract=small.extract, validate=small.validate, search_stops=(), final_stops=(), raw_bos=False, **tags,
        )  # fmt: skip
        tag_values = {k: getattr(probe, k) for k in ("query_open", "query_close", "obs_open", "obs_close")}
        tag_values |= {k: getattr(probe, k) for k in ("answer_open", "answer_close", "think_open", "think_close")}
        text = small.instruction(system, tag_values, probe.max_queries) + "{shot}\n\nQuestion: {question}"
        name = f"{system}_small"
        DIALECTS.register(
            name,
            replace(
                probe,
                name=name,
                system=f"ours ({system} tags)",
                template=text,
                base_template=text + "\n",
                search_stops=(probe.query_close, probe.answer_close),
                final_stops=(probe.answer_close,),
                final_turn=True,  # ours: small models get one more turn to answer
                corrective=small.CORRECTIVE.replace("{obs_open}", probe.obs_open).replace(
                    "{obs_close}", probe.obs_close
                ),
                answer_rule="the last answer block of the response"
                + (", inside \\boxed{}" if probe.boxed_answer else ""),
                source={"wording": "ours (pipelines/dialects/small.py)"},
            ),
        )


_register_exact()
_register_small()


def get_dialect(name: str) -> Dialect:
    return DIALECTS.get(name)


def resolve_dialect(
    dialect: str | Dialect, variant: str = "exact", template: str | None = None, mode: str | None = None
) -> Dialect:
    """The dialect an agent runs: ``variant="small"`` picks ``<name>_small``; ``mode`` (``eval``
    or ``train``) picks a two-mode dialect's protocol (default: its registered one, ``eval``);
    ``template`` (a file) replaces the prompt template."""
    d = get_dialect(dialect) if isinstance(dialect, str) else dialect
    if mode is not None:
        if mode not in ("eval", "train"):
            raise ValueError(f"agent.mode must be 'eval' or 'train', not {mode!r}")
        d = d.with_mode(mode)
    if variant == "small" and not d.name.endswith("_small"):
        d = get_dialect(f"{d.name}_small")
    elif variant not in ("exact", "small"):
        raise ValueError(f"agent.variant must be 'exact' or 'small', not {variant!r}")
    return d.with_template(template) if template else d
