"""LLM-as-judge: a verdict per (item, prediction) from any OpenAI-compatible chat endpoint.

The judge prompt is protocol data under ``configs/judges/`` (R1-Searcher's and ReSearch's, each
with its source; a metric profile picks its paper's). :class:`LLMJudge` sends one chat request
per item and reads the verdict the way the prompt file says (a standalone ``True``/``False``, or
a JSON field). Verdicts are cached in the run directory
(``judge_cache.jsonl``, one line per verdict, keyed by item, prediction, judge model, prompt and
decoding), so a rerun costs no calls. A call that fails (network, HTTP error, an unreadable
reply) gives ``None``: the item's judge score is *missing*, never wrong; it is not cached, so the
next run asks again. The API key is read from the environment variable the config names and is
never written or logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.config import from_dict, read_yaml, require_at_least, require_positive
from harness.textfiles import read_jsonl

logger = logging.getLogger(__name__)

JUDGES_DIR = Path(__file__).resolve().parents[1] / "configs" / "judges"
CACHE_FILE = "judge_cache.jsonl"
RECORD_FILE = "judge.json"


@dataclass(frozen=True)
class JudgeConfig:
    """Where and how to judge. ``url``: the endpoint's base (``http://host:port/v1``).

    ``prompt``: a name under ``configs/judges/`` or a YAML file. ``model`` / ``max_tokens`` /
    ``temperature``: None takes the prompt file's (the original's) choice; a temperature of None
    sends none, so the server's default applies, as in the original.
    """

    url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    prompt: str = "r1_searcher"  # the metric profile's judge prompt when the profile has one
    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float = 60.0
    retries: int = 2

    def __post_init__(self) -> None:
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s):// endpoint (such as http://host:8000/v1), got {self.url!r}")
        require_positive(self, "timeout", "max_tokens")
        require_at_least(self, 0, "retries", "temperature")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> JudgeConfig:
        """The ``judge:`` options, each checked (type and range) as every config key is, named
        ``judge.KEY`` in the error (:class:`~harness.config.ConfigError`, a ValueError)."""
        return from_dict(cls, options, "judge")


@dataclass(frozen=True)
class JudgePrompt:
    """A judge prompt file: the template, the names of its question / reference / prediction
    slots, how the gold answers are written into it, and how a reply becomes a verdict."""

    name: str
    template: str
    role: str = "user"
    model: str = "gpt-4o-mini"
    decoding: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    slots: dict[str, str] = field(
        default_factory=lambda: {"question": "question", "reference": "reference", "prediction": "prediction"}
    )
    reference_format: str = "r1_searcher"  # r1_searcher (one gold as is, several as a list) | list_repr
    verdict: dict[str, Any] = field(default_factory=lambda: {"kind": "word"})

    def reference(self, golds: list[str]) -> str:
        if self.reference_format == "list_repr":
            return str(list(golds))
        return reference_text(golds)

    def parse(self, reply: str) -> float | None:
        if self.verdict.get("kind") == "json":
            return parse_json_verdict(reply, self.verdict["field"], self.verdict["correct"], self.verdict["wrong"])
        return parse_verdict(reply)

    @classmethod
    def load(cls, spec: str) -> JudgePrompt:
        path = Path(spec) if spec.endswith((".yaml", ".yml")) else JUDGES_DIR / f"{spec}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in JUDGES_DIR.glob("*.yaml")))
            raise ValueError(f"judge prompt {spec!r}: no file {path} (shipped: {known})")
        d = read_yaml(path) or {}
        if not isinstance(d, dict):
            raise ValueError(f"judge prompt {path}: must hold a mapping (name, template, ...)")
        for key in ("name", "template"):
            if not isinstance(d.get(key), str):
                raise ValueError(f"judge prompt {path}: needs a string {key!r}")
        slots = {"question": "question", "reference": "reference", "prediction": "prediction", **(d.get("slots") or {})}
        for slot in slots.values():
            if "{" + slot + "}" not in d["template"]:
                raise ValueError(f"judge prompt {path}: the template lacks {{{slot}}}")
        verdict = dict(d.get("verdict") or {"kind": "word"})
        if verdict.get("kind", "word") not in ("word", "json"):
            raise ValueError(f"judge prompt {path}: verdict.kind must be 'word' or 'json'")
        if verdict.get("kind") == "json" and not {"field", "correct", "wrong"} <= set(verdict):
            raise ValueError(f"judge prompt {path}: a json verdict needs field, correct and wrong")
        return cls(
            slots=slots,
            reference_format=str(d.get("reference_format", "r1_searcher")),
            verdict=verdict,
            name=d["name"],
            template=d["template"],
            role=str(d.get("role", "user")),
            model=str(d.get("model", "gpt-4o-mini")),
            decoding=dict(d.get("decoding") or {}),
            source=dict(d.get("source") or {}),
        )


def judge_identity(cfg: JudgeConfig) -> dict[str, Any]:
    """What identifies a judge's verdicts (for the run's config): prompt, model and decoding."""
    prompt = JudgePrompt.load(cfg.prompt)
    decoding = dict(prompt.decoding)
    if cfg.max_tokens is not None:
        decoding["max_tokens"] = cfg.max_tokens
    if cfg.temperature is not None:
        decoding["temperature"] = cfg.temperature
    return {"prompt": cfg.prompt, "model": cfg.model or prompt.model, "decoding": decoding}


def parse_json_verdict(reply: str, key: str, correct: str, wrong: str) -> float | None:
    """The verdict in a JSON reply's ``key`` (a fenced ```json block is accepted); None otherwise."""
    text = (reply or "").strip()
    m = re.search(r"\{.*\}", text, re.DOTALL)
    try:
        value = json.loads(m.group(0) if m else text).get(key)
    except (json.JSONDecodeError, AttributeError):
        return None
    value = str(value).strip().lower()
    return 1.0 if value == correct else 0.0 if value == wrong else None


