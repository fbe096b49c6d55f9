"""The demo's first world (v1, seed 7), unchanged byte for byte since it shipped: the test_v1 and
train_v1 questions and their corpus (see :mod:`benchmarks.demo_data.build_demo`)."""

from __future__ import annotations

from benchmarks.demo_data.world import INDUSTRIES, OCCUPATIONS, PRODUCT_KINDS, PROVINCES, THINGS, World


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
