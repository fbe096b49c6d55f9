"""The tool_call dialect (pipelines/dialects/tool_call.py): its parser's edge cases, answer
styles, the released chat templates it ships, and continuous tokens: the ids the agent trains on
are the ids the backend generated, also under a template that drops past <think> blocks."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from harness.backends.scripted import ScriptedBackend
from harness.models import load_tokenizer
from harness.retrieval.memory import InMemoryRetriever
from harness.types import Doc, Example
from pipelines.dialects import get_dialect
from pipelines.dialects.inspect import describe
from pipelines.dialects.tool_call import tool_observation
from pipelines.search_agent import AgentConfig, SearchAgent

DOCS = [Doc("d1", "Eddavik", "Mira Solberg founded Eddavik."), Doc("d2", "Lunne", "The Lunne is a river.")]
CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Eddavik founder"}}\n</tool_call>'
LLAMA_CALL = '{"name": "search", "parameters": {"query": "Eddavik founder"}}'

# A tiny Qwen3-like template (ours, for this test): ChatML, and every assistant message but the
# last loses its <think> block when the conversation is rendered, as Qwen3's template does.
DROPS_THINK = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and not loop.last and '</think>' in m.content -%}"
    "{{- '<|im_start|>assistant\\n' + m.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


def dialect(**options):
    d = get_dialect("tool_call")
    return replace(d, options={**d.options, **options}) if options else d


def parse(text, **options):
    return dialect(**options).parse_action(text, eos=True)


# ---- the parser ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, reason",
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}}', None),  # unclosed but whole: runs
        ('<tool_call>{"name": "lookup", "arguments": {"query": "x"}}</tool_call>', "unknown tool 'lookup'"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "non-empty string argument 'query'"),
        ('<tool_call>{"name": "search", "arguments": {"query": "  "}}</tool_call>', "non-empty string"),
        ('<tool_call>{"name": "search"}</tool_call>', "has no arguments object"),
        ('<tool_call>["search"]</tool_call>', "is a JSON object"),
        (CALL + "\n" + CALL, "several tool calls"),
        (LLAMA_CALL + "; " + LLAMA_CALL, "several tool calls"),
        (LLAMA_CALL + " and then more", "text after"),
        ('{"name": "search", "parameters": "not json"}', "not a JSON object"),
    ],
)
def test_a_call_the_agent_cannot_run_is_invalid_with_a_reason(text, reason):
    action = parse(text)
    if reason is None:
        assert action.kind == "search" and action.queries == ("x",)
    else:
        assert action.kind == "invalid" and reason in action.reason, action


def test_both_families_calls_and_string_arguments_parse():
    assert parse(CALL).queries == ("Eddavik founder",)
    assert parse(LLAMA_CALL).queries == ("Eddavik founder",)
    args = json.dumps(json.dumps({"query": "q"}))  # arguments given as a JSON string
    assert parse(f'<tool_call>{{"name": "search", "arguments": {args}}}</tool_call>').queries == ("q",)
    # a call mentioned inside the reasoning is not a call
    assert parse("<think>maybe <tool_call>x</tool_call></think>\nAnswer: A").answer == "A"


@pytest.mark.parametrize(
    "style, final, answer",
    [
        ("marker", "It is her.\nAnswer: Mira Solberg\n", "Mira Solberg"),
        ("marker", "I am not sure.", None),
        ("tag", "So <answer> Mira Solberg </answer>", "Mira Solberg"),
        ("text", "<think>hm</think> Mira Solberg ", "Mira Solberg"),
    ],
)
def test_the_answer_comes_from_the_final_message_by_style(style, final, answer):
    action = parse(final, answer_style=style)
    assert action.kind == "answer" and action.answer == answer


def test_the_answer_tool_style_lists_the_tool_and_needs_a_call():
    d = dialect(answer_style="tool")
    assert [t["function"]["name"] for t in d.tools(d)] == ["search", "answer"]
    call = '<tool_call>{"name": "answer", "arguments": {"answer": "Mira"}}</tool_call>'
    assert d.parse_action(call, eos=True).answer == "Mira"
    assert d.parse_action("Mira", eos=True).kind == "invalid"
    assert d.extract_answer(CALL + "\n...\n" + call) == "Mira"
    assert d.validate_format("no call")[0] is False
    with pytest.raises(ValueError, match="answer_style"):
        dialect(answer_style="boxed").parse_action("x", eos=True)


# ---- templates and observations -----------------------------------------------------------------
@pytest.mark.parametrize("template", ["qwen2.5.jinja", "qwen3.jinja", "llama3.1.jinja", "smollm2_tools.jinja"])
def test_the_prompt_lists_the_search_tool_in_each_template(tok, template):
    d = get_dialect("tool_call").with_chat_template(template)
    text = d.render("who founded Eddavik", tok)
    assert '"name": "search"' in text and "who founded Eddavik" in text and d.system.startswith("tool")
    assert text.endswith(("<|im_start|>assistant\n", "<|start_header_id|>assistant<|end_header_id|>\n\n"))


def test_a_shipped_template_of_a_released_model_cites_its_source():
    from pipelines.dialects.base import CHAT_TEMPLATE_DIR

    for path in CHAT_TEMPLATE_DIR.glob("*.jinja"):
        head = path.read_text(encoding="utf-8").split("-#}")[0]
        assert "huggingface/huggingface.js" in head or "OURS" in head, path.name
    with pytest.raises(FileNotFoundError, match="qwen2.5.jinja"):
        get_dialect("tool_call").with_chat_template("nope.jinja")


@pytest.mark.parametrize("template", ["qwen2.5.jinja", "llama3.1.jinja", "smollm2_tools.jinja"])
def test_the_observation_is_what_the_template_writes_after_the_real_turn(tok, template):
    # Rendering the real conversation [system, user, assistant(turn), tool] ends with exactly the
    # observation (for templates that render history as given); the turn's text precedes it.
    d = get_dialect("tool_call").with_chat_template(template)
    turn = LLAMA_CALL if template.startswith("llama") else CALL
    content = "Doc 1(Title: Eddavik) Mira Solberg founded Eddavik."
    msgs = [*d.messages("q"), {"role": "assistant", "content": turn}, {"role": "tool", "content": content}]
    full = d.apply_chat_template(tok, msgs, True)
    obs = tool_observation(d, tok, content)
    assert full.endswith(obs) and full[: -len(obs)].endswith(turn)
    eos = "<|eot_id|>" if template.startswith("llama") else "<|im_end|>"
    assert obs.startswith(eos) and tool_observation(d, tok, content, eos) == obs[len(eos) :]


# ---- the agent: continuous tokens ---------------------------------------------------------------
class Recording(ScriptedBackend):
    """The scripted backend, keeping what each request was given and what it generated."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.requests: list[tuple[list[int], list[int]]] = []

    async def agenerate(self, input_ids, params):
        comp = await super().agenerate(input_ids, params)
        self.requests.append((list(input_ids), list(comp.token_ids)))
        return comp


