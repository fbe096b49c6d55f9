"""Writes the ``demo`` benchmark: two-hop questions over a small fictional world.

The world (towns, rivers, people, inventions, companies, products) is generated from our own
name syllables and sentence templates with a fixed seed, so no fact is in any model's memory
and every answer must be found by retrieval. Each question needs exactly the two passages named
in its ``metadata.supporting_doc_ids``. Run from the repo root to regenerate (deterministic):

    python benchmarks/demo_data/build_demo.py

Two splits over one corpus:

- ``test`` (``questions.jsonl``, 39 questions): the evaluated split, unchanged since the demo
  was first shipped;
- ``train`` (``train_questions.jsonl``): questions for SFT warm-ups (``make demo`` trains on
  them). The same five templates, written over entities the test split does not ask about, and
  no train question's supporting passage supports any test question, so no fact the model is
  evaluated on is ever in its training data, and no train answer is a test answer (yes/no
  aside). It is built after every test question and passage,
  from no further random draws, so adding it changed neither of those files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 7
HERE = Path(__file__).resolve().parent

ONSETS = ["b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "br", "dr", "gr", "kl", "st", "th"]
VOWELS = ["a", "e", "i", "o", "u", "ei", "au", "oa"]
CODAS = ["", "n", "r", "l", "s", "th", "nd", "rk", "v"]
TOWN_ENDS = ["vik", "holm", "stad", "ford", "by", "mere", "wick", "dal"]
RIVER_ENDS = ["a", "e", "is", "on", "ach"]
PROVINCES = ["Northmarch", "Lowvale", "Ostrand", "Westerfell", "Carrowdeep"]
OCCUPATIONS = ["clockmaker", "engineer", "glassblower", "chemist", "shipwright", "weaver", "astronomer"]
THINGS = [
    "harp-clock",
    "steam loom",
    "tide gauge",
    "lantern press",
    "copper sextant",
    "wind organ",
    "salt kiln",
    "rope ladder-lift",
    "ice plough",
    "signal drum",
    "paper kite-sail",
    "brass abacus",
    "fog horn-bell",
    "peat stove",
    "river dredge",
    "spring lock",
]
INDUSTRIES = ["shipbuilding", "textile", "glassworks", "printing", "brewing", "instrument-making"]
PRODUCT_KINDS = [
    "barometer",
    "rowing boat",
    "wool blanket",
    "pocket compass",
    "ink set",
    "lamp oil",
    "fishing reel",
    "tea kettle",
    "weather vane",
    "sewing frame",
    "map case",
    "candle mould",
]


class World:
    def __init__(self, seed: int = SEED) -> None:
        self.rng = random.Random(seed)
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        while True:
            w = "".join(
                self.rng.choice(ONSETS) + self.rng.choice(VOWELS) + self.rng.choice(CODAS) for _ in range(syllables)
            )
            if w not in self.used and 4 <= len(w) <= 10:
                self.used.add(w)
                return w.capitalize()

    def town(self) -> str:
        return self.word(1) + self.rng.choice(TOWN_ENDS)

    def river(self) -> str:
        return self.word(1) + self.rng.choice(RIVER_ENDS)

    def person(self) -> str:
        return f"{self.word(1)} {self.word(2)}"


def build() -> tuple[list[dict], list[dict], list[dict]]:
    """(test questions, train questions, corpus)."""
    w = World()
    rng = w.rng
    rivers = [w.river() for _ in range(18)]
    towns = [
        {
            "name": w.town(),
            "river": rng.choice(rivers),
            "province": rng.choice(PROVINCES),
            "pop": rng.randrange(800, 40000, 100),
        }
        for _ in range(50)
    ]
    people = [
        {
            "name": w.person(),
            "town": rng.choice(towns)["name"],
            "year": rng.randrange(1790, 1900),
            "job": rng.choice(OCCUPATIONS),
        }
        for _ in range(56)
    ]
    inventions = [
        {"name": THINGS[i], "inventor": people[i]["name"], "year": people[i]["year"] + rng.randrange(22, 50)}
        for i in range(len(THINGS))
    ]
    companies = [
        {
            "name": f"{w.word(2)} & Sons",
            "founder": people[16 + i]["name"],
            "town": rng.choice(towns)["name"],
            "year": rng.randrange(1820, 1930),
            "industry": rng.choice(INDUSTRIES),
        }
        for i in range(12)
    ]
    products = [
        {"name": f"{w.word(1)} {PRODUCT_KINDS[i]}", "kind": PRODUCT_KINDS[i], "company": companies[i]["name"]}
        for i in range(len(PRODUCT_KINDS))
    ]

    docs: list[dict] = []
    ids: dict[tuple[str, str], str] = {}

    def add(kind: str, key: str, title: str, text: str) -> None:
        doc_id = f"d{len(docs) + 1:03d}"
        ids[(kind, key)] = doc_id
        docs.append({"id": doc_id, "contents": f"{title}\n{text}"})

    for t in towns:
        add(
            "town",
            t["name"],
            t["name"],
            f"{t['name']} is a town in the province of {t['province']}. It lies on the {t['river']} river "
            f"and has about {t['pop']} inhabitants.",
        )
    for r in rivers:
        add(
            "river",
            r,
            f"{r} (river)",
            f"The {r} is a river of the fictional northern lowlands, about {rng.randrange(40, 400)} km long.",
        )
    for p in people:
        add(
            "person",
            p["name"],
            p["name"],
            f"{p['name']} (born {p['year']}) was a {p['job']} born in the town of {p['town']}.",
        )
    for i in inventions:
        add(
            "invention",
            i["name"],
            f"The {i['name']}",
            f"The {i['name']} was invented by {i['inventor']} in {i['year']}.",
        )
    for c in companies:
        add(
            "company",
            c["name"],
            c["name"],
            f"{c['name']} is a {c['industry']} firm founded in {c['town']} in {c['year']} by {c['founder']}.",
        )
    for p in products:
        add("product", p["name"], f"The {p['name']}", f"The {p['name']} is a {p['kind']} made by {p['company']}.")

    town_by = {t["name"]: t for t in towns}
    person_by = {p["name"]: p for p in people}
    questions: list[dict] = []
    prefix = "demo"

    def q(question: str, answer: str, support: list[tuple[str, str]], qtype: str) -> None:
        questions.append(
            {
                "id": f"{prefix}-{len(questions) + 1:03d}",
                "question": question,
                "golden_answers": [answer],
                "metadata": {"supporting_doc_ids": [ids[s] for s in support], "type": qtype},
            }
        )

    for inv in inventions[:8]:
        person = person_by[inv["inventor"]]
        q(
            f"In which town was the inventor of the {inv['name']} born?",
            person["town"],
            [("invention", inv["name"]), ("person", person["name"])],
            "bridge",
        )
    for comp in companies[:8]:
        q(
            f"On which river lies the town where {comp['name']} was founded?",
            town_by[comp["town"]]["river"],
            [("company", comp["name"]), ("town", comp["town"])],
            "bridge",
        )
    for prod in products[:8]:
        comp = next(c for c in companies if c["name"] == prod["company"])
        q(
            f"Who founded the company that makes the {prod['name']}?",
            comp["founder"],
            [("product", prod["name"]), ("company", comp["name"])],
            "bridge",
        )
    pairs = [(towns[i], towns[i + 1]) for i in range(20, 36, 2)]
    for a, b in pairs:
        same = "yes" if a["province"] == b["province"] else "no"
        q(
            f"Are {a['name']} and {b['name']} in the same province?",
            same,
            [("town", a["name"]), ("town", b["name"])],
            "comparison",
        )
    for i in range(28, 44, 2):
        a, b = people[i], people[i + 1]
        if a["year"] == b["year"]:
            continue
        first = a if a["year"] < b["year"] else b
        q(
            f"Who was born earlier, {a['name']} or {b['name']}?",
            first["name"],
            [("person", a["name"]), ("person", b["name"])],
            "comparison",
        )
    test = questions

    # ---- the train split: disjoint supporting passages, every template, no new random draws ----
    used = {d for t in test for d in t["metadata"]["supporting_doc_ids"]}
    test_answers = {a for t in test for a in t["golden_answers"]}
    questions, prefix = [], "demo-train"

    def free(*keys: tuple[str, str]) -> bool:
        """No test question rests on these passages, and none has their entity as its answer."""
        return not any(ids[k] in used or k[1] in test_answers for k in keys)

    def add_q(question: str, answer: str, support: list[tuple[str, str]], qtype: str) -> None:
        if answer not in test_answers or answer in ("yes", "no"):
            q(question, answer, support, qtype)

    for inv in inventions[8:]:
        person = person_by[inv["inventor"]]
        if free(("invention", inv["name"]), ("person", person["name"])):
            add_q(
                f"In which town was the inventor of the {inv['name']} born?",
                person["town"],
                [("invention", inv["name"]), ("person", person["name"])],
                "bridge",
            )
    for comp in companies[8:]:
        if free(("company", comp["name"]), ("town", comp["town"])):
            add_q(
                f"On which river lies the town where {comp['name']} was founded?",
                town_by[comp["town"]]["river"],
                [("company", comp["name"]), ("town", comp["town"])],
                "bridge",
            )
    for prod in products[8:]:
        comp = next(c for c in companies if c["name"] == prod["company"])
        if free(("product", prod["name"]), ("company", comp["name"])):
            add_q(
                f"Who founded the company that makes the {prod['name']}?",
                comp["founder"],
                [("product", prod["name"]), ("company", comp["name"])],
                "bridge",
            )
    # Only one company is left for the river template: the same lookup (an entity's town, then
    # the town's river) through people born in towns no test question needs.
    k = 0
    for p in people:
        if k < 8 and free(("person", p["name"]), ("town", p["town"])):
            n_before = len(questions)
            add_q(
                f"On which river lies the town where {p['name']} was born?",
                town_by[p["town"]]["river"],
                [("person", p["name"]), ("town", p["town"])],
                "bridge",
            )
            k += len(questions) - n_before
    # Comparisons: half "yes" and half "no" (the test split is mostly "no"; a warm-up on that
    # would teach the answer, not the lookup), over towns no test question needs.
    pool = [t for t in towns if free(("town", t["name"]))]
    same = [(a, b) for i, a in enumerate(pool) for b in pool[i + 1 :] if a["province"] == b["province"]]
    diff = [(a, b) for i, a in enumerate(pool) for b in pool[i + 1 :] if a["province"] != b["province"]]
    taken: set[str] = set()
    for kind, cands in (("yes", same), ("no", diff)):
        k = 0
        for a, b in cands:
            if k == 4 or a["name"] in taken or b["name"] in taken:
                continue
            taken |= {a["name"], b["name"]}
            k += 1
            q(
                f"Are {a['name']} and {b['name']} in the same province?",
                kind,
                [("town", a["name"]), ("town", b["name"])],
                "comparison",
            )
    free_people = [p for p in people if free(("person", p["name"]))]
    k = 0
    for a, b in zip(free_people[::2], free_people[1::2], strict=False):
        if k == 8 or a["year"] == b["year"]:
            continue
        k += 1
        first = a if a["year"] < b["year"] else b
        q(
            f"Who was born earlier, {a['name']} or {b['name']}?",
            first["name"],
            [("person", a["name"]), ("person", b["name"])],
            "comparison",
        )
    return test, questions, docs


def main() -> None:
    questions, train, docs = build()
    for name, rows in (("questions.jsonl", questions), ("train_questions.jsonl", train), ("corpus.jsonl", docs)):
        with open(HERE / name, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(questions)} test and {len(train)} train questions and {len(docs)} passages to {HERE}")


if __name__ == "__main__":
    main()
