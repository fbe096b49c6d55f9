"""A trained process reward model (see :mod:`training.prm.prm`, which trains it): saved, loaded
back, scoring token-id sequences, and the RL step scorer built on it (``algo.step_scorer: prm``),
one PRM per node.

Saved (``RUN/final/``, safetensors only): ``model.safetensors`` + ``config.json`` (the LM body;
LoRA adapters merged into it), ``head.safetensors`` (the scalar head), ``prm.json`` (how to
rebuild the tokenizer), and the tokenizer files when it has them. :func:`load_prm` reads it back.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import torch
from safetensors.torch import load_file

from harness.fsutil import atomic_dir
from harness.models import load_tokenizer
from harness.ports import serve_app
from harness.tokenization import byte_tokenizer
from training.checkpoint import write_safetensors
from training.config import TrainConfig
from training.divergence import check_finite
from training.engine import ValueHead, unwrap
from training.lora import merged_state_dict
from training.prm.prm_server import MAX_TOKENS, create_app
from training.prm_window import ScoringWindow

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from harness.types import Trajectory

logger = logging.getLogger(__name__)


# ---- the model --------------------------------------------------------------------------------
def pad_batch(
    seqs: list[list[int]], pad_id: int, max_len: int | None, device: str | torch.device | None = None
) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and last-token index; a sequence longer than ``max_len``
    keeps its END (the head reads the last token).  → [B, L], [B, L], [B]"""
    seqs = [s[-max_len:] if max_len else s for s in seqs]
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)  # [B, L]
    mask = torch.zeros((len(seqs), L), dtype=torch.long)  # [B, L]
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    last = torch.tensor([len(s) - 1 for s in seqs], dtype=torch.long)  # [B]
    return ids.to(device), mask.to(device), last.to(device)