def run(tok, turns, template):
    backend = Recording([{"match": "Eddavik", "turns": turns}], tokenizer=tok)
    cfg = AgentConfig(chat_template=template, max_turns=4, max_new_tokens=128)
    agent = SearchAgent(backend, InMemoryRetriever(DOCS), "tool_call", cfg)
    return agent, backend, asyncio.run(agent.arun(Example("e1", "who founded Eddavik", ["Mira Solberg"])))


@pytest.mark.parametrize("template", ["qwen2.5.jinja", "qwen3.jinja", "drops_think"])
def test_trained_ids_are_the_generated_ids_even_when_the_template_drops_past_thinking(tok, tmp_path, template):
    path = template
    if template == "drops_think":
        path = str(tmp_path / "drops_think.jinja")
        (tmp_path / "drops_think.jinja").write_text(DROPS_THINK, encoding="utf-8")
    first = "<think>I need who founded Eddavik.</think>\n" + CALL
    _, backend, traj = run(tok, [first, "<think>It says Mira.</think>\nAnswer: Mira Solberg"], path)
    assert traj.finish_reason == "answer" and traj.prediction == "Mira Solberg" and traj.error is None
    model = [s.token_ids for s in traj.segments if s.role == "model"]
    assert model == [gen for _, gen in backend.requests]  # trained = generated, turn by turn
    ids = [t for s in traj.segments for t in s.token_ids]
    last_in, last_out = backend.requests[-1]
    assert ids == last_in + last_out  # the context each turn saw is the segments, nothing re-rendered
    # The first turn's reasoning is still in the trained ids. Re-rendering the conversation would
    # have changed the turn: the test template drops its <think> block, Qwen3's re-spaces it
    # ("<think>\n...\n</think>\n\n"); only Qwen2.5's writes it back as generated.
    think_ids = tok.encode("I need who founded Eddavik.", add_special_tokens=False)
    assert _contains(ids, think_ids)
    d = get_dialect("tool_call").with_chat_template(path)
    obs = [s.text for s in traj.segments if s.role == "observation"][0]
    content = obs.split("<tool_response>\n")[1].split("\n</tool_response>")[0]
    rerendered = d.apply_chat_template(
        tok,
        [*d.messages(traj.question), {"role": "assistant", "content": first}, {"role": "tool", "content": content}],
        True,
    )
    assert (first in rerendered) is (template == "qwen2.5.jinja")
    assert ("I need who founded Eddavik." in rerendered) is (template != "drops_think")
    # the model segments end with the EOS the model generated, and the observation does not repeat it
    assert model[0][-1] == tok.eos_token_id and not obs.startswith("<|im_end|>")


