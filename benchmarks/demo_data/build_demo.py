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

- Seven templates (:data:`TEMPLATES`): the five of v1, and two whose answer is a year read from
  the second passage, never a name from the question (the birth year of an invention's inventor,
  whose first passage holds another year, the invention's; the founding year of the company that
  makes a product).
- Every split asks each template equally often (:data:`PER_TEMPLATE` questions), so the template
  mix is the same in test, val and train. ``same province`` is "yes" in half of its questions,
  and ``born earlier`` names the first-mentioned person in half and the second in half. Questions
  come in blocks of two per template (one "yes" and one "no", one first and one second) shuffled
  within the block, so every prefix of 14k questions (``--limit``) is balanced too.
- Each split has a world of its own (towns, rivers, people, inventions, companies, products):
  no passage supports questions of two splits, no test or val fact is in a train question's
  trajectory, and no answer (a town, river, person or year) is the answer of a question in
  another split; the years that are answers are drawn without replacement. All passages share
  the one corpus, so the other splits' passages are distractors at retrieval time.
"""

from __future__ import annotations

import json
import random
import re
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
    """Unique names from syllables. ``register_full``: also refuse a town or river name that is
    already a word (or a word that is already a town or river), so no name reads as two entities;
    v1 was drawn without it and keeps its draws."""

    def __init__(
        self,
        seed: int = SEED,
        onsets: list[str] = ONSETS,
        vowels: list[str] = VOWELS,
        codas: list[str] = CODAS,
        town_ends: list[str] = TOWN_ENDS,
        used: set[str] | None = None,
        register_full: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        self.used: set[str] = set() if used is None else used
        self.onsets, self.vowels, self.codas, self.town_ends = onsets, vowels, codas, town_ends
        self.register_full = register_full

    def word(self, syllables: int) -> str:
        while True:
            w = "".join(
                self.rng.choice(self.onsets) + self.rng.choice(self.vowels) + self.rng.choice(self.codas)
                for _ in range(syllables)
            )
            if w not in self.used and 4 <= len(w) <= 10:
                self.used.add(w)
                return w.capitalize()

    def _place(self, ends: list[str]) -> str:
        while True:
            name = self.word(1) + self.rng.choice(ends)
            if not self.register_full:
                return name
            if name.lower() not in self.used:
                self.used.add(name.lower())
                return name

    def town(self) -> str:
        return self._place(self.town_ends)

    def river(self) -> str:
        return self._place(RIVER_ENDS)

    def person(self) -> str:
        return f"{self.word(1)} {self.word(2)}"


def build_v1(w: World) -> tuple[list[dict], list[dict], list[dict]]:
    """The first world, unchanged since it shipped: (test_v1 questions, train_v1 questions, corpus_v1)."""
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

    # The five question templates: (question, answer, supporting passages) of one entity or pair.
    def inventor_town(inv: dict) -> tuple[str, str, list[tuple[str, str]]]:
        person = person_by[inv["inventor"]]
        support = [("invention", inv["name"]), ("person", person["name"])]
        return f"In which town was the inventor of the {inv['name']} born?", person["town"], support

    def company_river(comp: dict) -> tuple[str, str, list[tuple[str, str]]]:
        river, support = town_by[comp["town"]]["river"], [("company", comp["name"]), ("town", comp["town"])]
        return f"On which river lies the town where {comp['name']} was founded?", river, support

    def product_founder(prod: dict) -> tuple[str, str, list[tuple[str, str]]]:
        comp = next(c for c in companies if c["name"] == prod["company"])
        support = [("product", prod["name"]), ("company", comp["name"])]
        return f"Who founded the company that makes the {prod['name']}?", comp["founder"], support

    def same_province(a: dict, b: dict) -> tuple[str, str, list[tuple[str, str]]]:
        same = "yes" if a["province"] == b["province"] else "no"
        support = [("town", a["name"]), ("town", b["name"])]
        return f"Are {a['name']} and {b['name']} in the same province?", same, support

    def born_earlier(a: dict, b: dict) -> tuple[str, str, list[tuple[str, str]]]:
        first = a if a["year"] < b["year"] else b
        support = [("person", a["name"]), ("person", b["name"])]
        return f"Who was born earlier, {a['name']} or {b['name']}?", first["name"], support

    for inv in inventions[:8]:
        q(*inventor_town(inv), "bridge")
    for comp in companies[:8]:
        q(*company_river(comp), "bridge")
    for prod in products[:8]:
        q(*product_founder(prod), "bridge")
    for i in range(20, 36, 2):
        q(*same_province(towns[i], towns[i + 1]), "comparison")
    for i in range(28, 44, 2):
        a, b = people[i], people[i + 1]
        if a["year"] != b["year"]:
            q(*born_earlier(a, b), "comparison")
    test = questions

    # ---- the train split: disjoint supporting passages, every template, no new random draws ----
    used = {d for t in test for d in t["metadata"]["supporting_doc_ids"]}
    test_answers = {a for t in test for a in t["golden_answers"]}
    questions, prefix = [], "demo-train"

    def free(*keys: tuple[str, str]) -> bool:
        """No test question rests on these passages, and none has their entity as its answer."""
        return not any(ids[k] in used or k[1] in test_answers for k in keys)

    def bridge(question: str, answer: str, support: list[tuple[str, str]]) -> bool:
        """Add a bridge question when its passages are free and its answer is no test answer."""
        if free(*support) and answer not in test_answers:
            q(question, answer, support, "bridge")
            return True
        return False

    for inv in inventions[8:]:
        bridge(*inventor_town(inv))
    for comp in companies[8:]:
        bridge(*company_river(comp))
    for prod in products[8:]:
        bridge(*product_founder(prod))
    # Only one company is left for the river template: the same lookup (an entity's town, then
    # the town's river) through people born in towns no test question needs.
    k = 0
    for p in people:
        if k < 8:
            river, support = town_by[p["town"]]["river"], [("person", p["name"]), ("town", p["town"])]
            k += bridge(f"On which river lies the town where {p['name']} was born?", river, support)
    # Comparisons: half "yes" and half "no" (the test split is mostly "no"; a warm-up on that
    # would teach the answer, not the lookup), over towns no test question needs.
    pool = [t for t in towns if free(("town", t["name"]))]
    same = [(a, b) for i, a in enumerate(pool) for b in pool[i + 1 :] if a["province"] == b["province"]]
    diff = [(a, b) for i, a in enumerate(pool) for b in pool[i + 1 :] if a["province"] != b["province"]]
    taken: set[str] = set()
    for cands in (same, diff):
        k = 0
        for a, b in cands:
            if k == 4 or a["name"] in taken or b["name"] in taken:
                continue
            taken |= {a["name"], b["name"]}
            k += 1
            q(*same_province(a, b), "comparison")
    free_people = [p for p in people if free(("person", p["name"]))]
    k = 0
    for a, b in zip(free_people[::2], free_people[1::2], strict=False):
        if k == 8 or a["year"] == b["year"]:
            continue
        k += 1
        q(*born_earlier(a, b), "comparison")
    return test, questions, docs


# ---- v2: the splits test / val / train ------------------------------------------------------
SEED_V2 = 2026
PER_TEMPLATE = {"test": 22, "val": 8, "train": 60}  # questions of each template in each split (even)

ONSETS_V2 = [*ONSETS, "j", "w", "z", "bl", "fl", "fr", "gl", "kr", "pr", "sk", "sl", "sn", "sp", "tr", "sh"]
VOWELS_V2 = [*VOWELS, "ai", "ie", "ou"]
CODAS_V2 = [*CODAS, "m", "t", "k", "ld", "rn", "st", "nt"]
TOWN_ENDS_V2 = [*TOWN_ENDS, "burg", "thorpe", "haven", "stead"]
PROVINCES_V2 = [*PROVINCES, "Harrowmoor", "Eastwold", "Fennick"]
OCCUPATIONS_V2 = [*OCCUPATIONS, "miller", "cartographer", "potter", "printer", "mason", "apothecary"]
INDUSTRIES_V2 = [*INDUSTRIES, "pottery", "ironworks", "tanning", "rope-making", "milling", "clockwork"]
# Company names carry no full stop: a passage's first sentence is cut at one (training.synthesize).
COMPANY_FORMS = ["& Sons", "& Daughters", "Brothers", "Works", "Company"]
DEVICES = [
    "loom",
    "tide gauge",
    "lantern press",
    "sextant",
    "water clock",
    "rope lift",
    "seed drill",
    "bellows pump",
    "glass lathe",
    "chain hoist",
    "wind gauge",
    "paper press",
    "stone saw",
    "thread spinner",
    "salt pan",
    "dredging wheel",
    "signal mirror",
    "spring lock",
]
PRODUCT_KINDS_V2 = [
    *PRODUCT_KINDS,
    "copper pot",
    "walking stick",
    "leather satchel",
    "hand plane",
    "rain cloak",
    "ship's bell",
    "clay pipe",
    "reading glass",
]

# name → (kind, question); {x} the entity of the first hop, {a}/{b} the two compared.
TEMPLATES: dict[str, tuple[str, str]] = {
    "inventor's town": ("bridge", "In which town was the inventor of the {x} born?"),
    "inventor's birth year": ("bridge", "In which year was the inventor of the {x} born?"),
    "river of a town": ("bridge", "On which river lies the town where {x} was founded?"),
    "company founder": ("bridge", "Who founded the company that makes the {x}?"),
    "company's founding year": ("bridge", "In which year was the company that makes the {x} founded?"),
    "same province": ("comparison", "Are {a} and {b} in the same province?"),
    "born earlier": ("comparison", "Who was born earlier, {a} or {b}?"),
}


def _take_year(pool: list[int], below: int) -> int:
    """Remove and return the last year in ``pool`` before ``below``: answer years are never reused."""
    for i in range(len(pool) - 1, -1, -1):
        if pool[i] < below:
            return pool.pop(i)
    raise ValueError(f"no answer year before {below} left")


def _split_world(w: World, n: int, answer_years: list[int]) -> dict[str, list]:
    """One split's own entities, sized for ``n`` questions of every template."""
    rng = w.rng
    rivers = [{"name": w.river(), "km": rng.randrange(40, 400)} for _ in range(max(3, 2 * n // 3))]
    towns: list[dict] = []
    town_pairs = []
    same = ["yes", "no"] * (n // 2)
    rng.shuffle(same)
    for answer in same:
        provinces = [rng.choice(PROVINCES_V2)] * 2 if answer == "yes" else rng.sample(PROVINCES_V2, 2)
        pair = [
            {
                "name": w.town(),
                "river": rng.choice(rivers)["name"],
                "province": p,
                "pop": rng.randrange(800, 40000, 100),
            }
            for p in provinces
        ]
        towns += pair
        town_pairs.append((pair[0], pair[1], answer))
    people: list[dict] = []

    def person(year: int) -> dict:
        p = {"name": w.person(), "town": rng.choice(towns)["name"], "year": year, "job": rng.choice(OCCUPATIONS_V2)}
        people.append(p)
        return p

    # The second half's years are answers ("inventor's birth year", "company's founding year").
    inventions = []
    for i in range(2 * n):
        born = _take_year(answer_years, 1880) if i >= n else rng.randrange(1700, 1880)
        inventor = person(born)
        name = f"{w.word(2)} {rng.choice(DEVICES)}"
        inventions.append({"name": name, "inventor": inventor, "year": born + rng.randrange(22, 50)})
    companies = []
    for i in range(2 * n):
        year = _take_year(answer_years, 1950) if i >= n else rng.randrange(1720, 1950)
        founder = person(year - rng.randrange(22, 55))
        name = f"{w.word(2)} {rng.choice(COMPANY_FORMS)}"
        town = rng.choice(towns)["name"]
        companies.append(
            {"name": name, "founder": founder, "town": town, "year": year, "industry": rng.choice(INDUSTRIES_V2)}
        )
    products = []
    for c in companies:
        kind = rng.choice(PRODUCT_KINDS_V2)
        products.append({"name": f"{w.word(2)} {kind}", "kind": kind, "company": c})
    rivals = []
    positions = ["first", "second"] * (n // 2)
    rng.shuffle(positions)
    for position in positions:
        a = person(rng.randrange(1700, 1900))
        b = person(rng.choice([y for y in range(1700, 1900) if y != a["year"]]))
        earlier, later = (a, b) if a["year"] < b["year"] else (b, a)
        rivals.append((earlier, later) if position == "first" else (later, earlier))
    return {
        "towns": towns,
        "rivers": rivers,
        "people": people,
        "inventions": inventions,
        "companies": companies,
        "products": products,
        "town_pairs": town_pairs,
        "rivals": rivals,
    }


def _a(noun: str) -> str:
    """``noun`` with its indefinite article (v1 wrote "a" before vowels too, and keeps it)."""
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _passages(world: dict[str, list]) -> list[tuple[tuple[str, str], str, str]]:
    """((kind, name), title, text) of every entity of a split world, in v1's sentences."""
    out = []
    for t in world["towns"]:
        text = (
            f"{t['name']} is a town in the province of {t['province']}. It lies on the {t['river']} river "
            f"and has about {t['pop']} inhabitants."
        )
        out.append((("town", t["name"]), t["name"], text))
    for r in world["rivers"]:
        text = f"The {r['name']} is a river of the fictional northern lowlands, about {r['km']} km long."
        out.append((("river", r["name"]), f"{r['name']} (river)", text))
    for p in world["people"]:
        text = f"{p['name']} (born {p['year']}) was {_a(p['job'])} born in the town of {p['town']}."
        out.append((("person", p["name"]), p["name"], text))
    for i in world["inventions"]:
        text = f"The {i['name']} was invented by {i['inventor']['name']} in {i['year']}."
        out.append((("invention", i["name"]), f"The {i['name']}", text))
    for c in world["companies"]:
        firm = _a(f"{c['industry']} firm")
        text = f"{c['name']} is {firm} founded in {c['town']} in {c['year']} by {c['founder']['name']}."
        out.append((("company", c["name"]), c["name"], text))
    for p in world["products"]:
        text = f"The {p['name']} is {_a(p['kind'])} made by {p['company']['name']}."
        out.append((("product", p["name"]), f"The {p['name']}", text))
    return out


def _questions(world: dict[str, list], n: int) -> dict[str, list[tuple[str, str, list[tuple[str, str]]]]]:
    """template → its ``n`` (question, answer, supporting (kind, name) keys); the comparison
    templates alternate their answer class ("yes"/"no", first/second)."""
    town_by = {t["name"]: t for t in world["towns"]}

    def ask(template: str, **names: str) -> str:
        return TEMPLATES[template][1].format(**names)

    inv, comp, prod = world["inventions"], world["companies"], world["products"]
    qs: dict[str, list] = {name: [] for name in TEMPLATES}
    for i in inv[:n]:
        support = [("invention", i["name"]), ("person", i["inventor"]["name"])]
        qs["inventor's town"].append((ask("inventor's town", x=i["name"]), i["inventor"]["town"], support))
    for i in inv[n:]:
        support = [("invention", i["name"]), ("person", i["inventor"]["name"])]
        qs["inventor's birth year"].append(
            (ask("inventor's birth year", x=i["name"]), str(i["inventor"]["year"]), support)
        )
    # The river template over companies of both halves, so its company passages are not all the
    # founder template's.
    for c in comp[n // 2 : n // 2 + n]:
        support = [("company", c["name"]), ("town", c["town"])]
        qs["river of a town"].append((ask("river of a town", x=c["name"]), town_by[c["town"]]["river"], support))
    for p in prod[:n]:
        c = p["company"]
        support = [("product", p["name"]), ("company", c["name"])]
        qs["company founder"].append((ask("company founder", x=p["name"]), c["founder"]["name"], support))
    for p in prod[n:]:
        c = p["company"]
        support = [("product", p["name"]), ("company", c["name"])]
        qs["company's founding year"].append((ask("company's founding year", x=p["name"]), str(c["year"]), support))
    by_answer = {"yes": [], "no": []}
    for a, b, answer in world["town_pairs"]:
        by_answer[answer].append(
            (ask("same province", a=a["name"], b=b["name"]), answer, [("town", a["name"]), ("town", b["name"])])
        )
    qs["same province"] = [q for pair in zip(by_answer["yes"], by_answer["no"], strict=True) for q in pair]
    by_position = {"first": [], "second": []}
    for a, b in world["rivals"]:
        earlier = a if a["year"] < b["year"] else b
        position = "first" if earlier is a else "second"
        support = [("person", a["name"]), ("person", b["name"])]
        by_position[position].append((ask("born earlier", a=a["name"], b=b["name"]), earlier["name"], support))
    qs["born earlier"] = [q for pair in zip(by_position["first"], by_position["second"], strict=True) for q in pair]
    return qs


def build_v2(used: set[str]) -> tuple[dict[str, list[dict]], list[dict]]:
    """({split: questions}, the v2 passages), drawn after v1 without reusing any of ``used``."""
    w = World(SEED_V2, ONSETS_V2, VOWELS_V2, CODAS_V2, TOWN_ENDS_V2, used=used, register_full=True)
    rng = w.rng
    answer_years = list(range(1700, 1950))
    rng.shuffle(answer_years)
    worlds = {split: _split_world(w, n, answer_years) for split, n in PER_TEMPLATE.items()}

    # Passages of all splits together, shuffled within each kind, so an id says nothing of a split.
    by_kind: dict[str, list] = {}
    for world in worlds.values():
        for key, title, text in _passages(world):
            by_kind.setdefault(key[0], []).append((key, title, text))
    docs, ids = [], {}
    for rows in by_kind.values():
        rng.shuffle(rows)
        for key, title, text in rows:
            if key in ids:
                raise ValueError(f"two {key[0]} passages named {key[1]!r}")
            ids[key] = f"d2-{len(docs) + 1:04d}"
            docs.append({"id": ids[key], "contents": f"{title}\n{text}"})

    splits = {}
    for split, n in PER_TEMPLATE.items():
        qs = _questions(worlds[split], n)
        blocks = []
        for b in range(n // 2):  # two of each template a block, shuffled within it
            block = [(name, q) for name in TEMPLATES for q in qs[name][2 * b : 2 * b + 2]]
            rng.shuffle(block)
            blocks += block
        splits[split] = [
            {
                "id": f"demo2-{split}-{k + 1:03d}",
                "question": question,
                "golden_answers": [answer],
                "metadata": {
                    "supporting_doc_ids": [ids[s] for s in support],
                    "type": TEMPLATES[name][0],
                    "template": name,
                },
            }
            for k, (name, (question, answer, support)) in enumerate(blocks)
        ]
    return splits, docs


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
