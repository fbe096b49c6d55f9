"""The app of ``harness serve prm`` (started by :func:`training.prm.prm_scorer.serve`, and by local rank 0 for its
node, :func:`training.prm.prm_scorer.node_local_prm`): a trained PRM over loopback HTTP, for ``algo.step_scorer_url``.

``POST /score`` ``{"sequences": [[token ids], ...], "window": {"append_eos", "max_len", "keep"}}`` →
``{"scores": [raw head score, ...]}`` (without ``window``: EOS appended and the end kept as the
PRM was trained; the client takes σ). A token id outside the model's
vocabulary (negative, too large, beyond int64) is a 422 naming the sequence and position; a
sequence longer than ``max_tokens`` (``harness serve prm --max-tokens``) is a 413. ``GET /health`` →
``{"status": "healthy", "kind": "prm", "path": ...}``. A plain ASGI app in the style of
``harness.retrieval.server`` (pydantic from bytes, orjson); requests are scored one at a time
under a lock in a worker thread, so the event loop stays free and the model is never entered twice.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from training.prm_window import ScoringWindow

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20
MAX_SEQUENCES = 1024
MAX_TOKENS = 8192  # per sequence, by default: a 60k-token sequence would take the server's memory


class Scorer(Protocol):
    """What the app serves: a trained PRM in process (:class:`training.prm.prm_scorer.PRM`)."""

    @property
    def vocab_size(self) -> int: ...

    def score(self, seqs: list[list[int]], batch_size: int = 8, window: ScoringWindow | None = None) -> list[float]: ...


class WindowRequest(BaseModel):
    """:class:`training.prm_window.ScoringWindow`: what of each sequence the PRM scores."""

    model_config = ConfigDict(extra="forbid", strict=True)

    append_eos: bool
    max_len: int | None = Field(default=None, ge=1)
    keep: Literal["first", "last"] = "last"


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    sequences: list[list[int]]
    window: WindowRequest | None = None  # none: as the PRM was trained

    @field_validator("sequences")
    @classmethod
    def _check(cls, v: list[list[int]]) -> list[list[int]]:
        if not v or len(v) > MAX_SEQUENCES:
            raise ValueError(f"give 1 to {MAX_SEQUENCES} sequences, got {len(v)}")
        if any(not s for s in v):
            raise ValueError("a sequence is empty")
        return v


def _answer(status: int, payload: Any) -> tuple[int, bytes]:
    return status, orjson.dumps(payload)


class PRMApp:
    """The ASGI app over a :class:`~training.prm.prm_scorer.PRM`."""

    def __init__(self, prm: Scorer, path: str = "", batch_size: int = 8, max_tokens: int = MAX_TOKENS) -> None:
        self.prm, self.path, self.batch_size, self.max_tokens = prm, path, batch_size, max_tokens
        self.vocab_size = prm.vocab_size
        self.lock = threading.Lock()
        self.requests = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                kind = msg["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        status, body = await self._handle(scope, receive)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _handle(self, scope: dict, receive: Any) -> tuple[int, bytes]:
        path, method = scope["path"], scope["method"]
        if path == "/health":
            return _answer(200, {"status": "healthy", "kind": "prm", "path": self.path, "requests": self.requests})
        if path != "/score":
            return _answer(404, {"detail": f"no route {path}"})
        if method != "POST":
            return _answer(405, {"detail": "/score takes POST"})
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return _answer(400, {"detail": "client disconnected"})
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_BODY_BYTES:
                return _answer(413, {"detail": f"request body larger than {MAX_BODY_BYTES} bytes"})
            if not msg.get("more_body", False):
                break
        try:
            req = ScoreRequest.model_validate_json(b"".join(chunks))
        except ValidationError as e:
            detail = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'body'}: {x['msg']}" for x in e.errors())
            return _answer(422, {"detail": detail})
        problem = self._check_ids(req.sequences)
        if problem is not None:
            return problem
        self.requests += 1
        try:
            scores = await asyncio.to_thread(self._score, req.sequences, req.window)
        except Exception as e:  # say why, keep serving
            logger.exception("PRM scoring failed")
            return _answer(500, {"detail": f"scoring failed: {type(e).__name__}: {e}"})
        return _answer(200, {"scores": scores})

    def _check_ids(self, seqs: list[list[int]]) -> tuple[int, bytes] | None:
        """413 for a sequence over ``max_tokens``, 422 for an id the model cannot embed (the
        embedding would raise: a 500 that blames the server for the client's ids)."""
        for i, s in enumerate(seqs):
            if len(s) > self.max_tokens:
                return _answer(
                    413,
                    {
                        "detail": f"sequences.{i}: {len(s)} tokens; this server takes at most {self.max_tokens} per "
                        "sequence (harness serve prm --max-tokens)"
                    },
                )
            for j, t in enumerate(s):
                if not 0 <= t < self.vocab_size:
                    return _answer(
                        422,
                        {"detail": f"sequences.{i}.{j}: token id {t} is outside the vocabulary [0, {self.vocab_size})"},
                    )
        return None

    def _score(self, seqs: list[list[int]], window: WindowRequest | None = None) -> list[float]:
        w = ScoringWindow(window.append_eos, window.max_len, window.keep) if window is not None else None
        with self.lock:
            return self.prm.score(seqs, self.batch_size, w)


def create_app(prm: Scorer, path: str = "", batch_size: int = 8, max_tokens: int = MAX_TOKENS) -> PRMApp:
    return PRMApp(prm, path, batch_size, max_tokens)
