"""The :class:`Dialect` record, its prompt rendering, and prompt-template files.

A dialect is configuration: the template text (a data file under ``configs/dialects/``), where
the prompt sits, the stops, and four small functions (parse a turn, build an observation,
extract the answer, validate the format) chosen per system in its module (:mod:`.search_r1`, ...)
or :mod:`.small`. The agent loop calls only the methods here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from harness.config import read_yaml
from harness.types import Doc

ActionKind = Literal["search", "answer", "invalid", "continue", "end", "none"]
Placement = Literal["user", "system", "raw"]

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "configs" / "dialects"


@dataclass(frozen=True)
class Action:
    """What one model turn asks for.

    ``search`` (``queries``; an empty tuple means a search with nothing to look up, which the
    dialect answers without retrieval), ``answer`` (``answer``; ``None`` lets the final answer be
    extracted from the whole response), ``invalid`` (the dialect's corrective message follows, or
    the item ends when it has none), ``continue`` (the dialect's continuation text follows:
    ProRAG's next ``<step>``), ``end`` (the item ends without an answer), ``none`` (nothing
    recognisable; treated as ``invalid``).
    """

    kind: ActionKind
    queries: tuple[str, ...] = ()
    answer: str | None = None
    reason: str = ""
    label: str = ""  # the original's own name for how the item ended, where it records one


@dataclass(frozen=True)
class TurnEnd:
    """How a model turn ended, for the parser: ``eos`` (the model's end of sequence), ``length``
    (the token limit cut it), neither (a stop string, or a dialect's cut); ``context`` is the text
    before the turn, prompt included (RAG-R1's evaluation script reads its last query there)."""

    eos: bool = False
    length: bool = False
    context: str = ""


ParseFn = Callable[["Dialect", str, TurnEnd], Action]
ObserveFn = Callable[["Dialect", tuple[str, ...], list[list[Doc]]], str]
ExtractFn = Callable[["Dialect", str], "str | None"]
ValidateFn = Callable[["Dialect", str], tuple[bool, str]]
# A chat-template dialect's observation: (dialect, tokenizer, content, the end-of-turn text the
# model already emitted) -> the text appended after the generated turn (pipelines.dialects.tool_call).
ChatObservationFn = Callable[["Dialect", Any, str, str], str]


@dataclass(frozen=True)
class Dialect:
    """One agent protocol: prompt template and placement, stops, and the turn functions.

    ``template`` holds ``{question}`` (replaced literally, so braces such as ``\\boxed{}`` need no
    escaping). ``placement``: ``user`` (the template is the user message; without a chat template
    the text is the prompt as is), ``system`` (the template is the system message and the
    question the user message; without a chat template ``base_template`` is the raw prompt) or
    ``raw`` (the template is the prompt, never wrapped in a chat template).
    ``search_stops`` end a turn that may search; ``final_stops`` end the last, no-search turn
    (EOS always ends a turn). A matched stop string stays in the text (the backends keep it,
    and every original re-appends it). ``corrective`` follows an invalid action (``None``: the
    item ends); ``continue_text`` follows a ``continue`` action.

    How a turn ends and what the answer is, per original (each system's module):

    - ``cut(text)``: where the original cuts a generated turn (Search-R1's
      ``_postprocess_responses``); ``None`` keeps it whole. The tokens after the cut are dropped.
    - ``rewrite(text, action)``: the text the original continues from instead of the turn's own
      (R1-Searcher strips it before ``<|end_of_query|>``); the turn is then re-encoded.
    - ``drop_eos``: a turn that ended on EOS keeps its text but not the EOS token: the original
      decodes each turn without special tokens and re-encodes it (Search-R1's and RAG-R1's
      ``generation.py``), so the EOS is neither trained nor in the next turn's context.
    - ``on_eos`` / ``on_length``: ``"end"`` ends the item on a turn that ended on EOS / was cut by
      the token limit without answering; ``"parse"`` lets the parsed action decide (corrective
      message, continuation, or a search).
    - ``final_turn``: one more turn without search after ``max_turns`` (Search-R1's
      ``generation.py``); no other original has one. ``AgentConfig.final_turn`` overrides it.
    - ``answer_from``: ``"action"`` (the answering turn's answer; without one ``no_answer`` when
      set, else the extraction from the response) or ``"response"`` (always the extraction from
      the response, or from prompt + response when ``prompt_answers_count``).
    - ``length_cut_answer``: the prediction of an item that ended on a token-limit cut (ReSearch
      predicts ``""``), whatever the response holds.
    - ``limit_label``: the original's own name for the turn limit (R1-Searcher's ``many_retrieve``),
      recorded as ``metadata["original_finish"]`` with the labels the parser gives.
    - ``mode`` / ``modes``: a dialect whose evaluation and training code disagree has one set of
      field overrides per mode (:meth:`with_mode`); ``differences`` lists what is known to differ
      from the original (per mode in ``modes``).
    """

    name: str
    system: str
    template: str
    placement: Placement
    parse: ParseFn
    observe: ObserveFn
    extract: ExtractFn
    validate: ValidateFn
    search_stops: tuple[str, ...]
    final_stops: tuple[str, ...]
    base_template: str | None = None
    prompt_suffix: str = ""  # text after the chat template's generation prompt (R1-Searcher's training "<think>")
    question_mark: bool = False
    corrective: str | None = None
    continue_text: str | None = None
    cut: Callable[[str], int | None] | None = None
    rewrite: Callable[[str, Action], str | None] | None = None
    drop_eos: bool = False
    # The observation with each query's document block cut by the agent's max_query_doc_tokens as
    # the original cuts it (``fn(d, queries, results, cut)``, ``cut`` a text → its first tokens);
    # None: the agent caps the documents' texts before ``observe`` (RAG-R1 train mode cuts blocks).
    observe_cut: Callable[..., str] | None = None
    # The start of a search's observation the original trains, its mask starting after it
    # (R1-Searcher's experience_maker.py masks from '<|begin_of_documents|>': the '\n\n' it inserts
    # after '<|end_of_query|>' is trained); kept as a model segment without log-probs.
    trained_obs_prefix: str = ""
    on_eos: Literal["end", "parse"] = "end"
    on_length: Literal["end", "parse"] = "end"
    final_turn: bool = False
    answer_from: Literal["action", "response"] = "action"
    prompt_answers_count: bool = False
    no_answer: str | None = None
    length_cut_answer: str | None = None
    limit_label: str = ""
    mode: str = "single"
    modes: dict[str, dict[str, Any]] = field(default_factory=dict)
    differences: tuple[str, ...] = ()
    answer_rule: str = ""  # how the answer is extracted, in words (shown by `harness prompt`)
    source: dict[str, Any] = field(default_factory=dict)
    # Tags, for demonstrations and for the observation/answer blocks the functions build.
    query_open: str = "<search>"
    query_close: str = "</search>"
    obs_open: str = "<information>"
    obs_close: str = "</information>"
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"
    think_open: str = "<think>"
    think_close: str = "</think>"
    boxed_answer: bool = False
    raw_bos: bool = True  # a raw prompt is encoded with the tokenizer's special tokens (BOS)
    max_queries: int = 1
    doc_style: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    # Chat-template dialects (tool_call): the tools given to the chat template (``tools=``), a
    # chat template file replacing the tokenizer's own, and the observation as the template's
    # rendering of a tool message appended after the generated turn (never re-rendered).
    tools: Callable[[Dialect], list[dict[str, Any]]] | None = None
    chat_template: str | None = None
    chat_observation: ChatObservationFn | None = None

    # ---- prompt ----------------------------------------------------------------------------
    def normalize_question(self, question: str) -> str:
        """Search-R1 and RAG-R1 strip the question and end it with a question mark."""
        if not self.question_mark:
            return question
        q = question.strip()
        return q if q.endswith("?") else q + "?"

    def messages(self, question: str, few_shot: bool = False) -> list[dict[str, str]] | None:
        """The chat messages, or ``None`` for a raw prompt."""
        q = self.normalize_question(question)
        if self.placement == "user":
            return [{"role": "user", "content": self._fill(self.template, q, few_shot)}]
        if self.placement == "system":
            return [
                {"role": "system", "content": self._fill(self.template, q, few_shot)},
                {"role": "user", "content": q},
            ]
        return None

    def raw_text(self, question: str, few_shot: bool = False) -> str:
        """The prompt when no chat template is applied (``base_template`` when the dialect has one)."""
        if self.placement == "system" and self.base_template is None:
            raise ValueError(f"dialect {self.name!r} has no base (no chat template) form")
        template = self.base_template if self.base_template is not None else self.template
        return self._fill(template, self.normalize_question(question), few_shot)

    def _fill(self, template: str, question: str, few_shot: bool) -> str:
        """``{question}`` and the optional ``{shot}`` slot (the demonstration goes there, or
        before everything when the template has no slot)."""
        shot = "\n\nExample:\n" + self.demonstration().rstrip("\n") if few_shot else ""
        if "{shot}" in template:
            return template.replace("{shot}", shot).replace("{question}", question)
        return (shot.lstrip("\n") + "\n\n" if shot else "") + template.replace("{question}", question)

    def uses_chat_template(self, tokenizer: Any, chat: bool = True) -> bool:
        """Whether the prompt goes through a chat template (``tokenizer``'s, or the dialect's
        :attr:`chat_template` file); never for a raw prompt."""
        has = self.chat_template is not None or bool(getattr(tokenizer, "chat_template", None))
        return self.placement != "raw" and chat and has

    def chat_kwargs(self) -> dict[str, Any]:
        """What ``apply_chat_template`` gets beyond the messages: the dialect's tools and its chat
        template file (nothing for the tag dialects)."""
        kw: dict[str, Any] = {}
        if self.tools is not None:
            kw["tools"] = self.tools(self)
        if self.chat_template is not None:
            kw["chat_template"] = read_chat_template(self.chat_template)
        return kw

    def apply_chat_template(self, tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        """``messages`` rendered by the chat template this dialect uses, as text."""
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **self.chat_kwargs()
        )

    def with_chat_template(self, path: str | None) -> Dialect:
        """This dialect with the chat template file ``path`` (``None``: the tokenizer's own)."""
        if path is not None:
            read_chat_template(path)  # a missing file fails here, not at the first prompt
        return replace(self, chat_template=path)

    def chat_turns(self, tokenizer: Any, turns: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Written (role, text) turns as the agent feeds them under a chat-template dialect: each
        model turn ends with the tokenizer's EOS (the model ends its message so), each observation
        is the template's tool message after it. Other dialects' turns are returned as they are."""
        if self.chat_observation is None:
            return turns
        eos = getattr(tokenizer, "eos_token", None) or ""
        out: list[tuple[str, str]] = []
        for role, text in turns:
            if role == "model":
                out.append((role, text if text.endswith(eos) else text + eos))
            else:
                out.append((role, self.chat_observation(self, tokenizer, text, eos)))
        return out

    def render(self, question: str, tokenizer: Any = None, chat: bool = True, few_shot: bool = False) -> str:
        """The exact prompt string: the chat template applied when the dialect puts the prompt
        in messages, ``chat`` is on and ``tokenizer`` has a chat template; else the raw form."""
        if tokenizer is not None and self.uses_chat_template(tokenizer, chat):
            messages = self.messages(question, few_shot)
            if self.tools is None and self.chat_template is None:  # the tag dialects, as they always were
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            else:
                text = self.apply_chat_template(tokenizer, messages, True)
            return text + self.prompt_suffix
        return self.raw_text(question, few_shot)

    def prompt_ids(self, tokenizer: Any, question: str, chat: bool, few_shot: bool = False) -> list[int]:
        """Token ids of :meth:`render`. A chat template writes its own special tokens; a raw
        prompt gets the tokenizer's own (a BOS where it adds one), as the originals' vLLM / HF
        ``encode`` calls give it, unless ``raw_bos`` is off (our small variants)."""
        text = self.render(question, tokenizer, chat, few_shot)
        add = self.raw_bos and not self.uses_chat_template(tokenizer, chat)
        return list(tokenizer.encode(text, add_special_tokens=add))

    def demonstration(self) -> str:
        """A one-shot worked example in this dialect's own tags (for small models that need it)."""
        docs = [Doc("ex", "Paris", "Paris is the capital and largest city of France.")]
        answer = "\\boxed{Paris}" if self.boxed_answer else "Paris"
        return (
            "Question: Which city is the capital of the country where the Eiffel Tower stands?\n"
            f"{self.think_open} The Eiffel Tower is in France; I need the capital of France. {self.think_close}\n"
            f"{self.query_open} capital of France {self.query_close}"
            + self.observation_text(("capital of France",), [docs])
            + f"{self.think_open} The capital of France is Paris. {self.think_close}\n"
            f"{self.answer_open} {answer} {self.answer_close}\n\n"
        )

    def with_template(self, path: str | Path) -> Dialect:
        """This dialect with the template (and placement, if the file says) of ``path``."""
        data = load_template_file(str(path))
        keep = {k: data[k] for k in ("template", "base_template", "placement", "question_mark") if k in data}
        keep.setdefault("base_template", None)  # the old base form belongs to the old template
        out = replace(self, **keep, source={**self.source, "template_file": str(path)})
        if isinstance(data.get("options"), dict):  # e.g. tool_call's answer_style
            out = replace(out, options={**out.options, **data["options"]})
        # The question goes in the template, except for a system prompt (the user turn holds it).
        if out.placement != "system" and "{question}" not in out.template:
            raise ValueError(f"{path}: the template has no {{question}} field")
        return out

    # ---- turns -----------------------------------------------------------------------------
    def stops(self, allow_search: bool = True) -> tuple[str, ...]:
        """Stop strings for a turn that may search, or for the final no-search turn."""
        return self.search_stops if allow_search else self.final_stops

    def parse_action(self, turn_text: str, eos: bool = False, length: bool = False, context: str = "") -> Action:
        """What the model's latest turn asks for (``eos``: the turn ended on EOS; ``length``: the
        token limit cut it; ``context``: the text before it)."""
        return self.parse(self, turn_text, TurnEnd(eos, length, context))

    def with_mode(self, mode: str) -> Dialect:
        """This dialect in ``mode`` (``eval`` or ``train``); a one-mode dialect is returned as is
        (its one protocol serves both)."""
        if not self.modes:
            return self
        if mode not in self.modes:
            raise ValueError(f"dialect {self.name!r} has modes {sorted(self.modes)}, not {mode!r}")
        return replace(self, mode=mode, **self.modes[mode])

    def observation_text(self, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
        """The exact text inserted after a search (loss mask 0)."""
        return self.observe(self, queries, results)

    def corrective_text(self, reason: str) -> str | None:
        """The text inserted after an invalid action, or ``None`` when the item ends."""
        if self.corrective is None:
            return None
        return self.corrective.format(
            reason=reason,
            query_open=self.query_open,
            query_close=self.query_close,
            obs_open=self.obs_open,
            obs_close=self.obs_close,
            answer_open=self.answer_open,
            answer_close=self.answer_close,
        )

    def extract_answer(self, response_text: str) -> str | None:
        """The final answer, from the RESPONSE only (never the prompt's example answer)."""
        return self.extract(self, response_text)

    def validate_format(self, response_text: str) -> tuple[bool, str]:
        """The format check of the system's own reward, on the response. Returns (ok, reason)."""
        return self.validate(self, response_text)


def closing_brace(text: str, start: int, depth: int = 0) -> int | None:
    """The index of the ``}`` that brings the brace depth back to 0, scanning ``text`` from
    ``start`` with ``depth`` braces already open; None when the braces never close."""
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return None


def doc_contents(doc: Doc) -> str:
    """A document as a FlashRAG corpus ``contents`` string: first line the title, then the text."""
    if not doc.title:
        return doc.text
    if not doc.text:
        return doc.title
    return f"{doc.title}\n{doc.text}"


def title_and_text(doc: Doc) -> tuple[str, str]:
    """The originals' split of ``contents``: the first line, and the rest joined by newlines."""
    title, _, text = doc_contents(doc).partition("\n")
    return title, text


@functools.lru_cache(maxsize=64)
def load_template_file(path: str) -> dict[str, Any]:
    """Read a template file: YAML with a ``template`` key (and optionally ``placement``,
    ``base_template``, ``question_mark``, ``source``), or any other text file whose whole
    content is the template. The template must contain ``{question}``."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"template file not found: {path}")
    if p.suffix in (".yaml", ".yml"):
        data = read_yaml(p)
        if not isinstance(data, dict) or not isinstance(data.get("template"), str):
            raise ValueError(f"{path}: a YAML template file needs a string 'template' key")
    else:
        data = {"template": p.read_text(encoding="utf-8")}
    placement = data.get("placement")
    if placement is not None and placement not in ("user", "system", "raw"):
        raise ValueError(f"{path}: placement must be user, system or raw, not {placement!r}")
    return data


CHAT_TEMPLATE_DIR = TEMPLATE_DIR.parent / "chat_templates"


def chat_template_file(path: str) -> Path:
    """A chat template file: ``path`` as given, else relative to the checkout
    (``configs/chat_templates/qwen2.5.jinja``), else a name under ``configs/chat_templates/``."""
    for p in (Path(path), TEMPLATE_DIR.parents[1] / path, CHAT_TEMPLATE_DIR / path):
        if p.is_file():
            return p
    shipped = ", ".join(sorted(p.name for p in CHAT_TEMPLATE_DIR.glob("*.jinja")))
    raise FileNotFoundError(f"chat template not found: {path} (shipped: {shipped})")


@functools.lru_cache(maxsize=16)
def read_chat_template(path: str) -> str:
    """The text of the chat template file :func:`chat_template_file` finds for ``path``."""
    return chat_template_file(path).read_text(encoding="utf-8")


def shipped_template(name: str) -> dict[str, Any]:
    """The template file shipped for dialect ``name`` (``configs/dialects/NAME.yaml``)."""
    return load_template_file(str(TEMPLATE_DIR / f"{name}.yaml"))
