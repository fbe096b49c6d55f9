"""Writes the ``demo`` benchmark: two-hop questions over a small fictional world.

The world (towns, rivers, people, inventions, companies, products) is generated from our own
name syllables and sentence templates with fixed seeds, so no fact is in any model's memory and
every answer must be found by retrieval. Each question needs exactly the two passages named in
its ``metadata.supporting_doc_ids`` (in hop order). Run from the repo root to regenerate
(deterministic; ``--out DIR`` writes elsewhere):

    python -m scripts.build_demo

Two worlds, one corpus:

- **v1** (seed 7), the demo as first shipped, unchanged byte for byte: ``test_v1.jsonl`` (39
  questions, five templates; the figures of docs/training.md before the v2 splits used it under
  its old name ``test``), ``train_v1.jsonl`` (36 questions over entities test_v1 does not ask
  about, built after every test_v1 question from no further random draws) and ``corpus_v1.jsonl``
  (its 164 passages, ids ``d001``-``d164``), which the v1 splits are searched over so that their
  figures reproduce exactly.
- **v2** (seed 2026): ``test.jsonl``, ``val.jsonl`` and ``train.jsonl`` over a larger world drawn
  after v1 (no name of v1 is reused). ``corpus.jsonl`` holds the v1 passages first (same ids,
  same text) and the v2 passages after them (ids ``d2-0001`` on).

How v2 is kept sound (``tests/benchmarks/test_demo_data.py`` checks each rule):

- Seven templates (:data:`~benchmarks.demo_data.world_v2.TEMPLATES`): the five of v1, and two
  whose answer is a year read from the second passage, never a name from the question (the birth
  year of an invention's inventor, whose first passage holds another year, the invention's; the
  founding year of the company that makes a product).
- Every split asks each template equally often
  (:data:`~benchmarks.demo_data.world_v2.PER_TEMPLATE` questions), so the template
  mix is the same in test, val and train. ``same province`` is "yes" in half of its questions,
  and ``born earlier`` names the first-mentioned person in half and the second in half. Questions
  come in blocks of two per template (one "yes" and one "no", one first and one second) shuffled
  within the block, so every prefix of 14k questions (``--limit``) is balanced too.
- Each split has a world of its own (towns, rivers, people, inventions, companies, products):
  no passage supports questions of two splits, no test or val fact is in a train question's
  trajectory, and no answer (a town, river, person or year) is the answer of a question in
  another split; the years that are answers are drawn without replacement. All passages share
  the one corpus, so the other splits' passages are distractors at retrieval time.

The builder is four modules: :mod:`~benchmarks.demo_data.world` (the name syllables and word
pools, and :class:`~benchmarks.demo_data.world.World` that draws unique names from them),
:mod:`~benchmarks.demo_data.world_v1` (the v1 world), :mod:`~benchmarks.demo_data.world_v2` (the
v2 splits) and this one (every file, written).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.demo_data.world import World
from benchmarks.demo_data.world_v1 import build_v1
from benchmarks.demo_data.world_v2 import build_v2

HERE = Path(__file__).resolve().parent


def build() -> dict[str, list[dict]]:
    """Every file of the demo data: file name → its rows (see the module docstring)."""
    w = World()
    test_v1, train_v1, corpus_v1 = build_v1(w)
    # v2 reuses no v1 word, nor any word of a v1 name (a town or river is more than its syllables).
    used = w.used | {t.lower() for d in corpus_v1 for t in re.findall(r"[A-Za-z]+", d["contents"].split("\n")[0])}
    splits, docs = build_v2(used)
    return {
        "test_v1.jsonl": test_v1,
        "train_v1.jsonl": train_v1,
        "corpus_v1.jsonl": corpus_v1,
        "test.jsonl": splits["test"],
        "val.jsonl": splits["val"],
        "train.jsonl": splits["train"],
        "corpus.jsonl": corpus_v1 + docs,
    }


def write(out: Path = HERE) -> dict[str, int]:
    """Write every file into ``out``; returns rows per file."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, rows in build().items():
        with open(out / name, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        counts[name] = len(rows)
    return counts