def _contains(seq, sub):
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_a_malformed_call_gets_a_corrective_tool_message_and_the_item_goes_on(tok):
    bad = '<tool_call>{"name": "search", "arguments": {"query": "Eddavik"}</tool_call>'
    unknown = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
    _, _, traj = run(tok, [bad, unknown, CALL, "Answer: Mira"], "qwen2.5.jinja")
    obs = [s.text for s in traj.segments if s.role == "observation"]
    assert "Error: the tool call is not valid JSON" in obs[0] and "<tool_response>" in obs[0]
    assert "Error: unknown tool 'lookup'" in obs[1] and "Mira Solberg founded Eddavik" in obs[2]
    assert traj.finish_reason == "answer" and traj.prediction == "Mira" and len(traj.searches) == 1


def test_llama_calls_run_through_the_llama_template(tok):
    _, _, traj = run(tok, [LLAMA_CALL, "Answer: Mira Solberg"], "llama3.1.jinja")
    obs = [s.text for s in traj.segments if s.role == "observation"][0]
    assert obs.startswith("<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n")  # SmolLM2's EOS is not Llama's
    assert traj.prediction == "Mira Solberg" and traj.searches[0].query == "Eddavik founder"


def test_a_tokenizer_template_without_tools_is_warned_of_and_prompt_shows_the_tool_message(tok, caplog):
    with caplog.at_level("WARNING"):
        SearchAgent(ScriptedBackend([], tokenizer=tok), InMemoryRetriever(DOCS), "tool_call", AgentConfig())
    assert "takes no tools" in caplog.text and "smollm2_tools.jinja" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        SearchAgent(ScriptedBackend([], tokenizer=tok), None, "tool_call", AgentConfig(chat_template="qwen2.5.jinja"))
    assert "takes no tools" not in caplog.text
    out = describe(get_dialect("tool_call").with_chat_template("qwen2.5.jinja"), "q", tok, DOCS)
    assert out["observation"].startswith("\n<|im_start|>user\n<tool_response>\nDoc 1(Title: Eddavik)")


def test_a_template_file_sets_the_system_text_and_the_answer_style(tok, tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("placement: system\ntemplate: Be brief.\noptions: {answer_style: tag}\n", encoding="utf-8")
    agent = SearchAgent(ScriptedBackend([], tokenizer=tok), None, "tool_call", AgentConfig(template=str(f)))
    assert agent.dialect.messages("q")[0] == {"role": "system", "content": "Be brief."}
    assert agent.dialect.parse_action("<answer>A</answer>", eos=True).answer == "A"
    assert get_dialect("tool_call").parse_action("<answer>A</answer>", eos=True).answer is None  # marker style
