"""The method registry: every name ``harness eval --method`` accepts, and the method protocol.

Agent methods are the one search agent with a dialect; baselines are FlashRAG's pipelines.
Each registered builder takes (backend, retriever, options dict) and returns a :class:`Method`;
its registry info says whether it is an ``agent`` or a ``baseline`` and whether it needs a
retriever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.config import ConfigError, from_dict
from harness.registry import Registry
from pipelines.baselines.flashrag_methods import BASELINES, WITHOUT_RETRIEVAL, BaselineConfig, FlashRAGBaseline
from pipelines.dialects import SYSTEMS
from pipelines.method import Method, check_schedule

__all__ = [
    "AGENT_METHODS",
    "CHAT_API_METHOD",
    "check_method_backend",
    "METHODS",
    "Method",
    "build_method",
    "check_method_schedule",
    "method_kind",
    "needs_retriever",
    "validate_options",
]

METHODS: Registry = Registry("method")

# One agent method per seed system (pipelines/dialects/<name>.py registers it), under its name.
AGENT_METHODS = tuple(SYSTEMS.names())


def _agent_builder(dialect: str):
    def build(backend: Any, retriever: Any, options: dict[str, Any]) -> Any:
        # deferred: pipelines.search_agent imports flashrag and torch (seconds)
        from pipelines.search_agent import AgentConfig, SearchAgent

        cfg = options if isinstance(options, AgentConfig) else from_dict(AgentConfig, options, where="agent")
        return SearchAgent(backend, retriever, dialect=dialect, config=cfg, method=dialect)

    return build


# The tool_call agent through a chat-completions server (``tools=``; the server applies its own
# template): a second way to evaluate that agent, never a rollout (no token ids come back).
CHAT_API_METHOD = "tool_call_chat"
CHAT_BACKENDS = ("openai", "sglang")  # backend kinds that serve /v1/chat/completions


def _refuse_backend(name: str, backend_kind: str) -> ConfigError:
    return ConfigError(
        f"--method {name} talks to an OpenAI-compatible chat server: backend.kind must be one of "
        f"{', '.join(CHAT_BACKENDS)} (with backend.url), not {backend_kind!r}; the same agent on tokens is "
        "--method tool_call"
    )


def _chat_api_builder(backend: Any, retriever: Any, options: dict[str, Any]) -> Any:
    # deferred: pipelines.search_agent imports flashrag and torch (seconds)
    from pipelines.chat_agent import ChatToolAgent
    from pipelines.search_agent import AgentConfig

    if not callable(getattr(backend, "post_json", None)):
        raise _refuse_backend(CHAT_API_METHOD, type(backend).__name__)
    cfg = options if isinstance(options, AgentConfig) else from_dict(AgentConfig, options, where="agent")
    return ChatToolAgent(backend, retriever, cfg)


def _baseline_builder(name: str):
    def build(backend: Any, retriever: Any, options: dict[str, Any]) -> Any:
        cfg = from_dict(BaselineConfig, options, where="baseline")
        return FlashRAGBaseline(name, backend, retriever, cfg)

    return build


# ``pauses_between_steps``: what the built method says (SearchAgent's and FlashRAGBaseline's class
# attribute), known before it is built, so a run of several (method, dataset) pairs refuses a
# schedule one of them cannot run before the first starts (build_eval checks the built one too).
for _d in AGENT_METHODS:
    METHODS.register(_d, _agent_builder(_d), kind="agent", needs_retriever=True, pauses_between_steps=True)
METHODS.register(
    CHAT_API_METHOD,
    _chat_api_builder,
    kind="agent",
    needs_retriever=True,
    pauses_between_steps=False,  # ChatToolAgent's: each item's turns go to the server as they come
    backends=CHAT_BACKENDS,
)
for _b in BASELINES:
    METHODS.register(
        _b,
        _baseline_builder(_b),
        kind="baseline",
        needs_retriever=_b not in WITHOUT_RETRIEVAL,
        pauses_between_steps=FlashRAGBaseline.pauses_between_steps,
    )


@dataclass(frozen=True)
class _Declared:
    """What :func:`pipelines.method.check_schedule` reads of a method, from its registration."""

    method: str
    pauses_between_steps: bool


def check_method_schedule(name: str, schedule: str) -> None:
    """:func:`pipelines.method.check_schedule` for the method registered as ``name``, before it is built."""
    METHODS.get(name)
    check_schedule(_Declared(name, bool(METHODS.info(name)["pauses_between_steps"])), schedule)


def check_method_backend(name: str, backend_kind: str) -> None:
    """Refuse, before anything is built, a method that needs a kind of backend ``backend_kind``
    is not (the chat-API agent needs a chat-completions server)."""
    kinds = METHODS.info(name).get("backends")
    if kinds and backend_kind not in kinds:
        raise _refuse_backend(name, backend_kind)


def validate_options(name: str, options: dict[str, Any], where: str | None = None) -> Any:
    """The method's typed options (``AgentConfig`` or ``BaselineConfig``); raises ``ConfigError``
    naming a wrong key or value under ``where`` (default ``agent`` / ``baseline``). Cheap:
    nothing is built."""
    if method_kind(name) == "agent":
        # deferred: pipelines.search_agent imports flashrag and torch (seconds)
        from pipelines.search_agent import AgentConfig

        return from_dict(AgentConfig, options, where=where or "agent")

    return from_dict(BaselineConfig, options, where=where or "baseline")


def build_method(name: str, backend: Any, retriever: Any, options: Any = None) -> Method:
    """The method ``name`` over ``backend`` and ``retriever``; ``options``: its options as a dict,
    or an agent method's already validated ``AgentConfig`` (used as is)."""
    return METHODS.get(name)(backend, retriever, options or {})


def method_kind(name: str) -> str:
    METHODS.get(name)
    return METHODS.info(name)["kind"]


def needs_retriever(name: str) -> bool:
    METHODS.get(name)
    return bool(METHODS.info(name)["needs_retriever"])
