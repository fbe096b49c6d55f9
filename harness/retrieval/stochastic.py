"""Stochastic dense retrieval (HARR): a retrieval is a Plackett–Luce sample, so it has a log-probability.

HARR ("Reinforcement Fine-Tuning for History-Aware Dense Retriever in RAG") trains the query
encoder of a dense retriever with RL against the final answer's reward. Two pieces make that
possible, both here:

- **Stochastic retrieval.** The top-N candidates by similarity come from the FAISS index; k of
  them are drawn without replacement from Plackett–Luce over ``sim / tau`` (by the Gumbel-top-k
  trick, which gives exactly that distribution). The ordered list's log-probability is
  ``sum_i [s_(i) - logsumexp(s over candidates not yet drawn)]``. With ``greedy=True`` the
  top-k is returned as is (evaluation), still with its PL log-probability.
- **History-aware state.** The text the query tower encodes is the current query plus the
  trajectory's earlier steps, each sub-query with its parsed sub-answer as HARR keeps them
  (``generator.py``, ``tool.py``; :func:`render_state`), so the same
  sub-query at different points of a multi-hop chain is not aliased. The default format is the
  one of HARR's release (``llama_index_hacked/tool.py``: ``Original Question: ...`` /
  ``History: <json>`` / ``Query: ...``); template and length caps are config.

Document embeddings stay fixed (the index is not rebuilt); only the query tower
(:class:`QueryTower`, any HF embedding model with its pooling and prefix, fully trained or with
LoRA via ``peft``) changes. Each ``search`` returns a :class:`SampledResults`: the protocol's
``list[list[Doc]]`` carrying one JSON-ready sampling record per query in ``.samples`` (state text,
candidate ids, sampled positions and ids, log-prob, tau), from which training recomputes the
log-probabilities under the current encoder (:meth:`StochasticDenseRetriever.recompute_logprobs`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from harness.retrieval.encoders import SIDECAR, EncoderSpec, load_hf_encoder, read_sidecar, resolve_encoder
from harness.retrieval.index import load_index
from harness.retrieval.state import DEFAULT_STATE_TEMPLATE, RetrievalState
from harness.types import Doc

logger = logging.getLogger(__name__)


# ---- Plackett–Luce -----------------------------------------------------------------------------
def pl_log_prob(scores: torch.Tensor, order: torch.Tensor, order_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probability of ordered draws without replacement under Plackett–Luce.

    scores [B, C] (logits; ``-inf`` marks padding), order [B, k] (candidate positions, in draw
    order), order_mask [B, k] (False: padding, contributes 0) → [B].
    """
    B, k = order.shape
    if order_mask is None:
        order_mask = torch.ones(B, k, dtype=torch.bool, device=scores.device)
    taken = torch.zeros_like(scores, dtype=torch.bool)  # [B, C]
    total = scores.new_zeros(B)  # [B]
    safe_order = torch.where(order_mask, order, torch.zeros_like(order))  # [B, k]
    for i in range(k):
        logits = scores.masked_fill(taken, float("-inf"))  # [B, C]
        pick = safe_order[:, i : i + 1]  # [B, 1]
        step = logits.gather(1, pick).squeeze(1) - torch.logsumexp(logits, dim=1)  # [B]
        total = total + torch.where(order_mask[:, i], step, torch.zeros_like(step))
        taken = taken | (torch.zeros_like(taken).scatter(1, pick, True) & order_mask[:, i : i + 1])
    return total


