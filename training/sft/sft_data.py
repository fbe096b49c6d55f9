"""SFT data: every source becomes :class:`~harness.types.Trajectory` segments for ``collate``.

The loss mask comes from segment roles, exactly as in RL (``training.batch``): 1 on ``model``
tokens, 0 on ``prompt`` and ``observation`` tokens. Every source is re-tokenized piece by piece
with the training tokenizer (each piece encoded on its own, as the agent encodes observations),
so a mask boundary never falls inside a token.

Sources (``sft.sources`` entries, ``{kind, path, where, limit}``):

- ``run``: a harness run directory (``trajectories.jsonl`` + ``scores.jsonl``), kept where the
  ``where`` expression (e.g. ``em >= 1 and n_searches > 0``) holds on the item's scores: this is
  rejection-sampling fine-tuning's filter. Parsed by :func:`parse_filter`, never ``eval``.
- ``chat``: JSONL in chat-messages form: ``{"messages": [{"role", "content"}]}`` (RL2 / OpenAI
  style, as RAG-R1-style SFT sets are written), ``{"conversations": [{"from", "value"}]}``
  (ShareGPT), or ProRAG's ``{"history", "completion"}`` (lilinwz/ProRAG ``sft/train.py``:
  the history is context, the completion plus EOS is trained). Assistant turns are trained;
  retrieval results pasted inside assistant text (``<information>``, ``<retrieval>``,
  ``<result>``, ``<|begin_of_documents|>`` blocks) are cut out as observations.
- ``synth``: what ``harness data synthesize`` writes (:mod:`training.synthesize`): the dialect
  name and question (the prompt is rendered here, with the training tokenizer, exactly as the
  agent renders it) and the turns as (role, text).

A malformed record raises :class:`SFTDataError` naming ``file:line``.
"""

from __future__ import annotations

import ast
import logging
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config import ConfigError, require_at_least
from harness.config import from_dict as config_from_dict
from harness.registry import Registry
from harness.runlog import RunDir
from harness.textfiles import read_jsonl
from harness.types import Segment, Trajectory
from pipelines.dialects import resolve_dialect

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# Retrieval results pasted into assistant text by the published SFT sets: these spans are
# observations (mask 0), never trained.
OBSERVATION_BLOCKS: tuple[tuple[str, str], ...] = (
    ("<information>", "</information>"),
    ("<retrieval>", "</retrieval>"),
    ("<result>", "</result>"),
    ("<|begin_of_documents|>", "<|end_of_documents|>"),
)


class SFTDataError(ValueError):
    """A malformed SFT record or source; the message names the file and line."""


@dataclass(frozen=True)
class SFTSource:
    kind: str
    path: str
    where: str | None = None  # run: a filter on the item's scores
    limit: int | None = None

    def __post_init__(self) -> None:
        require_at_least(self, 1, "limit")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "sft.sources") -> SFTSource:
        """A source of the recipe, checked as every config section is (unknown keys with a
        did-you-mean, types, a key YAML read as no string), then its kind against the registry."""
        if not isinstance(d, dict):
            raise SFTDataError(
                f"{where}: a source is a mapping (kind, path, and optionally where, limit), got {d!r:.60}"
            )
        try:
            source = config_from_dict(cls, d, where)
        except ConfigError as e:
            raise SFTDataError(f"{e} (a source needs kind and path, and optionally where, limit)") from None
        if source.kind not in SFT_SOURCES:
            raise SFTDataError(f"{where}: kind must be one of {', '.join(SFT_SOURCES.names())}, not {source.kind!r}")
        return source


