"""The :class:`System` record, the two registries a seed system's module fills, and its registration.

A seed system is one module under ``pipelines/dialects/`` (``research.py``, ``search_r1.py``, ...):
its protocol functions, a :class:`System` record and one :func:`register` call (plus
:func:`pipelines.dialects.small.register` for a ``<name>_small`` variant). ``pipelines.dialects``
imports every such module, so registering is importing; ``docs/adding_a_system.md`` walks through
a new one.

The record names what lives in the rooms above ``pipelines`` by registry NAME, since pipelines
imports neither: the metric profile (``benchmarks.profiles.PROFILES``) and the default reward
(``training.rewards.REWARDS``); ``tests/pipelines/test_systems.py`` checks that they resolve and
that the shipped config files exist and parse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.registry import Registry
from pipelines.dialects.base import Dialect, shipped_template

# How a synthesized turn wraps its text (``training.synthesize``): (dialect, the lead sentence,
# the query / answer block already in the dialect's tags) → the model turn.
TurnFn = Callable[[Dialect, str, str], str]


def thought_search_turn(d: Dialect, lead: str, query: str) -> str:
    """The reasoning in the dialect's think tags, then the query block."""
    return f"{d.think_open} {lead} {d.think_close}\n{query}"


def thought_final_turn(d: Dialect, lead: str, answer: str) -> str:
    """The reasoning in the dialect's think tags, then the answer block."""
    return f"{d.think_open} {lead} {d.think_close}\n{answer}"


@dataclass(frozen=True)
class SynthTurns:
    """How ``harness data synthesize`` writes a trajectory's model turns in a system's tags.

    ``search`` and ``final`` wrap a search turn and the answering turn (:data:`TurnFn`);
    ``sub_answer(d, fact)``, when set, is a model turn written after every search's observation
    (ProRAG's ``<subanswer>`` step), followed by the dialect's ``continue_text``."""

    search: TurnFn = thought_search_turn
    final: TurnFn = thought_final_turn
    sub_answer: Callable[[Dialect, str], str] | None = None


THOUGHT_TURNS = SynthTurns()


@dataclass(frozen=True)
class System:
    """One seed system: what the rest of the harness needs to know of it, by name.

    ``name``: its dialect and agent method (``harness eval --method NAME``); ``profile``: its
    metric profile (``--metric-profile``, a ``benchmarks.profiles.PROFILES`` name); ``reward``: the
    ``training.rewards.REWARDS`` reward its policy training uses (``None`` when it trains no policy
    with one); ``configs``: its shipped config files, relative to the checkout (dialect template,
    methods and replicate configs, judge prompt, training recipes and their demo versions);
    ``flashrag_differences``: what FlashRAG's own port of it does differently from the original
    (``harness prompt`` prints them); ``turns``: how a synthesized SFT turn is written."""

    name: str
    profile: str
    reward: str | None
    configs: tuple[str, ...]
    flashrag_differences: tuple[str, ...] = ()
    turns: SynthTurns = THOUGHT_TURNS


SYSTEMS: Registry[System] = Registry("seed system")
DIALECTS: Registry[Dialect] = Registry("dialect")


def synth_turns(dialect: str) -> SynthTurns:
    """How a synthesized turn is written in ``dialect``: its system's way, or (the ``_small``
    variants, whose wording is ours) the reasoning in think tags."""
    return SYSTEMS.get(dialect).turns if dialect in SYSTEMS else THOUGHT_TURNS


def register(system: System, extra_options: dict[str, Any] | None = None, **kw: Any) -> None:
    """Register ``system`` and its exact dialect: its template file
    (``configs/dialects/<name>.yaml``) with the protocol in ``kw`` (and per-mode protocols in
    ``kw["modes"]``); ``extra_options`` go to :attr:`Dialect.options`."""
    name = system.name
    t = shipped_template(name)
    differences = t.get("differences") or {}
    if not isinstance(differences, dict):
        raise ValueError(f"configs/dialects/{name}.yaml: 'differences' maps a mode to a list")
    modes = kw.pop("modes", {})
    if modes and len({frozenset(o) for o in modes.values()}) != 1:
        raise ValueError(f"dialect {name!r}: every mode must set the same fields (switching must not leak one)")
    modes = {m: {**o, "differences": tuple(differences.get(m, ()))} for m, o in modes.items()}
    d = Dialect(
        name=name,
        system=t["system"],
        template=t["template"],
        base_template=t.get("base_template"),
        placement=t["placement"],
        question_mark=bool(t.get("question_mark", False)),
        source={**t["source"], "template_file": f"configs/dialects/{name}.yaml"},
        options={
            "flashrag_differences": system.flashrag_differences,
            "notes": tuple(t.get("notes", ())),
            **(extra_options or {}),
        },
        differences=tuple(differences.get(kw.get("mode", "single"), ())),
        modes=modes,
        **kw,
    )
    SYSTEMS.register(name, system)
    DIALECTS.register(name, d.with_mode(d.mode) if modes else d)
