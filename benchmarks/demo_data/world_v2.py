"""The demo's v2 splits (seed 2026): test, val and train, each over a world of its own, every
template equally often, drawn after v1 without reusing its names (see
:mod:`benchmarks.demo_data.build_demo` for the rules that keep them sound)."""

from __future__ import annotations

from benchmarks.demo_data.world import (
    CODAS,
    INDUSTRIES,
    OCCUPATIONS,
    ONSETS,
    PRODUCT_KINDS,
    PROVINCES,
    TOWN_ENDS,
    VOWELS,
    World,
)

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