def scores_of(
    model: torch.nn.Module,
    seqs: list[list[int]],
    pad_id: int,
    max_len: int | None,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """The head's raw score (a logit) on the last token of each sequence.  → [B]"""
    ids, mask, last = pad_batch(seqs, pad_id, max_len, device)
    values = model(input_ids=ids, attention_mask=mask)  # [B, L]
    return values.gather(1, last[:, None]).squeeze(1).float()  # [B]


# ---- saving, loading, scoring -----------------------------------------------------------------
def save_prm(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: Path, cfg: TrainConfig, metrics: dict[str, float]
) -> Path:
    """The PRM folder (safetensors; LoRA merged into the body); see the module docstring."""
    m = unwrap(model)
    out = Path(out)
    body = m.body
    lora = cfg.model.lora is not None
    state = merged_state_dict(body) if lora else body.state_dict()
    head = m.head.state_dict()
    check_finite({**state, **{f"head.{k}": v for k, v in head.items()}}, f"not writing the PRM {out}")
    byte = cfg.model.tiny is not None
    meta = {
        "kind": "prm",
        "base": cfg.model.path,
        "tokenizer": "byte" if byte else "folder",
        "append_eos": cfg.prm.append_eos,
        "max_len": cfg.prm.max_len,
        "loss": cfg.prm.loss,
        "metrics": metrics,
    }
    # written whole or not at all, with harness's marker (a best-step-N/ is pruned as a model folder)
    with atomic_dir(out, kind="model") as tmp:
        write_safetensors({k: v.detach().contiguous().cpu() for k, v in state.items()}, tmp / "model.safetensors")
        body.config.save_pretrained(str(tmp))
        write_safetensors({k: v.detach().contiguous().cpu() for k, v in head.items()}, tmp / "head.safetensors")
        if not byte and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(str(tmp))
        (tmp / "prm.json").write_text(json.dumps(meta, indent=2))
    return out


class PRM:
    """A trained PRM in process: ``score(seqs)`` → raw head scores (logits), no gradients."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, window: ScoringWindow | None = None
    ) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.window = window or ScoringWindow()  # as it was trained: EOS (prm.append_eos), the end kept
        # Local rank 0 scores in process while its server thread scores for the node's other ranks.
        self.lock = threading.Lock()

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        """Token ids this PRM can embed: ``0 <= id < vocab_size``."""
        cfg = getattr(self.model, "config", None)
        return int(getattr(cfg, "vocab_size", None) or len(self.tokenizer))

    @torch.no_grad()
    def score(self, seqs: list[list[int]], batch_size: int = 8, window: ScoringWindow | None = None) -> list[float]:
        """Scores of token-id sequences (prefix + step) seen through ``window`` (default: as the
        PRM was trained, :attr:`window`), on the model's device, in batches of similar length (less
        padding); returned in input order."""
        with self.lock:
            return self._score(seqs, batch_size, window or self.window)

    def _score(self, seqs: list[list[int]], batch_size: int, window: ScoringWindow) -> list[float]:
        seqs = [window.apply(s, self.tokenizer.eos_token_id) for s in seqs]
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        out = [0.0] * len(seqs)
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            part = [seqs[j] for j in idx]
            for j, v in zip(idx, scores_of(self.model, part, self.pad_id, None, self.device).tolist(), strict=True):
                out[j] = v
        return out


def load_prm(path: str | Path, threads: int | None = None, device: str | torch.device | None = None) -> PRM:
    """Read a folder :func:`save_prm` wrote (safetensors only), onto ``device`` (default CPU):
    bf16 on a GPU (as the policy), fp32 on CPU."""
    # deferred: transformers costs ~0.8 s at import
    from transformers import AutoConfig, AutoModel

    path = Path(path)
    meta_path = path / "prm.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{path}: not a PRM folder (no prm.json; train one with algo.kind=prm)")
    meta = json.loads(meta_path.read_text())
    if threads:
        torch.set_num_threads(threads)
    config = AutoConfig.from_pretrained(str(path))
    body = AutoModel.from_config(config)
    missing, unexpected = body.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise ValueError(
            f"{path}/model.safetensors does not fit its config: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    lm = type("LM", (), {})()  # ValueHead takes an LM with .config and .model
    lm.config, lm.model = config, body
    model = ValueHead(lm)
    model.head.load_state_dict(load_file(str(path / "head.safetensors")))
    if meta.get("tokenizer") == "byte":
        tok = byte_tokenizer()
    else:
        tok = load_tokenizer(str(path))
    device = torch.device(device or "cpu")
    model = model.to(device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    return PRM(model, tok, ScoringWindow(bool(meta.get("append_eos", True)), meta.get("max_len"), "last"))


# ---- the step scorer --------------------------------------------------------------------------
_STEP_TAGS = (
    ["</step>", "<subquery>", "</subquery>", "<retrieval>", "</retrieval>"],
    ["</step>", "<subanswer>", "</subanswer>"],
    ["</step>", "<answer>", "</answer>"],
)


def prorag_step_format(step_text: str) -> float:
    """The intent of ProRAG's ``format_reward_step`` (``prorag/rl/reward.py``): +1 when a step's
    tags are one of ``</step> <subquery></subquery> <retrieval></retrieval>``,
    ``</step> <subanswer></subanswer>`` or ``</step> <answer></answer>``, else −2. ProRAG's own
    function prepends ``<step>`` before comparing, so as shipped it returns −2 for every step (a
    constant that the group normalisation of the step advantage removes); here the next step's
    opening ``<step>`` at the end of our observation is dropped and no tag is prepended."""
    tags = re.findall(r"</?[a-zA-Z]+>", step_text)
    if tags and tags[-1] == "<step>":
        tags = tags[:-1]
    return 1.0 if tags in _STEP_TAGS else -2.0


def step_sequences(trajectory: Trajectory) -> tuple[list[tuple[int, int]], list[list[int]], list[str]]:
    """Per model turn: its token span, the ids up to the end of its step (the turn and the
    observation after it), and the step's text."""
    spans, seqs, texts, pos = [], [], [], 0
    ids = trajectory.token_ids
    segs = trajectory.segments
    for i, seg in enumerate(segs):
        if seg.role == "model":
            end = pos + len(seg.token_ids)
            step_end, text = end, seg.text
            if i + 1 < len(segs) and segs[i + 1].role == "observation":
                step_end += len(segs[i + 1].token_ids)
                text += segs[i + 1].text
            spans.append((pos, end))
            seqs.append(ids[:step_end])
            texts.append(text)
        pos += len(seg.token_ids)
    return spans, seqs, texts


