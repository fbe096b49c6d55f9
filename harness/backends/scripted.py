"""``scripted``: a deterministic replay backend for tests and for checking pipelines end to end.

A script is a list of entries ``{"match": substring, "turns": [text, ...]}``. For a request,
the first entry whose ``match`` occurs in the decoded context is used, and the turn to emit is
the number of that entry's turns already present, in order, in the context. This is stateless,
so concurrent items, repeated samples and resumed runs all replay identically.

Each emitted text is cut at the first requested stop string (kept, ``finish_reason="stop"``), or
at ``max_new_tokens`` (``length``); otherwise it ends with the EOS token (``stop`` on the EOS id).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.backends.base import BackendBase, Completion, SamplingParams, WeightUpdate, find_stop
from harness.textfiles import read_jsonl
from harness.tokenization import byte_tokenizer


@dataclass(frozen=True)
class ScriptEntry:
    match: str
    turns: tuple[str, ...]
    delay: float = 0.0  # seconds to wait before each answer (lets tests make an item slow)


def load_script(path: str | Path) -> list[ScriptEntry]:
    """Read a JSONL script file; errors name the file and line."""
    entries = []
    path = Path(path)
    for lineno, d in read_jsonl(path):
        try:
            entries.append(
                ScriptEntry(
                    match=str(d["match"]), turns=tuple(str(t) for t in d["turns"]), delay=float(d.get("delay", 0.0))
                )
            )
        except (KeyError, TypeError) as e:
            raise ValueError(
                f"{path}:{lineno}: bad script entry ({e}); want {{'match': str, 'turns': [str]}}"
            ) from None
    return entries


class ScriptedBackend(BackendBase):
    """Replays scripted model outputs; see the module docstring for the rules."""

    name = "scripted"

    def __init__(
        self,
        script: list[ScriptEntry] | list[dict[str, Any]] | str | Path | None = None,
        default: str = "<answer>unknown</answer>",
        tokenizer: Any = None,
        max_context: int = 1 << 16,
        model_path: str | None = None,
    ) -> None:
        if isinstance(script, str | Path):
            script = load_script(script)
        self.script = [
            e if isinstance(e, ScriptEntry) else ScriptEntry(e["match"], tuple(e["turns"]), float(e.get("delay", 0.0)))
            for e in script or []
        ]
        self.default = default
        self.tokenizer = tokenizer or byte_tokenizer()
        self.max_context = max_context
        # A local model directory (config + tokenizer) for FlashRAG's prompt templates, if any.
        self.model_path = model_path
        self.calls = 0

    @classmethod
    def from_config(cls, cfg: Any) -> ScriptedBackend:
        """From a :class:`~harness.eval_config.BackendConfig` (``script``: a JSONL script file)."""
        return cls(script=cfg.script)

    def update_weights(self, update: WeightUpdate) -> None:
        """Nothing to load (scripted text does not depend on weights); only the version moves."""
        self.weight_version = str(update.version)

    def _pick(self, context: str) -> tuple[str, ScriptEntry | None]:
        for entry in self.script:
            if entry.match in context:
                pos, turn = 0, 0
                for t in entry.turns:
                    i = context.find(t, pos)
                    if i < 0:
                        break
                    pos, turn = i + len(t), turn + 1
                if turn < len(entry.turns):
                    return entry.turns[turn], entry
                return self.default, entry
        return self.default, None

    async def agenerate(self, input_ids: list[int], params: SamplingParams) -> Completion:
        self.calls += 1
        context = self.tokenizer.decode(input_ids)
        text, entry = self._pick(context)
        if entry is not None and entry.delay:
            await asyncio.sleep(entry.delay)
        hit = find_stop(text, params.stop)
        finish: str = "stop"
        matched: str | int | None
        if hit is not None:
            text, matched = text[: hit[0]], hit[1]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            matched = self.tokenizer.eos_token_id
        if len(ids) > params.max_new_tokens:
            ids, finish, matched = ids[: params.max_new_tokens], "length", None
        out_text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(
            token_ids=ids,
            text=out_text,
            finish_reason=finish,  # type: ignore[arg-type]
            matched_stop=matched,
            logprobs=[0.0] * len(ids) if params.logprobs else None,
            prompt_tokens=len(input_ids),
        )
