"""Replication cards: a seed system's published evaluation setting, read from
``configs/replicate/<name>.yaml``.

A card names the released checkpoint, the dialect and its template, the retriever / corpus / index
and top-k, max turns, the datasets (and subsets), the metric profile, and the paper's numbers with
their source. :func:`load_card` reads one; :func:`card_configs` turns a card into one
:class:`~harness.eval_config.EvalConfig` per dataset (``benchmarks.build`` then builds and runs
them as any ``harness eval`` run); :func:`setting_differences` says, in words, where a run's
setting is not the paper's (model, corpus, index, top-k, subset), so a CPU smoke run is never
mistaken for a replication; :func:`reference_entries` gives the cards' paper numbers as
``harness report --reference`` entries. :mod:`benchmarks.replicate` runs a card and compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.fmt import NAMES
from benchmarks.profiles import apply_profile, get_profile
from benchmarks.report import load_reference
from harness.config import deep_merge, from_dict, load_yaml, read_yaml
from harness.eval_config import EvalConfig

CARDS_DIR = Path(__file__).resolve().parents[1] / "configs" / "replicate"
REPO_ROOT = Path(__file__).resolve().parents[1]
CARD_FIELDS = ("system", "checkpoint", "method", "dialect", "template", "retriever", "datasets", "metric_profile")


@dataclass(frozen=True)
class CardDataset:
    """One dataset of a card; ``label`` is the key its paper numbers use (default: ``name``)."""

    name: str
    split: str | None = None
    label: str | None = None

    @property
    def key(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class PaperNumbers:
    metric: str
    values: dict[str, float]
    source: str
    subset: str = ""


@dataclass(frozen=True)
class Card:
    """A parsed replication card (see the module docstring)."""

    name: str
    system: str
    checkpoint: str | None
    method: str
    dialect: str
    template: str
    retriever: dict[str, Any]
    datasets: tuple[CardDataset, ...]
    metric_profile: str
    paper: tuple[PaperNumbers, ...] = ()
    method_config: str | None = None
    max_turns: int | None = None
    base_model: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def topk(self) -> int | None:
        return self.retriever.get("topk")

    def paper_value(self, metric: str, key: str) -> tuple[float | None, str]:
        """The paper's number (percent) for ``metric`` on dataset ``key``, and its source."""
        for p in self.paper:
            if p.metric == metric and key in p.values:
                return float(p.values[key]), p.source
        return None, ""


def card_names() -> list[str]:
    return sorted(p.stem for p in CARDS_DIR.glob("*.yaml"))


def load_card(name_or_path: str) -> Card:
    """A card by name (``search_r1``) or by path; errors name the file and the missing field."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CARDS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(f"no replication card {name_or_path!r} (cards: {', '.join(card_names())})")
    d = read_yaml(path) or {}
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a replication card holds a mapping")
    missing = [f for f in CARD_FIELDS if f not in d]
    if missing:
        raise ValueError(f"{path}: replication card lacks {', '.join(missing)}")

    get_profile(d["metric_profile"])
    try:
        datasets = tuple(CardDataset(**ds) for ds in d["datasets"])
        paper = tuple(PaperNumbers(**p) for p in d.get("paper") or [])
    except TypeError as e:
        raise ValueError(f"{path}: bad datasets/paper entry ({e})") from None
    known = set(CARD_FIELDS) | {"paper", "method_config", "max_turns", "base_model"}
    return Card(
        name=path.stem,
        system=d["system"],
        checkpoint=d["checkpoint"],
        method=d["method"],
        dialect=d["dialect"],
        template=d["template"],
        retriever=dict(d["retriever"]),
        datasets=datasets,
        metric_profile=d["metric_profile"],
        paper=paper,
        method_config=d.get("method_config"),
        max_turns=d.get("max_turns"),
        base_model=str(d.get("base_model", "")),
        extra={k: v for k, v in d.items() if k not in known},
    )


def card_reference_entries() -> list[dict[str, Any]]:
    """The cards' paper numbers as ``harness report --reference`` entries (values in percent)."""
    out = []
    for name in card_names():
        card = load_card(name)
        r = card.retriever
        for p in card.paper:
            out.append(
                {
                    "system": card.system,
                    "kind": "paper",
                    "model": f"{card.checkpoint or card.extra.get('checkpoint_collection', '?')} ({card.base_model})",
                    "metric": NAMES.get(p.metric, p.metric),
                    "values": dict(p.values),
                    "corpus": r.get("corpus", "?"),
                    "retriever": r.get("encoder", "?"),
                    "k": r.get("topk"),
                    "subset": p.subset or "as the paper",
                    "source": p.source,
                    "note": f"replication card configs/replicate/{name}.yaml",
                }
            )
    return out


