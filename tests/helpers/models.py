"""Random models for tests that need real weights but no download."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from training.engine import TINY_DEFAULTS


def random_llama(vocab_size: int, seed: int = 0, **config) -> LlamaForCausalLM:
    """A randomly initialised Llama (seeded: the same ``seed`` gives the same weights) of the tiny
    training model's shape (:data:`training.engine.TINY_DEFAULTS`: 2 layers, hidden 64) over
    ``vocab_size`` tokens; ``config`` sets or overrides other ``LlamaConfig`` fields."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, **{**TINY_DEFAULTS, **config}))
