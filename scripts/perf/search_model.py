"""Build the searching model ``vs_flashrag.py`` compares on: SFT on trajectories synthesized in the
search_r1 dialect, cached like the demo's (a benchmark helper, not a test).

1. Synthesis (``training.synthesize``, what ``harness data synthesize`` runs): for each question of
   ``--dataset/--split`` the gold decomposition's hops are searched through BM25 over the split's
   corpus and written in the dialect's own tags; only trajectories whose every search surfaced
   its gold passage and whose answer is the gold one are kept. Kept while its inputs (the files'
   hashes, dialect, variant, tokenizer, document cap, retriever) are unchanged.
2. SFT (``training.build.train_cached``) with ``--recipe`` (default the demo's CPU SFT recipe) and
   the synthesized file as its source; skipped when ``OUT/sft/final`` exists and was trained
   with exactly this config.

    PYTHONPATH=. .venv/bin/python scripts/perf/search_model.py            # demo train split, SmolLM2
    PYTHONPATH=. .venv/bin/python scripts/perf/search_model.py --dataset hotpotqa --split train100 \\
        --data-dir ../shared/data trainer.max_steps=50
    PYTHONPATH=. .venv/bin/python scripts/perf/vs_flashrag.py --pairs search_r1 --model OUT/sft/final ...

The last line printed is the model folder. Trailing ``key=value`` arguments override the recipe.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from benchmarks.datasets import corpus_path, dataset_file
from harness.config import compose
from harness.runlog import file_hash
from training.build import train_cached
from training.config import TrainConfig

logger = logging.getLogger("search_model")

RECIPE = "configs/train/smollm2_cpu_sft_demo.yaml"


def synthesize_cached(
    out: Path,
    dataset: str,
    split: str,
    data_dir: str | None,
    variant: str,
    tokenizer: str,
    max_doc_tokens: int,
    limit: int | None,
) -> Path:
    """The search_r1 trajectories of the split under ``out``, re-synthesized only when an input changed."""
    # deferred: training.synthesize imports flashrag and torch (seconds)
    from training.synthesize import synthesize_split

    inputs = {
        "questions": file_hash(dataset_file(dataset, split, data_dir)),
        "corpus": file_hash(corpus_path(dataset, split, data_dir)),
        "dataset": dataset,
        "split": split,
        "dialect": "search_r1",
        "variant": variant,
        "tokenizer": tokenizer,
        "max_doc_tokens": max_doc_tokens,
        "retriever": "bm25",
        "limit": limit,
    }
    path, stamp = out / "train.jsonl", out / "train.inputs.json"
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == inputs:
        logger.info("cached: %s", path)
        return path
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)  # a stamp is written only beside a complete file
    name, stats = synthesize_split(
        dataset, "search_r1", path, split, variant, limit, data_dir=data_dir, tokenizer=tokenizer,
        max_doc_tokens=max_doc_tokens,
    )  # fmt: skip
    if not stats.kept:
        raise RuntimeError(f"synthesis kept no trajectory for {dataset}/{split}: {stats.summary()}")
    stamp.write_text(json.dumps(inputs, indent=2))
    logger.info("%s: %s -> %s", name, stats.summary(), path)
    return path


def build_search_model(
    out: str | Path = "runs/perf/search_model",
    dataset: str = "demo",
    split: str = "train",
    data_dir: str | None = None,
    variant: str = "exact",
    max_doc_tokens: int = 64,
    limit: int | None = None,
    recipe: str = RECIPE,
    overrides: list[str] | None = None,
) -> tuple[Path, bool]:
    """Synthesize (cached) then SFT (cached); returns the final model folder and whether it trained now."""
    out = Path(out)
    probe = compose(TrainConfig, [recipe], list(overrides or []))  # the tokenizer the doc cap uses
    data = synthesize_cached(
        out / "data", dataset, split, data_dir, variant, probe.model.path, max_doc_tokens, limit
    )  # fmt: skip
    source = f"sft.sources=[{{kind: synth, path: {json.dumps(str(data))}}}]"
    cfg = compose(TrainConfig, [recipe], [source, f"trainer.out={out / 'sft'}", *(overrides or [])])
    return train_cached(cfg, out / "sft")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/perf/search_model")
    p.add_argument("--dataset", default="demo")
    p.add_argument("--split", default="train")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--variant", default="exact", help="the search_r1 wording: exact (the original) or small")
    p.add_argument("--max-doc-tokens", type=int, default=64)
    p.add_argument("--limit", type=int, default=None, help="questions to synthesize from (default: all)")
    p.add_argument("--recipe", default=RECIPE, help="an SFT training recipe")
    p.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    final, trained = build_search_model(
        args.out, args.dataset, args.split, args.data_dir, args.variant, args.max_doc_tokens, args.limit,
        args.recipe, args.overrides,
    )  # fmt: skip
    logger.info("trained now" if trained else "cached (trained with this recipe)")
    print(final)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
