"""Generator backends: one token-in/token-out protocol (see ``base``), built from their config."""

from harness.backends.base import Backend, BackendBase, BackendError, Completion, SamplingParams, WeightUpdate
from harness.registry import Registry

BACKENDS: Registry = Registry("backend")
BACKENDS.register("scripted", "harness.backends.scripted:ScriptedBackend")
BACKENDS.register("hf", "harness.backends.hf:HFBackend")
BACKENDS.register("sglang", "harness.backends.sglang:SGLangBackend")
BACKENDS.register("openai", "harness.backends.openai:OpenAIBackend")


def build_backend(cfg) -> Backend:
    """A backend from a :class:`~harness.eval_config.BackendConfig`, through its class's ``from_config``."""
    return BACKENDS.get(cfg.kind).from_config(cfg)


__all__ = [
    "BACKENDS",
    "build_backend",
    "Backend",
    "BackendBase",
    "BackendError",
    "Completion",
    "SamplingParams",
    "WeightUpdate",
]
