"""``tool_call``: a search agent in the model's own tool-calling format (no paper's tag protocol).

Today's instruct models (Qwen2.5/Qwen3, Llama 3.1+) call tools in their chat template's own
format and read the result as a ``tool`` message. This dialect gives the chat template a
``search`` tool schema (``tools=`` of ``apply_chat_template``; the system text is the dialect's
template, which a config may replace), reads the calls the families write, and appends each result
as the template's rendering of a ``tool`` message:

- Calls: Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and Llama 3.1's
  bare JSON message ``{"name": ..., "parameters": {...}}``. A malformed call (bad JSON, an unknown
  tool, a missing query, several calls in one turn) gets a corrective ``tool`` message, never a
  crash; a turn without a call is the final message, and the answer is read from it
  (``answer_style``: ``marker`` "Answer: ...", ``tag`` ``<answer>``, ``tool`` an ``answer`` call,
  or ``text``: the whole message).
- Continuous tokens: a turn runs to the model's end of turn (EOS; no stop strings), its generated
  ids are kept as they are, and the observation is only the text the template writes after an
  assistant message when a tool message follows (:func:`tool_observation`). History is never
  re-rendered, so a template that rewrites past turns (Qwen3 drops earlier ``<think>`` blocks)
  cannot make the trained tokens differ from the generated ones.
"""

from __future__ import annotations

import json
import re
from typing import Any

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd
from pipelines.dialects.protocols import search_r1_docs
from pipelines.dialects.system import SynthTurns, System, register

ANSWER_STYLES = ("marker", "tag", "tool", "text")

SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the knowledge source for passages about a query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look up"}},
            "required": ["query"],
        },
    },
}
ANSWER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "answer",
        "description": "Give the final, short answer to the question.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "the short answer"}},
            "required": ["answer"],
        },
    },
}

# A stand-in assistant message: the observation is what the template writes after it.
_SENTINEL = "HARNESS-TOOL-CALL-TURN-7f3a"
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)


class CallError(ValueError):
    """A tool call the agent cannot run; the message is the corrective tool message's reason."""


def answer_style(d: Dialect) -> str:
    style = d.options.get("answer_style", "marker")
    if style not in ANSWER_STYLES:
        raise ValueError(f"tool_call answer_style must be one of {', '.join(ANSWER_STYLES)}, not {style!r}")
    return style


def tool_schemas(d: Dialect) -> list[dict[str, Any]]:
    """The tools the chat template lists: ``search``, and ``answer`` when the answer is a call."""
    return [SEARCH_TOOL, ANSWER_TOOL] if answer_style(d) == "tool" else [SEARCH_TOOL]


def raw_calls(text: str) -> list[str]:
    """The tool calls' JSON texts in a turn: every ``<tool_call>`` block (an unclosed one runs to
    the end), else the whole message when it is a bare JSON object (Llama 3.1, after an optional
    ``<|python_tag|>``). Reasoning in ``<think>`` is not searched."""
    body = _THINK.sub("", text)
    blocks = _HERMES.findall(body)
    if blocks:
        return [b.strip() for b in blocks]
    bare = body.strip().removeprefix("<|python_tag|>").strip()
    return [bare] if bare.startswith("{") else []


