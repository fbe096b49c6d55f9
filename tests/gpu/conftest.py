"""The GPU tier (``make test-gpu``): every module here is marked ``gpu`` and ``slow``; plain ``pytest``
deselects them (pyproject ``addopts``), and without CUDA they skip, saying why. ``.ci/run`` prints
``GPU TIER NOT RUN`` when the machine has no GPU."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _cuda_or_skip():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the GPU tier needs one (make test-gpu on a GPU machine)")
