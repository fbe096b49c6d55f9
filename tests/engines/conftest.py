"""The real-engine tier (``make test-engines``): real SGLang and vLLM servers on loopback, started
from the venvs ``scripts/build_engine_venvs.sh`` builds, serving the embedded SmolLM2.

Every test module here is marked ``engines`` (and ``slow``); plain ``pytest`` deselects them
(pyproject ``addopts``) and they skip, saying why, when an engine's venv is missing. Each engine runs in float32 so that
differences from the in-process ``hf`` backend are the engines' kernels, not a precision change.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engines import EngineConfig, EngineProcess, engine_dir, engine_ready, launched

# float32 on both engines (their "auto" turns a float32 checkpoint into float16). SGLang on CPU
# otherwise sizes its KV pool from free RAM (~15 GB here); 32k tokens (1.5 GB) is plenty. vLLM
# reserves that share of RAM.
ENGINE_ARGS = {
    "sglang": ["--dtype", "float32", "--max-total-tokens", "32768"],
    "vllm": ["--dtype", "float32", "--gpu-memory-utilization", "0.3"],
}


@pytest.fixture(scope="session")
def model_dir() -> str:
    from harness.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


def _serve(engine: str, model_dir: str, log_dir: Path) -> Iterator[EngineProcess]:
    if not engine_ready(engine):  # type: ignore[arg-type]
        pytest.skip(f"no {engine} venv under {engine_dir()}: run scripts/build_engine_venvs.sh (make test-engines)")
    cfg = EngineConfig(device="cpu", args=ENGINE_ARGS[engine], health_timeout=900.0)
    with launched(engine, model_dir, cfg, log_dir=log_dir) as proc:  # type: ignore[arg-type]
        yield proc


@pytest.fixture(scope="module")
def sglang_server(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    yield from _serve("sglang", model_dir, tmp_path_factory.mktemp("sglang-logs"))


@pytest.fixture(scope="module")
def vllm_server(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    yield from _serve("vllm", model_dir, tmp_path_factory.mktemp("vllm-logs"))


@pytest.fixture(scope="session")
def hf_backend(model_dir: str):
    from harness.backends.hf import HFBackend

    backend = HFBackend(model=model_dir, dtype="float32", max_batch_size=8, threads=1)
    yield backend
    backend.close()
