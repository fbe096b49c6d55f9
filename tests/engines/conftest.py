"""The real-engine tier (``make test-engines``): real SGLang and vLLM servers on loopback, started
from the venvs ``scripts/build_engine_venvs.sh`` builds, serving the embedded SmolLM2.

Every test module here is marked ``engines`` (and ``slow``); plain ``pytest`` deselects them
(pyproject ``addopts``), and they skip, saying why, when an engine's venv is missing. Engines run
in float32 (``checks.ENGINE_ARGS``) so that differences from the in-process ``hf`` backend are the
engines' kernels, not a precision change.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def model_dir() -> str:
    from harness.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def hf_backend(model_dir: str):
    from harness.backends.hf import HFBackend

    backend = HFBackend(model=model_dir, dtype="float32", max_batch_size=8, threads=1)
    yield backend
    backend.close()