def reference_entries(path: str | Path) -> list[dict[str, Any]]:
    """``harness report --reference``: the cards' paper numbers, then the published-numbers
    file's entries (other rows of the papers, and independent reproductions)."""
    return card_reference_entries() + load_reference(path)


def card_configs(
    card: Card,
    data: dict[str, Any],
    limit: int | None = None,
    only: list[str] | None = None,
) -> list[Any]:
    """One EvalConfig per card dataset: the card's method config, then the card's setting, then
    ``data`` (the caller's flags, ``-c`` files and overrides, which win)."""
    base: dict[str, Any] = load_yaml(REPO_ROOT / card.method_config) if card.method_config else {}
    setting: dict[str, Any] = {"method": card.method, "retriever": {"topk": card.topk} if card.topk else {}}
    if card.max_turns is not None:
        setting["agent"] = {"max_turns": card.max_turns}
    if card.checkpoint:
        setting["backend"] = {"model": card.checkpoint}
    merged = deep_merge(deep_merge(base, setting), data)
    merged = apply_profile(merged, data.get("metric_profile") or card.metric_profile)
    configs = []
    for ds in card.datasets:
        if only and ds.key not in only and ds.name not in only:
            continue
        dd: dict[str, Any] = {"name": ds.name, "split": ds.split}
        if limit is not None:
            dd["limit"] = limit
        configs.append(from_dict(EvalConfig, deep_merge(merged, {"dataset": dd})))
    return configs


def setting_differences(card: Card, cfg: Any, manifest: Any, n_items: int, n_full: int | None) -> list[str]:
    """Where a run's setting is not the paper's, one phrase each (empty: the paper's setting)."""
    out = []
    model = manifest.model or cfg.backend.model
    if card.checkpoint and model != card.checkpoint:
        out.append(f"model {model} (paper: {card.checkpoint})")
    elif not card.checkpoint:
        out.append(f"model {model} (the card names no verified checkpoint id)")
    r = card.retriever
    prebuilt = r.get("prebuilt")
    index = cfg.retriever.index
    if manifest.retriever != r.get("kind") or not index or (prebuilt and prebuilt not in str(index)):
        where = f"index {index}" if index else f"{manifest.retriever} over {manifest.corpus or 'no corpus'}"
        out.append(f"retrieval {where} (paper: {r.get('corpus')}, {r.get('encoder')}, {r.get('index')})")
    variant, template = cfg.agent.get("variant", "exact"), cfg.agent.get("template")
    if variant != "exact":
        out.append(f"dialect variant {variant!r} (paper: the {card.dialect} dialect exactly)")
    if template and Path(template).resolve() != (REPO_ROOT / card.template).resolve():
        out.append(f"prompt template {template} (paper: {card.template})")
    if card.max_turns is not None and cfg.agent.get("max_turns") != card.max_turns:
        out.append(f"max_turns {cfg.agent.get('max_turns')} (paper: {card.max_turns})")
    if card.topk and manifest.topk != card.topk:
        out.append(f"top-{manifest.topk} (paper: top-{card.topk})")
    if n_full is not None and n_items < n_full:
        out.append(f"{n_items} of {n_full} questions")
    return out