def pl_sample(scores: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """k positions drawn without replacement from Plackett–Luce over ``scores`` [C] → [k] (draw order).

    Gumbel-top-k: the k largest of ``scores + Gumbel noise``, sorted, have exactly the PL
    distribution of ordered draws without replacement.
    """
    u = torch.rand(scores.shape, generator=generator, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)  # [C]
    perturbed = scores.double() - torch.log(-torch.log(u))  # [C]
    return torch.topk(perturbed, min(k, scores.numel())).indices  # [k]


def call_seed(seed: int, salt: int, query: str, state: RetrievalState | None, text: str, position: int) -> int:
    """The seed of one retrieval's sample: a stable hash of everything that identifies the call.

    (base seed, salt (the trainer's step), the trajectory key (example id + sample index), the
    turn (history length), the query, the encoder's text and the query's position in its batch).
    Identical calls get identical samples; the G samples of one question differ by their key.
    """
    key = state.key if state is not None else ""
    turn = len(state.history) if state is not None else -1
    blob = json.dumps([seed, salt, key, turn, position, query, text], ensure_ascii=False).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") & ((1 << 63) - 1)


# ---- the history-aware state -------------------------------------------------------------------
@dataclass(frozen=True)
class StateFormat:
    """How a :class:`RetrievalState` becomes the encoder's text.

    ``stateful=False`` encodes the bare query (plain dense retrieval). Otherwise the template gets
    ``question``, ``query`` and ``history``: with ``history="harr"`` (the default) a JSON list of
    ``{"sub_query", "answer"}``, one per earlier model turn, as HARR's ``tool.py`` /
    ``generator.py`` build it (``json.dumps(history, ensure_ascii=False)``); with ``"titles"``
    (towers saved before the sub-answer existed) a JSON list of ``{"query", "retrieved": [titles]}``
    with at most ``max_titles`` titles each. Only the ``max_history`` most recent steps are kept
    (HARR keeps all: set it high); past ``max_chars`` the oldest steps are dropped, then the text is
    cut from the left so the current query (at the end) survives the tokenizer's truncation.
    """

    stateful: bool = True
    history: Literal["harr", "titles"] = "harr"
    template: str = DEFAULT_STATE_TEMPLATE
    max_history: int = 4
    max_titles: int = 5
    max_chars: int = 1024


def state_format_of(path: str | Path | None) -> StateFormat:
    """The state format a saved tower was trained with (its sidecar's ``state``), else the default."""
    side = read_sidecar(path) if path is not None and Path(path).is_dir() else None
    state = (side or {}).get("state")
    if state is None:
        return StateFormat()
    try:
        # A tower saved before the history kinds existed was trained on the titles rendering.
        return StateFormat(**{"history": "titles", **state})
    except TypeError as e:
        raise ValueError(f"{Path(str(path)) / SIDECAR}: bad 'state' section ({e})") from e


def render_state(query: str, state: RetrievalState | None, fmt: StateFormat) -> str:
    """The text the query tower encodes for ``query`` in ``state``."""
    if not fmt.stateful or state is None:
        return query
    source = state.turns or state.history if fmt.history == "harr" else state.history
    steps = list(source)[-fmt.max_history :] if fmt.max_history > 0 else []
    while True:
        if fmt.history == "harr":
            hist: list[dict[str, Any]] = [{"sub_query": s.query, "answer": s.answer} for s in steps]
        else:
            hist = [{"query": s.query, "retrieved": list(s.titles[: fmt.max_titles])} for s in steps]
        text = fmt.template.format(question=state.question, history=json.dumps(hist, ensure_ascii=False), query=query)
        if len(text) <= fmt.max_chars or not steps:
            break
        steps = steps[1:]
    return text if len(text) <= fmt.max_chars else text[-fmt.max_chars :]


# ---- the trainable query tower -----------------------------------------------------------------
class QueryTower(torch.nn.Module):
    """An HF embedding model as a trainable query encoder: ``forward(texts) -> [B, H]`` unit vectors.

    Also satisfies the :class:`~harness.retrieval.encoders.Encoder` interface (``encode``,
    ``dim``, ``spec``), so it can build and search ordinary dense indexes. ``lora_r > 0`` wraps
    the model with ``peft`` LoRA (only the adapters train). ``model``/``tokenizer`` pass a loaded
    model (tests: a tiny random BERT).
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        spec: EncoderSpec | None = None,
        lora_r: int = 0,
        lora_alpha: int = 16,
        lora_dropout: float = 0.0,
        lora_targets: list[str] | None = None,
        max_length: int | None = None,
        batch_size: int = 64,
    ) -> None:
        super().__init__()
        # A tower saved by save() (or a LoRA adapter dir) carries its pooling/prefixes in a sidecar.
        self.spec = spec or resolve_encoder(name)
        if model is None:
            loaded_tok, model = load_hf_encoder(self.spec)
            tokenizer = tokenizer or loaded_tok
            if self.spec.base is not None:  # merged already: the saved dir is a plain model from here on
                self.spec = replace(self.spec, base=None)
        if tokenizer is None:
            # deferred: transformers costs ~0.8 s at import
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.spec.path)
        self.tokenizer = tokenizer
        self.lora = lora_r > 0
        if self.lora:
            # deferred: optional extra (harness[train])
            from peft import LoraConfig, get_peft_model

            targets = lora_targets or ["query", "key", "value"]  # BERT-style attention names
            model = get_peft_model(
                model, LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=targets)
            )
        # Dropout stays off for good: the rollout-time log-probs and the recomputed ones must come
        # from the same function, or the PPO ratio is noise even before any update.
        self.model = model.eval()
        self.dim = int(model.config.hidden_size)
        self.max_length = max_length or self.spec.max_length or 256
        self.batch_size = batch_size
        self._reference: Any = None

    def train(self, mode: bool = True) -> QueryTower:
        """Kept in eval mode (no dropout) whatever ``mode`` says; gradients are unaffected."""
        super().train(False)
        return self

    def forward(self, texts: list[str], kind: str = "query", model: Any = None) -> torch.Tensor:
        """[len(texts), H] L2-normalised embeddings, with gradients when grad is enabled."""
        prefix = self.spec.query_prefix if kind == "query" else self.spec.passage_prefix
        enc = self.tokenizer(
            [prefix + t for t in texts], padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        hidden = (model or self.model)(**enc).last_hidden_state  # [B, L, H]
        if self.spec.pooling == "cls":
            vec = hidden[:, 0]  # [B, H]
        else:
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
            vec = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [B, H]
        return torch.nn.functional.normalize(vec, dim=-1) if self.spec.normalize else vec

    def encode(self, texts: list[str], kind: str = "passage") -> Any:
        """The Encoder interface: ``[N, H]`` float32 numpy, no gradients, in batches."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for s in range(0, len(texts), self.batch_size):
                out[s : s + self.batch_size] = self.forward(texts[s : s + self.batch_size], kind).float().numpy()
        return out

    def freeze_reference(self) -> None:
        """Keep the current weights as the KL reference (LoRA: the base model, adapters off)."""
        if not self.lora:
            self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)

    def reference_forward(self, texts: list[str], kind: str = "query") -> torch.Tensor:
        """Embeddings under the reference (initial) weights, no gradients. [B, H]"""
        with torch.no_grad():
            if self.lora:
                with self.model.disable_adapter():
                    return self.forward(texts, kind)
            if self._reference is None:
                raise RuntimeError("call freeze_reference() before training to keep the initial encoder")
            return self.forward(texts, kind, model=self._reference)

    def sidecar(self, **extra: Any) -> dict[str, Any]:
        """What :data:`SIDECAR` records: pooling, prefixes, max length, normalisation (+ ``extra``)."""
        s = self.spec
        side = {"pooling": s.pooling, "query_prefix": s.query_prefix, "passage_prefix": s.passage_prefix}
        return {**side, "max_length": self.max_length, "normalize": s.normalize, **extra}

    def save(self, out_dir: str | Path, **extra: Any) -> Path:
        """A normal HF model dir (LoRA merged) that ``Encoder``/``--encoder`` loads, plus the sidecar.

        ``extra`` goes into the sidecar (the trainer adds the state format and tau). With LoRA the
        adapter alone also lands in ``out/adapter`` (with a sidecar naming its base), loadable by
        ``--encoder out/adapter`` when the base model dir is at hand.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model = self.model
        if self.lora:
            self.model.save_pretrained(out / "adapter")
            self.tokenizer.save_pretrained(out / "adapter")
            side = self.sidecar(base=self.spec.path, **extra)
            (out / "adapter" / SIDECAR).write_text(json.dumps(side, indent=2) + "\n", encoding="utf-8")
            model = copy.deepcopy(self.model).merge_and_unload()
        model.save_pretrained(out, safe_serialization=True)
        self.tokenizer.save_pretrained(out)
        (out / SIDECAR).write_text(json.dumps(self.sidecar(**extra), indent=2) + "\n", encoding="utf-8")
        return out


# ---- the retriever -----------------------------------------------------------------------------
class SampledResults(list):
    """``list[list[Doc]]`` (the retriever protocol) with one sampling record per query in ``samples``."""

    def __init__(self, results: list[list[Doc]], samples: list[dict[str, Any]]) -> None:
        super().__init__(results)
        self.samples = samples


class StochasticDenseRetriever:
    """Plackett–Luce sampling over a dense index's top-N, with a trainable query tower.

    ``index`` is a loaded dense index (``load_index(dir, encoder=tower)``: its FAISS index, docs and
    id); its document vectors are never changed. ``greedy=True`` returns the top-k (evaluation).
    """

    def __init__(
        self,
        index: Any,
        tower: QueryTower,
        n_candidates: int = 50,
        tau: float = 0.05,
        greedy: bool = False,
        state_format: StateFormat | None = None,
        seed: int = 0,
    ) -> None:
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if n_candidates < 1:
            raise ValueError(f"n_candidates must be >= 1, got {n_candidates}")
        if index.index.d != tower.dim:
            raise ValueError(f"index has {index.index.d}-d vectors but the query tower gives {tower.dim}-d")
        self.faiss_index, self.docs = index.index, index.docs
        self.index_id = f"{index.index_id}+harr"
        self.tower, self.n_candidates, self.tau, self.greedy = tower, n_candidates, tau, greedy
        self.state_format = state_format or StateFormat()
        self.row_of = {d.id: i for i, d in enumerate(self.docs)}
        # Each call draws from its own generator seeded by call_seed(seed, salt, ...): the samples
        # depend on what is asked, never on the order concurrent rollouts ask it in.
        self.seed, self.salt = seed, 0
        self._lock = threading.Lock()

    @classmethod
    def from_index_dir(cls, index_dir: str | Path, tower: QueryTower, **kwargs: Any) -> StochasticDenseRetriever:
        return cls(load_index(index_dir, encoder=tower), tower, **kwargs)

    def save_tower(self, out_dir: str | Path) -> Path:
        """The tower (:meth:`QueryTower.save`) with this retriever's state format and tau in the sidecar,
        so that ``--retriever harr --encoder DIR`` evaluates with the state it was trained on."""
        return self.tower.save(out_dir, state=asdict(self.state_format), tau=self.tau)

    def search(self, queries: list[str], k: int, state: list[RetrievalState | None] | None = None) -> SampledResults:
        """k documents per query (sampled, or top-k when greedy); ``.samples`` holds the records."""
        if state is not None and len(state) != len(queries):
            raise ValueError(f"state has {len(state)} entries for {len(queries)} queries")
        states = list(state or [None] * len(queries))
        texts = [render_state(q, s, self.state_format) for q, s in zip(queries, states, strict=True)]
        if not texts:
            return SampledResults([], [])
        n = min(max(self.n_candidates, k), len(self.docs))
        with self._lock:  # one FAISS search at a time
            vecs = self.tower.encode(texts, kind="query")  # [Q, H]
            sims, rows = self.faiss_index.search(vecs, n)  # [Q, n] each, best first
        greedy, salt = self.greedy, self.salt  # read once: a whole call samples under one setting
        results, samples = [], []
        for pos, (query, st, text, srow, rrow) in enumerate(
            zip(queries, states, texts, sims.tolist(), rows.tolist(), strict=True)
        ):
            valid = [(s, r) for s, r in zip(srow, rrow, strict=True) if r >= 0]
            scores = torch.tensor([s for s, _ in valid], dtype=torch.float32) / self.tau  # [C]
            kk = min(k, len(valid))
            if greedy:
                order = torch.arange(kk)  # [kk]
            else:
                gen = torch.Generator().manual_seed(call_seed(self.seed, salt, query, st, text, pos))
                order = pl_sample(scores, kk, gen)  # [kk]
            logp = float(pl_log_prob(scores[None], order[None])[0]) if kk else 0.0
            picked = [valid[i] for i in order.tolist()]
            results.append([self._doc(r, s) for s, r in picked])
            samples.append(
                {
                    "state": text,
                    "candidates": [self.docs[r].id for _, r in valid],
                    "sampled": order.tolist(),
                    "sampled_ids": [self.docs[r].id for _, r in picked],
                    "logprob": logp,
                    "tau": self.tau,
                    "greedy": greedy,
                }
            )
        return SampledResults(results, samples)

    def _doc(self, row: int, score: float) -> Doc:
        d = self.docs[row]
        return Doc(d.id, d.title, d.text, float(score))

    def doc_vectors(self, doc_ids: list[str]) -> torch.Tensor:
        """The fixed index vectors of ``doc_ids`` → [n, H] (no gradient: documents are not trained)."""
        rows = np.asarray([self.row_of[i] for i in doc_ids], dtype=np.int64)
        return torch.from_numpy(self.faiss_index.reconstruct_batch(rows).copy())

    def recompute_logprobs(self, samples: list[dict[str, Any]], reference: bool = False) -> torch.Tensor:
        """Log-probs of recorded samples under the current tower (or the reference one) → [S].

        Gradients flow into the query tower only; candidate vectors come from the fixed index.
        """
        return self.recompute(samples, reference)[0]

    def recompute(self, samples: list[dict[str, Any]], reference: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs [S], query embeddings of the recorded states [S, H]) under the current (or reference) tower."""
        if not samples:
            return torch.zeros(0), torch.zeros(0, self.tower.dim)
        texts = [s["state"] for s in samples]
        q = self.tower.reference_forward(texts) if reference else self.tower(texts)  # [S, H]
        S, C, K = len(samples), max(len(s["candidates"]) for s in samples), max(len(s["sampled"]) for s in samples)
        D = torch.zeros(S, C, q.shape[1])  # [S, C, H]
        cand_mask = torch.zeros(S, C, dtype=torch.bool)  # [S, C]
        order = torch.zeros(S, K, dtype=torch.long)  # [S, K]
        order_mask = torch.zeros(S, K, dtype=torch.bool)  # [S, K]
        for i, s in enumerate(samples):
            c, kk = len(s["candidates"]), len(s["sampled"])
            D[i, :c] = self.doc_vectors(s["candidates"])
            cand_mask[i, :c] = True
            order[i, :kk] = torch.tensor(s["sampled"], dtype=torch.long)
            order_mask[i, :kk] = True
        tau = torch.tensor([float(s["tau"]) for s in samples])[:, None]  # [S, 1]
        scores = torch.einsum("sh,sch->sc", q.float(), D) / tau  # [S, C]
        scores = scores.masked_fill(~cand_mask, float("-inf"))
        return pl_log_prob(scores, order, order_mask), q  # [S], [S, H]