def reference_text(golds: list[str]) -> str:
    """The gold answer as R1-Searcher's ``str.format`` writes it: one string, or a list's repr."""
    mapped = [{"False": "no", "True": "yes"}.get(g, g) for g in golds]
    return mapped[0] if len(mapped) == 1 else str(mapped)


_VERDICT = re.compile(r"\b(true|false)\b", re.IGNORECASE)


def parse_verdict(reply: str) -> float | None:
    """1.0 / 0.0 for the first standalone True / False in ``reply``; None when there is neither."""
    m = _VERDICT.search(reply or "")
    if m is None:
        return None
    return 1.0 if m.group(1).lower() == "true" else 0.0


class LLMJudge:
    """Judges predictions through an OpenAI-compatible ``/chat/completions`` endpoint, with a cache.

    ``cache_dir``: where ``judge_cache.jsonl`` lives (the run directory); None keeps no cache.
    Call it with ``(item_id, question, golds, prediction)``; thread-safe (items finish on
    worker threads).
    """

    def __init__(self, cfg: JudgeConfig, cache_dir: str | Path | None = None, client: Any = None) -> None:
        if not cfg.url:
            raise ValueError("the LLM judge needs an endpoint: --judge-url URL (an OpenAI-compatible base, …/v1)")
        self.cfg = cfg
        self.prompt = JudgePrompt.load(cfg.prompt)
        self.model = cfg.model or self.prompt.model
        self.decoding: dict[str, Any] = dict(self.prompt.decoding)
        if cfg.max_tokens is not None:
            self.decoding["max_tokens"] = cfg.max_tokens
        if cfg.temperature is not None:
            self.decoding["temperature"] = cfg.temperature
        url = cfg.url.rstrip("/")
        self.endpoint = url if url.endswith("/chat/completions") else f"{url}/chat/completions"
        self._lock = threading.Lock()
        self._cache_path = Path(cache_dir) / CACHE_FILE if cache_dir is not None else None
        self._cache = self._read_cache()
        self.calls = 0  # judge requests actually sent (cache hits excluded)
        self.failures = 0
        if client is None:
            client = httpx.Client(timeout=cfg.timeout)
        self._client = client

    def record(self) -> dict[str, Any]:
        """What a run records about its judge: prompt (text and source), model, decoding, endpoint kind."""
        return {
            "prompt_name": self.prompt.name,
            "prompt_template": self.prompt.template,
            "prompt_role": self.prompt.role,
            "prompt_source": self.prompt.source,
            "model": self.model,
            "decoding": self.decoding,
            "api_key_env": self.cfg.api_key_env,
            "config": {k: v for k, v in asdict(self.cfg).items() if k != "url"},
        }

    def write_record(self, run_dir: str | Path) -> None:
        path = Path(run_dir) / RECORD_FILE
        path.write_text(json.dumps(self.record(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    def _identity(self) -> str:
        return json.dumps([self.model, self.prompt.template, self.prompt.role, self.decoding], sort_keys=True)

    def cache_key(self, item_id: str, prediction: str) -> str:
        h = hashlib.sha256(json.dumps([item_id, prediction, self._identity()], ensure_ascii=False).encode())
        return h.hexdigest()[:32]

    def _read_cache(self) -> dict[str, float]:
        if self._cache_path is None or not self._cache_path.is_file():
            return {}
        out: dict[str, float] = {}
        # tolerant: a torn last line from an interrupted run; that verdict is asked again
        for lineno, d in read_jsonl(self._cache_path, tolerant=True):
            try:
                out[str(d["key"])] = float(d["verdict"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{self._cache_path}:{lineno}: not a judge verdict record") from None
        return out

    def messages(self, question: str, golds: list[str], prediction: str) -> list[dict[str, str]]:
        s = self.prompt.slots
        text = self.prompt.template.format(
            **{s["question"]: question, s["reference"]: self.prompt.reference(golds), s["prediction"]: prediction}
        )
        return [{"role": self.prompt.role, "content": text}]

    def _ask(self, messages: list[dict[str, str]]) -> str:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.cfg.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": self.model, "messages": messages, **self.decoding}
        last: Exception | None = None
        for _ in range(self.cfg.retries + 1):
            try:
                r = self._client.post(self.endpoint, json=body, headers=headers)
                r.raise_for_status()
                return str(r.json()["choices"][0]["message"]["content"] or "")
            except Exception as e:  # noqa: BLE001 - any failure of the call means "missing", never "wrong"
                last = e
        raise RuntimeError(f"{type(last).__name__}: {last}")

    def __call__(self, item_id: str, question: str, golds: list[str], prediction: str) -> float | None:
        key = self.cache_key(item_id, prediction)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        try:
            reply = self._ask(self.messages(question, golds, prediction))
            self.calls += 1
        except RuntimeError as e:
            self.failures += 1
            logger.warning("judge call for item %s failed (recorded as missing): %s", item_id, e)
            return None
        verdict = self.prompt.parse(reply)
        if verdict is None:
            self.failures += 1
            logger.warning("judge reply for item %s has no verdict (recorded as missing): %.80r", item_id, reply)
            return None
        with self._lock:
            self._cache[key] = verdict
            if self._cache_path is not None:
                line = {"key": key, "id": item_id, "prediction": prediction, "verdict": verdict, "reply": reply}
                with self._cache_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(line, ensure_ascii=False) + "\n")
        return verdict

    def close(self) -> None:
        close = getattr(self._client, "close", None)
        if close is not None:
            close()
