"""What ``harness demo --system NAME`` runs for each seed system: its agent, its warm-up and its own
training chain, as data (:class:`DemoSystem`); :mod:`programs.demo.program` runs any of them.

Every system's chain on the demo world is: the baselines and the untrained agent, an SFT warm-up on
trajectories synthesized in the system's dialect, the SFT agent on the ``test`` split, the system's
own training from the SFT model, the trained agent on the ``test`` split, a report and ``demo.md``.
What differs is the training (:attr:`DemoSystem.chain`):

- ``rl``: one or more RL recipes in order, each from the model the one before left (R1-Searcher's
  two stages; a single recipe for ReSearch, Search-R1, RAG-R1 and tool_call);
- ``prorag``: MCTS step values from the SFT model, a PRM trained on them, RFT (samples filtered by
  outcome and PRM, then SFT on the kept ones), and dual-granularity RL with the PRM from the RFT
  model;
- ``harr``: the SFT agent is the frozen generator; the dense retriever's query tower is trained by
  RL, and the generator is evaluated with the untrained tower (before) and the trained one (after).

Each recipe under ``configs/train/demo/`` names the original recipe it shrinks (``source.shrinks``)
and lists every change of scale in ``deviations:`` (``tests/training/test_recipe_sources.py``);
``tool_call`` follows no paper, so its recipe names the demo recipe it adapts (``source.adapts``:
ReSearch's) and lists every difference from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# Shipped configs are looked up from the checkout, so `harness demo` runs from any folder.
ROOT = Path(__file__).resolve().parents[2]
DEMO_RECIPES = "configs/train/demo"
METHODS_CONFIG = "configs/methods/demo_cpu.yaml"
SFT_RECIPE = "configs/train/smollm2_cpu_sft_demo.yaml"


@dataclass(frozen=True)
class DemoSystem:
    """One seed system's demo chain.

    ``method``: the agent method evaluated and trained (HARR's generator is Search-R1's agent);
    ``algorithm``: what its training is, in the learning table's words; ``rl``: the RL recipes in
    order (``chain: rl``: each from the model before; ``prorag``: its final RL; ``harr``: the
    retriever recipe); ``sft``: the warm-up recipe; ``agent``: overrides of the methods config's
    agent block for this system (ProRAG runs its own protocol, which needs more turns);
    ``retriever``: overrides of its retriever block (HARR trains a dense retriever);
    ``stage_names``: each RL recipe's run folder. Every system starts its training from the SFT
    warm-up; where the original starts from the model itself, that is a listed deviation
    (docs/training.md: SmolLM2-135M follows no protocol untrained, so RL from it has no signal)."""

    name: str
    method: str
    algorithm: str
    chain: Literal["rl", "prorag", "harr"]
    rl: tuple[str, ...]
    stage_names: tuple[str, ...] = ("rl",)
    sft: str = SFT_RECIPE
    agent: dict[str, Any] = field(default_factory=dict)
    retriever: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)  # prorag: mcts, prm, rft recipes

    @property
    def default_out(self) -> str:
        return "runs/demo" if self.name == "research" else f"runs/demo-{self.name}"


SYSTEMS: dict[str, DemoSystem] = {
    s.name: s
    for s in (
        DemoSystem(
            name="research",
            method="research",
            algorithm="GRPO (group mean/std), F1 + format reward",
            chain="rl",
            rl=("configs/train/smollm2_cpu_grpo_demo.yaml",),
        ),
        DemoSystem(
            name="search_r1",
            method="search_r1",
            algorithm="PPO, GAE critic, EM reward, k1 KL in the reward",
            chain="rl",
            rl=(f"{DEMO_RECIPES}/search_r1_ppo.yaml",),
        ),
        DemoSystem(
            name="r1_searcher",
            method="r1_searcher",
            algorithm="stage 1 group_norm (retrieval + format), stage 2 Reinforce++ (F1, format penalty)",
            chain="rl",
            rl=(f"{DEMO_RECIPES}/r1_searcher_stage1.yaml", f"{DEMO_RECIPES}/r1_searcher_stage2.yaml"),
            stage_names=("rl1", "rl"),
        ),
        DemoSystem(
            name="rag_r1",
            method="rag_r1",
            algorithm="SFT, then PPO (GAE critic, EM reward), several queries a turn",
            chain="rl",
            rl=(f"{DEMO_RECIPES}/rag_r1_ppo.yaml",),
        ),
        DemoSystem(
            name="prorag",
            method="prorag",
            algorithm="SFT, MCTS step values, PRM, RFT, dual-granularity GRPO with the PRM",
            chain="prorag",
            rl=(f"{DEMO_RECIPES}/prorag_rl.yaml",),
            agent={"variant": "exact", "max_turns": 5, "max_new_tokens": 64, "max_total_tokens": 1024},
            extra={
                "mcts": f"{DEMO_RECIPES}/prorag_mcts.yaml",
                "prm": f"{DEMO_RECIPES}/prorag_prm.yaml",
                "rft": f"{DEMO_RECIPES}/prorag_rft_sft.yaml",
            },
        ),
        DemoSystem(
            name="tool_call",
            method="tool_call",
            algorithm="GRPO (group mean/std) as the ReSearch demo runs it, EM reward, chat-template tool calls",
            chain="rl",
            rl=(f"{DEMO_RECIPES}/tool_call_grpo.yaml",),
            # SmolLM2's own template takes no tools: ours lists the search tool. Declared here
            # once, it reaches the synthesis (the SFT records name it), every evaluation and the
            # RL rollouts (the agent block is copied into rollout.agent). No small variant exists
            # for tool_call: its own text, two searches then one turn without search to answer.
            agent={"variant": "exact", "final_turn": True, "chat_template": "smollm2_tools.jinja"},
        ),
        DemoSystem(
            name="harr",
            method="search_r1",
            algorithm="retriever RL (GRPO on the query tower, Plackett-Luce sampling), generator frozen",
            chain="harr",
            rl=(f"{DEMO_RECIPES}/harr_grpo.yaml",),
            stage_names=("retriever",),
            retriever={"kind": "dense"},
        ),
    )
}


def get_system(name: str) -> DemoSystem:
    """The demo chain of ``name``, or a ValueError that lists the systems."""
    if name not in SYSTEMS:
        raise ValueError(f"--system {name!r} is not a demo system; choose one of {', '.join(SYSTEMS)}")
    return SYSTEMS[name]


def shipped(path: str) -> str:
    """The checkout's copy of a shipped config (the demo's defaults are paths relative to the
    checkout, so `harness demo` runs from any folder; a user's own config paths are taken as given)."""
    return str(ROOT / path)
