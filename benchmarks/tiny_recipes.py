"""Tiny training recipes for checks that run ``harness train`` end to end in seconds on a CPU: a
random one-layer Llama on the byte tokenizer (``model.tiny``), trained by GRPO on the packaged demo
questions or by SFT on a few chat records. The fault battery (a program) and the
tests write them into their scratch folders; they check that training runs, not what it learns.

Each takes ``key.path=value`` overrides, read as on the command line (:func:`harness.config.parse_overrides`),
so a check states only where its recipe differs from the tiny one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from harness.config import deep_merge, parse_overrides

# A random Llama small enough that a training step takes well under a second on one CPU thread.
TINY_MODEL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}

_QUIET_TRAINER = {"tensorboard": False, "progress": False}


def _yaml(recipe: dict[str, Any], overrides: tuple[str, ...]) -> str:
    return yaml.safe_dump(deep_merge(recipe, parse_overrides(overrides)), sort_keys=False, default_flow_style=None)


def grpo_recipe(name: str, *overrides: str) -> str:
    """YAML text of a tiny GRPO recipe named ``name``: Search-R1 rollouts (one turn, 2 samples of
    2 prompts a step) on 8 demo test questions, the in-memory retriever, 2 steps with a checkpoint
    at step 2, ``overrides`` (``key.path=value``) applied over it."""
    recipe = {
        "name": name,
        "model": {"tiny": TINY_MODEL},
        "data": {"dataset": "demo", "split": "test", "limit": 8},
        "rollout": {
            "method": "search_r1",
            "n_samples": 2,
            "prompts_per_step": 2,
            "sampling": {"max_new_tokens": 24},
            "agent": {"max_turns": 1, "max_total_tokens": 300, "chat": False, "max_doc_tokens": 24},
        },
        "retriever": {"kind": "memory"},
        "algo": {"advantage": "grpo"},
        "optim": {"lr": 1.0e-2, "micro_batch_size": 1},
        "trainer": {"max_steps": 2, "save_every": 2, **_QUIET_TRAINER},
    }
    return _yaml(recipe, overrides)


def sft_recipe(folder: Path, *overrides: str, name: str = "sft-tiny") -> Path:
    """Write a tiny SFT recipe named ``name`` (``folder/sft.yaml``) on four one-turn chat records
    (``folder/chat.jsonl``, each answer in ``<answer>`` tags): batches of 2, 4 steps, a checkpoint
    every step, the newest 2 kept, ``overrides`` (``key.path=value``) applied over it. Returns the
    recipe's path."""
    chat = folder / "chat.jsonl"
    turns = [(f"Q{i}?", f"<answer>A{i}</answer>") for i in range(4)]
    records = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in turns]
    chat.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    recipe = {
        "name": name,
        "model": {"tiny": TINY_MODEL},
        "algo": {"kind": "sft"},
        "sft": {"batch_size": 2, "sources": [{"kind": "chat", "path": str(chat)}]},
        "optim": {"lr": 1.0e-3, "micro_batch_size": 2, "threads": 1},
        "trainer": {"max_steps": 4, "save_every": 1, "keep_checkpoints": 2, **_QUIET_TRAINER},
    }
    path = folder / "sft.yaml"
    path.write_text(_yaml(recipe, overrides), encoding="utf-8")
    return path