class PRMStepScorer:
    """``algo.step_scorer: prm``: each model turn scores σ(PRM(prefix + step)) — ProRAG's step
    reward (``prorag/rl/rollout.py``) — plus, with ``format_term``, :func:`prorag_step_format`.

    ``path``: a PRM folder, loaded on ``device`` (the policy's: bf16 on a GPU) ONCE PER NODE: with
    several ranks, local rank 0 loads it and serves it to the node's other ranks
    (:func:`node_local_prm`); ``url``: a ``harness serve prm`` server instead. :meth:`score_many`
    scores all turns of an RL step's rollouts together, in batches of ``batch_size``."""

    def __init__(
        self,
        path: str | None = None,
        url: str | None = None,
        format_term: bool = False,
        batch_size: int = 8,
        device: str | torch.device | None = None,
        window: ScoringWindow | None = None,
    ) -> None:
        if (path is None) == (url is None):
            raise ValueError("the prm step scorer needs exactly one of algo.step_scorer_path or algo.step_scorer_url")
        self.format_term, self.batch_size, self.window = format_term, batch_size, window
        self.prm, self.url = node_local_prm(path, device) if path else (None, None)
        if url:
            self.url = url.rstrip("/")

    def raw_scores(self, seqs: list[list[int]]) -> list[float]:
        if not seqs:
            return []
        if self.prm is not None:
            return self.prm.score(seqs, self.batch_size, self.window)
        body: dict[str, Any] = {"sequences": seqs}
        if self.window is not None:
            body["window"] = dataclasses.asdict(self.window)
        r = httpx.post(f"{self.url}/score", json=body, timeout=600.0)
        if r.status_code != 200:
            raise RuntimeError(f"PRM server {self.url}: HTTP {r.status_code}: {r.text[:300]}")
        return [float(x) for x in r.json()["scores"]]

    def score_many(self, trajectories: list[Trajectory]) -> list[list[tuple[int, int, float]]]:
        """:meth:`score_steps` of every trajectory, their turns scored together (one request or
        one batched pass over the step, not one per trajectory)."""
        parts = [step_sequences(t) for t in trajectories]
        raw = self.raw_scores([s for _, seqs, _ in parts for s in seqs])
        out, k = [], 0
        for spans, seqs, texts in parts:
            mine, k = raw[k : k + len(seqs)], k + len(seqs)
            out.append(
                [
                    (
                        a,
                        b,
                        float(torch.sigmoid(torch.tensor(r))) + (prorag_step_format(text) if self.format_term else 0.0),
                    )
                    for (a, b), r, text in zip(spans, mine, texts, strict=True)
                ]
            )
        return out

    def score_steps(self, trajectory: Trajectory) -> list[tuple[int, int, float]]:
        return self.score_many([trajectory])[0]


# ---- one PRM per node ---------------------------------------------------------------------------
def _rendezvous_file() -> Path:
    """Node-local (the temp dir) and per job (the launcher's master address and port)."""
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT", "0")
    return Path(tempfile.gettempdir()) / f"harness-prm-{addr}-{port}.json"


def _healthy(url: str, path: str) -> bool:
    try:
        r = httpx.get(f"{url}/health", timeout=5.0)
        return r.status_code == 200 and r.json().get("path") == path
    except (httpx.HTTPError, ValueError):
        return False


def node_local_prm(
    path: str, device: str | torch.device | None = None, timeout_s: float = 1800.0
) -> tuple[PRM | None, str | None]:
    """The PRM of ``path`` for this rank: ``(PRM, None)`` on local rank 0 (loaded on ``device``)
    or in a single process; ``(None, url)`` on the node's other ranks.

    With ``WORLD_SIZE`` > 1, local rank 0 loads the PRM and serves it on 127.0.0.1 (the ``harness
    serve prm`` app, in a daemon thread) and writes the URL to a node-local rendezvous file; the
    other local ranks wait for that file and a healthy server (the job's master address and port
    name the file, and the server must report this PRM's path, so a stale file is never used)."""
    world, local_rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0"))
    if world <= 1:
        return load_prm(path, device=device), None
    meet = _rendezvous_file()
    if local_rank == 0:
        meet.unlink(missing_ok=True)  # a previous job's
        prm = load_prm(path, device=device)
        url = _serve_in_thread(prm, str(path))
        tmp = meet.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"url": url, "path": str(path), "kind": "harness-prm-rendezvous"}))
        tmp.replace(meet)

        atexit.register(meet.unlink, missing_ok=True)
        logger.info("PRM %s on %s, served to this node's ranks at %s", path, prm.device, url)
        return prm, None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            url = json.loads(meet.read_text())["url"]
            if _healthy(url, str(path)):
                return None, url
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(2.0)
    raise TimeoutError(f"local rank {local_rank}: no PRM server from local rank 0 after {timeout_s:.0f} s ({meet})")


def serve(
    path: str,
    host: str = "127.0.0.1",
    port: int = 8010,
    batch_size: int = 8,
    threads: int | None = None,
    max_tokens: int | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """``harness serve prm``: load the PRM folder ``path`` and serve it (:mod:`training.prm.prm_server`)
    until interrupted; sequences over ``max_tokens`` are refused (413). ``ready(url)``: called
    once the socket listens (:func:`harness.ports.serve_app`)."""
    app = create_app(load_prm(path, threads), path, batch_size, max_tokens or MAX_TOKENS)
    serve_app(app, host, port, ready, log_level="warning", access_log=False)


def _serve_in_thread(prm: PRM, path: str) -> str:
    """Start the PRM app on a free local port in a daemon thread; returns its URL once healthy."""
    # deferred: uvicorn costs ~0.1 s at import, only for a server
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(prm, path), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    threading.Thread(target=server.run, name="prm-server", daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if _healthy(url, path):
            return url
        time.sleep(0.1)
    raise RuntimeError(f"the node's PRM server did not start at {url}")