def parse_call(raw: str) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of one call's JSON (``arguments`` or Llama's ``parameters``; a JSON
    string of arguments is read too); :class:`CallError` says what is wrong."""
    try:
        call, end = json.JSONDecoder().raw_decode(raw)
    except json.JSONDecodeError as e:
        raise CallError(f"the tool call is not valid JSON ({e.msg} at character {e.pos})") from None
    rest = raw[end:].strip().lstrip(";").strip()
    if rest.startswith("{"):
        raise CallError("several tool calls in one turn; call one tool at a time")
    if rest:
        raise CallError("text after the tool call's JSON object")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise CallError('a tool call is a JSON object {"name": ..., "arguments": {...}}')
    args = call.get("arguments", call.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise CallError("the tool call's arguments are not a JSON object") from None
    if not isinstance(args, dict):
        raise CallError(f"the {call['name']!r} call has no arguments object")
    return call["name"], args


def _string_arg(name: str, args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise CallError(f"the {name} call needs a non-empty string argument {key!r}")
    return value.strip()


def tool_call_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """One call: ``search`` (its ``query``) or, with ``answer_style: tool``, ``answer``; no call:
    the final message (its answer by the style); anything else: invalid, with the reason the
    corrective tool message gives the model."""
    style = answer_style(d)
    calls = raw_calls(text)
    if not calls:
        if style == "tool":
            return Action("invalid", reason="no tool call; call search to look something up, or answer to finish")
        return Action("answer", answer=final_answer(d, text))
    if len(calls) > 1:
        return Action("invalid", reason="several tool calls in one turn; call one tool at a time")
    try:
        name, args = parse_call(calls[0])
        names = [t["function"]["name"] for t in tool_schemas(d)]
        if name not in names:
            raise CallError(f"unknown tool {name!r}; the tools are {', '.join(names)}")
        if name == "answer":
            return Action("answer", answer=_string_arg(name, args, "answer"))
        return Action("search", queries=(_string_arg(name, args, "query"),))
    except CallError as e:
        return Action("invalid", reason=str(e))


def final_answer(d: Dialect, message: str) -> str | None:
    """The answer in a final assistant message, by ``answer_style``: the text after the last
    marker (``answer_marker``, default ``Answer:``) up to the line's end, the last ``<answer>``
    block, or the whole message; reasoning in ``<think>`` is never the answer."""
    style, body = answer_style(d), _THINK.sub("", message)
    if style == "marker":
        marker = d.options.get("answer_marker", "Answer:")
        at = body.rfind(marker)
        return body[at + len(marker) :].strip().split("\n")[0].strip() if at >= 0 else None
    if style == "tag":
        found = re.findall(r"<answer>(.*?)</answer>", body, flags=re.DOTALL)
        return found[-1].strip() if found else None
    if style == "text":
        return body.strip() or None
    return None  # "tool": only an answer call answers


def tool_call_extract(d: Dialect, response: str) -> str | None:
    """The answer read from a whole response (the agent's fallback when no turn answered): the
    last marker / ``<answer>`` block, or the last ``answer`` call; ``text`` style has no way to
    tell the final message apart in the joined response, so ``None``."""
    if answer_style(d) != "tool":
        return final_answer(d, response) if answer_style(d) != "text" else None
    for raw in reversed(raw_calls(response) or []):
        try:
            name, args = parse_call(raw)
        except CallError:
            continue
        if name == "answer" and isinstance(args.get("answer"), str):
            return args["answer"].strip()
    return None


def tool_call_validate(d: Dialect, response: str) -> tuple[bool, str]:
    """A response is well formed when it ends with an answer its style can read."""
    if answer_style(d) == "text":
        return True, "text answers: every final message is an answer"
    found = tool_call_extract(d, response)
    return (True, "answer found") if found is not None else (False, f"no answer ({answer_style(d)} style)")


def tool_call_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    """The ``tool`` message's content: the passages, one ``Doc i(Title: ...) text`` line each."""
    return search_r1_docs(results[0] if results else []).strip() or "No results."


def tool_observation(d: Dialect, tokenizer: Any, content: str, emitted_end: str = "") -> str:
    """The text appended after a generated assistant turn: what the chat template writes after an
    assistant message when a tool message with ``content`` follows, generation prompt included,
    less ``emitted_end`` (the end-of-turn token the model already generated, e.g. ``<|im_end|>``).

    It is read off one rendering of [user, assistant(stand-in), tool(content)]: everything after
    the stand-in's text. Only the new message's wrapping comes from the template; the generated
    history is never rendered, so a template that rewrites past assistant turns (Qwen3's drops
    their ``<think>``) changes nothing here. A template whose assistant end-of-turn text does not
    start with the model's EOS (the turn ended otherwise) gets the whole end-of-turn text."""
    messages = [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": _SENTINEL},
        {"role": "tool", "name": "search", "content": content},
    ]
    text = d.apply_chat_template(tokenizer, messages, True)
    at = text.rfind(_SENTINEL)
    if at < 0:
        raise ValueError("the chat template does not write an assistant message's content as given")
    tail = text[at + len(_SENTINEL) :]
    return tail[len(emitted_end) :] if emitted_end and tail.startswith(emitted_end) else tail


def _inner(block: str, open_tag: str, close_tag: str) -> str:
    return block.removeprefix(open_tag).removesuffix(close_tag).strip()


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as Qwen2.5's template writes one (``<tool_call>\\n{json}\\n</tool_call>``)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>"


def synth_search_turn(d: Dialect, lead: str, query_block: str) -> str:
    """A synthesized search turn: the reasoning as plain text, then one Hermes-style call."""
    return f"{lead}\n{hermes_call('search', {'query': _inner(query_block, d.query_open, d.query_close)})}"


def synth_final_turn(d: Dialect, lead: str, answer_block: str) -> str:
    """A synthesized final message: the reasoning, then the answer as the style reads it."""
    answer = _inner(answer_block, d.answer_open, d.answer_close)
    style = answer_style(d)
    if style == "tool":
        return f"{lead}\n{hermes_call('answer', {'answer': answer})}"
    if style == "tag":
        return f"{lead}\n<answer>{answer}</answer>"
    if style == "marker":
        return f"{lead}\n{d.options.get('answer_marker', 'Answer:')} {answer}"
    return answer


SYSTEM = System(
    name="tool_call",
    profile="default",
    reward="em",
    configs=(
        "configs/dialects/tool_call.yaml",
        "configs/methods/tool_call.yaml",
        "configs/replicate/tool_call.yaml",
        "configs/train/demo/tool_call_grpo.yaml",
    ),
    flashrag_differences=("FlashRAG has no tool-calling agent; its pipelines prompt with text templates",),
    turns=SynthTurns(search=synth_search_turn, final=synth_final_turn),
)

register(
    SYSTEM,
    extra_options={"answer_style": "marker", "answer_marker": "Answer:"},
    parse=tool_call_parse,
    observe=tool_call_observe,
    extract=tool_call_extract,
    validate=tool_call_validate,
    tools=tool_schemas,
    chat_observation=tool_observation,
    # No stop strings: a turn runs to the model's own end of turn, which is trained (the model
    # ends a tool-call message itself) and followed by the tool message.
    search_stops=(),
    final_stops=(),
    on_eos="parse",
    corrective="Error: {reason}.",
    answer_rule="the final assistant message (no tool call): the text after its last 'Answer:' "
    "(answer_style: marker; or tag: <answer>, tool: an answer call, text: the whole message)",
)