# ---- pieces → segments -------------------------------------------------------------------------
def encode_piece(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def trajectory_from_pieces(
    tokenizer: PreTrainedTokenizerBase,
    pieces: list[tuple[str, str]],
    example_id: str,
    question: str = "",
    answers: list[str] | None = None,
    method: str = "sft",
    prompt_ids: list[int] | None = None,
    eos: bool = False,
    metadata: dict[str, Any] | None = None,
) -> Trajectory:
    """Segments from (role, text) pieces, each encoded on its own. ``prompt_ids``: already
    rendered prompt ids placed first; ``eos``: the tokenizer's EOS id ends the last model turn."""
    segs: list[Segment] = []
    if prompt_ids is not None:
        segs.append(Segment("prompt", list(prompt_ids), tokenizer.decode(prompt_ids)))
    for role, text in pieces:
        if not text:
            continue
        ids = encode_piece(tokenizer, text)
        if segs and segs[-1].role == role:  # adjacent pieces of one role: one segment
            segs[-1] = Segment(role, segs[-1].token_ids + ids, segs[-1].text + text)
        else:
            segs.append(Segment(role, ids, text))  # type: ignore[arg-type]
    if eos and tokenizer.eos_token_id is not None:
        last = max((i for i, s in enumerate(segs) if s.role == "model"), default=None)
        if last is not None and (not segs[last].token_ids or segs[last].token_ids[-1] != tokenizer.eos_token_id):
            s = segs[last]
            segs[last] = Segment("model", s.token_ids + [tokenizer.eos_token_id], s.text + tokenizer.eos_token)
    traj = Trajectory(example_id=example_id, question=question, answers=list(answers or []), method=method)
    traj.segments = segs
    traj.prompt_tokens = sum(len(s.token_ids) for s in segs if s.role == "prompt")
    traj.generated_tokens = sum(len(s.token_ids) for s in segs if s.role == "model")
    traj.observation_tokens = sum(len(s.token_ids) for s in segs if s.role == "observation")
    traj.finish_reason = "answer"
    traj.metadata = dict(metadata or {})
    return traj


def split_observations(text: str, blocks: tuple[tuple[str, str], ...] = OBSERVATION_BLOCKS) -> list[tuple[str, str]]:
    """Assistant text → (role, text) pieces: retrieval blocks (tags included) are observations.

    An opened block that is never closed runs to the end of the text (it is still inserted
    text, not the model's)."""
    pattern = "|".join(re.escape(o) for o, _ in blocks)
    closes = dict(blocks)
    out: list[tuple[str, str]] = []
    pos = 0
    while True:
        m = re.search(pattern, text[pos:]) if pattern else None
        if m is None:
            out.append(("model", text[pos:]))
            break
        start = pos + m.start()
        out.append(("model", text[pos:start]))
        close = closes[m.group(0)]
        end = text.find(close, start + len(m.group(0)))
        end = len(text) if end < 0 else end + len(close)
        out.append(("observation", text[start:end]))
        pos = end
    return [(r, t) for r, t in out if t]


# ---- (b) chat-messages JSONL --------------------------------------------------------------------
_ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


def _messages(rec: dict[str, Any], where: str) -> list[dict[str, str]]:
    if "messages" in rec:
        raw, rkey, ckey = rec["messages"], "role", "content"
    elif "conversations" in rec:
        raw, rkey, ckey = rec["conversations"], "from", "value"
    else:
        raise SFTDataError(
            f"{where}: expected 'messages', 'conversations' or 'history'+'completion'; got {sorted(rec)}"
        )
    if not isinstance(raw, list) or not raw:
        raise SFTDataError(f"{where}: the message list is empty or not a list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise SFTDataError(f"{where}: message {i} is not an object")
        role = m.get(rkey, m.get("role"))
        content = m.get(ckey, m.get("content"))
        if role not in _ROLE_ALIASES or not isinstance(content, str):
            raise SFTDataError(f"{where}: message {i} needs a known {rkey!r} and a string {ckey!r}; got {m!r:.120}")
        out.append({"role": _ROLE_ALIASES[role], "content": content})
    if not any(m["role"] == "assistant" for m in out):
        raise SFTDataError(f"{where}: no assistant turn to train on")
    if out[0]["role"] == "assistant":
        raise SFTDataError(f"{where}: the conversation starts with an assistant turn (no prompt before it)")
    return out


def _chat_pieces(
    tokenizer: PreTrainedTokenizerBase, msgs: list[dict[str, str]], use_template: bool
) -> list[tuple[str, str]]:
    """(role, text) pieces of a conversation. With a chat template, each turn's text is the
    difference between the template applied to the conversation up to and through it (so the
    template's own markers land where the model would see them); the assistant's piece includes
    its end-of-turn marker."""
    pieces: list[tuple[str, str]] = []
    seen_assistant = False
    if not use_template:
        for m in msgs:
            if m["role"] == "assistant":
                pieces += split_observations(m["content"])
                seen_assistant = True
            else:
                pieces.append(("observation" if seen_assistant else "prompt", m["content"] + "\n\n"))
        return pieces
    done = ""
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            head = tokenizer.apply_chat_template(msgs[:i], add_generation_prompt=True, tokenize=False)
            full = tokenizer.apply_chat_template(msgs[: i + 1], tokenize=False)
            if not head.startswith(done) or not full.startswith(head):
                raise SFTDataError("the chat template does not render the conversation incrementally")
            pieces.append(("observation" if seen_assistant else "prompt", head[len(done) :]))
            pieces += split_observations(full[len(head) :])
            done, seen_assistant = full, True
    return pieces


def load_chat(
    path: str | Path, tokenizer: PreTrainedTokenizerBase, limit: int | None = None, chat: bool = True
) -> list[Trajectory]:
    """Source (b): chat-messages JSONL (see the module docstring for the layouts)."""
    path = Path(path)
    use_template = chat and bool(getattr(tokenizer, "chat_template", None))
    out: list[Trajectory] = []
    for n, rec in read_jsonl(path, SFTDataError):
        where = f"{path}:{n}"
        if "history" in rec or "completion" in rec:  # ProRAG's SFT layout
            h, c = rec.get("history"), rec.get("completion")
            if not isinstance(h, str) or not isinstance(c, str):
                raise SFTDataError(f"{where}: 'history' and 'completion' must both be strings")
            pieces = [("prompt", h), *split_observations(c)]
            eos = True
        else:
            try:
                pieces = _chat_pieces(tokenizer, _messages(rec, where), use_template)
            except SFTDataError as e:
                raise SFTDataError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
            eos = not use_template  # a chat template writes its own end-of-turn marker
        if not any(r == "model" and t.strip() for r, t in pieces):
            raise SFTDataError(f"{where}: nothing left to train on after removing retrieval blocks")
        rid = str(rec.get("id", f"{path.name}:{n}"))
        out.append(trajectory_from_pieces(tokenizer, pieces, rid, eos=eos, metadata={"source": where}))
        if limit is not None and len(out) >= limit:
            break
    return out


# ---- (c) synthesized trajectories ---------------------------------------------------------------
def load_synth(
    path: str | Path, tokenizer: PreTrainedTokenizerBase, limit: int | None = None, chat: bool = True
) -> list[Trajectory]:
    """Source (c): ``harness data synthesize`` output. The prompt is rendered by the record's
    dialect with THIS tokenizer (``Dialect.prompt_ids``, as the agent does)."""
    path = Path(path)
    out: list[Trajectory] = []
    for n, rec in read_jsonl(path, SFTDataError):
        where = f"{path}:{n}"
        try:
            dialect = resolve_dialect(rec["dialect"])
            turns = [(t["role"], t["text"]) for t in rec["turns"]]
            question = rec["question"]
        except (KeyError, TypeError) as e:
            raise SFTDataError(
                f"{where}: a synthesized record needs dialect, question and turns [{{role, text}}] ({e})"
            ) from None
        except ValueError as e:  # unknown dialect
            raise SFTDataError(f"{where}: {e}") from None
        bad = [r for r, _ in turns if r not in ("model", "observation")]
        if bad or not any(r == "model" for r, _ in turns):
            raise SFTDataError(f"{where}: turn roles must be model/observation with at least one model turn; got {bad}")
        if rec.get("chat_template"):  # a chat-template dialect's template file (tool_call)
            dialect = dialect.with_chat_template(rec["chat_template"])
        use_chat = chat and bool(rec.get("chat", True))
        if use_chat and dialect.uses_chat_template(tokenizer):
            # tool_call: each model turn ends on EOS and each observation is the template's tool message
            turns = dialect.chat_turns(tokenizer, turns)
        prompt_ids = dialect.prompt_ids(tokenizer, question, chat=use_chat, few_shot=bool(rec.get("few_shot", False)))
        prefix = rec.get("response_prefix") or ""
        pieces = ([("prompt", prefix)] if prefix else []) + turns
        out.append(
            trajectory_from_pieces(
                tokenizer,
                pieces,
                str(rec.get("id", f"{path.name}:{n}")),
                question,
                list(rec.get("answers", [])),
                method=f"synth:{dialect.name}",
                prompt_ids=prompt_ids,
                eos=True,
                metadata={"source": where, "dialect": dialect.name},
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return out


# ---- (a) harness run directories ---------------------------------------------------------------
_CMP: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def parse_filter(expr: str) -> Callable[[dict[str, Any]], bool]:
    """A safe predicate over named values: comparisons (``== != < <= > >=``, chained), ``and``,
    ``or``, ``not``, parentheses, names, numbers, strings, ``true/false/none``. Python's parser
    reads the syntax; only those node kinds are evaluated (nothing is called, imported or
    looked up beyond the given names). An unknown name raises ``KeyError`` at evaluation."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"filter {expr!r}: {e.msg}") from None

    def check(node: ast.AST) -> None:
        ok = (
            ast.BoolOp,
            ast.And,
            ast.Or,
            ast.UnaryOp,
            ast.Not,
            ast.USub,
            ast.Compare,
            ast.Name,
            ast.Load,
            ast.Constant,
        )
        if not isinstance(node, ok) and type(node) not in _CMP:
            raise ValueError(f"filter {expr!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float | str | bool | type(None)):
            raise ValueError(f"filter {expr!r}: constant {node.value!r} is not allowed")
        for child in ast.iter_child_nodes(node):
            check(child)

    check(tree)
    consts = {"true": True, "false": False, "none": None}

    def ev(node: ast.AST, env: dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id.lower() in consts:
                return consts[node.id.lower()]
            raise KeyError(f"filter {expr!r}: unknown name {node.id!r} (have: {', '.join(sorted(env))})")
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand, env)
            return (not v) if isinstance(node.op, ast.Not) else -v
        if isinstance(node, ast.BoolOp):
            vals = (ev(v, env) for v in node.values)
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        assert isinstance(node, ast.Compare)
        left = ev(node.left, env)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = ev(comp, env)
            if left is None or right is None:
                if not isinstance(op, ast.Eq | ast.NotEq):
                    return False  # a missing metric passes no threshold
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True

    return lambda env: bool(ev(tree, env))


def score_env(score: Any) -> dict[str, Any]:
    """The names a run filter sees: every metric of the item, ``reward`` (= the ``reward``
    metric when recorded), ``n_searches``, ``generated_tokens``, ``finish_reason``, ``error``."""
    env: dict[str, Any] = dict(score.metrics)
    env.update(
        n_searches=score.n_searches,
        generated_tokens=score.generated_tokens,
        finish_reason=score.finish_reason,
        error=score.error,
    )
    return env


def load_run(
    run_dir: str | Path, tokenizer: PreTrainedTokenizerBase, where: str | None = None, limit: int | None = None
) -> list[Trajectory]:
    """Source (a): a run directory's trajectories whose scores pass ``where`` (all without one).
    Failed items are never kept. Segments are re-tokenized from their text, segment by segment."""
    run = RunDir(run_dir)
    pred = parse_filter(where) if where else (lambda env: True)
    scores = {s.key: s for s in run.scores()}
    out: list[Trajectory] = []
    for t in run.trajectories():
        s = scores.get((t.example_id, t.sample_index))
        if s is None or s.error or t.finish_reason == "error":
            continue
        if not pred(score_env(s)):
            continue
        if not any(seg.role == "model" for seg in t.segments):
            continue
        pieces = [(seg.role, seg.text) for seg in t.segments]
        if any(not seg.text and seg.token_ids for seg in t.segments):
            raise SFTDataError(f"{run_dir}: trajectory {t.example_id}#{t.sample_index} has segments without text")
        new = trajectory_from_pieces(
            tokenizer, pieces, t.example_id, t.question, t.answers, t.method, metadata={"source": str(run_dir)}
        )
        new.sample_index = t.sample_index
        out.append(new)
        if limit is not None and len(out) >= limit:
            break
    logger.info("run %s: kept %d trajectories%s", run_dir, len(out), f" where {where}" if where else "")
    return out


def load_sources(
    sources: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, chat: bool = True
) -> list[Trajectory]:
    """Every configured source, in order."""
    if not sources:
        raise SFTDataError("algo.kind=sft needs sft.sources: [{kind: run|chat|synth, path: ...}]")
    out: list[Trajectory] = []
    for i, d in enumerate(sources):
        src = SFTSource.from_dict(d, f"sft.sources[{i}]")
        if src.where and not SFT_SOURCES.info(src.kind).get("filters"):
            raise SFTDataError(f"sft.sources[{i}]: 'where' filters run directories only")
        got = SFT_SOURCES.get(src.kind)(src, tokenizer, chat)
        logger.info("sft source %s %s: %d trajectories", src.kind, src.path, len(got))
        out += got
    if not out:
        raise SFTDataError("the SFT sources hold no trajectories (check the paths and the 'where' filters)")
    return out


# sft.sources[].kind → loader(source, tokenizer, chat) -> trajectories; info ``filters``: takes ``where``.
SFT_SOURCES: Registry[Callable[[SFTSource, Any, bool], list[Trajectory]]] = Registry("SFT source kind")
SFT_SOURCES.register("run", lambda src, tok, chat: load_run(src.path, tok, src.where, src.limit), filters=True)
SFT_SOURCES.register("chat", lambda src, tok, chat: load_chat(src.path, tok, src.limit, chat))
SFT_SOURCES.register("synth", lambda src, tok, chat: load_synth(src.path, tok, src.limit, chat))
