"""The learning table: every seed system's training against where it starts, over seeds, on the
demo's 154 ``test`` questions (docs/training.md, "Every seed system learns").

For each system it runs ``harness demo --system NAME --seeds S --out DIR/NAME`` (one SFT model, one
trained agent per seed; a finished demo is cached, so a rerun only reads), then reads the demo's
run folders and prints one row per system and seed: the algorithm, EM of the SFT agent (the start)
and of the trained agent (HARR has a second row per seed, against its own start: the SFT agent
searching with the untrained query tower in HARR's state), the paired EM difference with its
95% interval and one-sided p (paired bootstrap over the shared questions,
:func:`benchmarks.stats.paired_bootstrap`), for HARR the share of supporting passages its searches
retrieved, and each stage's wall time
(``DIR/NAME/timings.json``) with the machine's load average when the demo started and ended.

    PYTHONPATH=. .venv/bin/python scripts/perf/learning_table.py --out runs/learning \\
        --systems search_r1,r1_searcher --seeds 0,1 [--threads 1] [--read-only]

The table is written to ``DIR/learning_table.md`` as well.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.demo_summary import supporting_passages, supporting_recall
from benchmarks.fmt import p_value, pct
from benchmarks.report import load_run
from benchmarks.stats import paired_bootstrap
from programs.demo.program import labels, seeded, start_label
from programs.demo.systems import SYSTEMS, get_system

logger = logging.getLogger("learning_table")


def run_system(name: str, out: Path, seeds: list[int], threads: int | None, extra: list[str]) -> dict[str, float]:
    """``harness demo`` for one system in its own process; returns the load averages around it."""
    cmd = [sys.executable, "-m", "cli.main", "demo", "--system", name, "--out", str(out)]
    cmd += ["--seeds", ",".join(map(str, seeds)), *(["--threads", str(threads)] if threads else []), *extra]
    load_start = os.getloadavg()[0]
    start = time.monotonic()
    logger.info("running: %s", " ".join(cmd))
    subprocess.run(cmd, check=True)
    return {"load_start": load_start, "load_end": os.getloadavg()[0], "seconds": time.monotonic() - start}


def rows(name: str, out: Path, seeds: list[int]) -> list[dict[str, object]]:
    """One row per seed of a finished demo folder, against the SFT agent; HARR's also against its
    own start (``start`` names which)."""
    s = get_system(name)
    _, sft_label, trained = labels(s)
    starts = [("SFT", load_run(out / "eval" / f"{sft_label}-demo-test"))]
    timings = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}
    supporting = None
    if s.chain == "harr":
        supporting = supporting_passages(starts[0][1])
        starts.append(("untrained tower", load_run(out / "eval" / f"{start_label(s)}-demo-test")))
    result = []
    for seed, (start_name, start) in ((seed, start) for seed in seeds for start in starts):
        run = load_run(out / "eval" / f"{seeded(trained, seed)}-demo-test")
        mine, theirs = run.item_values("em"), start.item_values("em")
        shared = sorted(set(mine) & set(theirs))
        d = paired_bootstrap([mine[k] for k in shared], [theirs[k] for k in shared])
        row: dict[str, object] = {
            "system": name,
            "algorithm": s.algorithm,
            "seed": seed,
            "start": start_name,
            "n": d.n,
            "em_start": sum(theirs[k] for k in shared) / max(1, len(shared)),
            "em_trained": sum(mine[k] for k in shared) / max(1, len(shared)),
            "diff": d.diff,
            "low": d.low,
            "high": d.high,
            "p_greater": d.p_greater,
            "train_s": timings.get(seeded("train", seed), {}).get("seconds"),
            "eval_s": timings.get(seeded("eval_trained", seed), {}).get("seconds"),
            "sft_s": timings.get("sft", {}).get("seconds"),
        }
        if supporting:
            row["recall_start"] = supporting_recall(start.path, supporting)
            row["recall_trained"] = supporting_recall(run.path, supporting)
        result.append(row)
    return result


def _minutes(seconds: object) -> str:
    return "–" if seconds is None else f"{float(seconds) / 60:.1f}"


def markdown(table: list[dict[str, object]], loads: dict[str, dict[str, float]]) -> str:
    lines = [
        "| system | algorithm | seed | n | start | EM start | EM trained | paired diff [95% CI] | one-sided p | "
        "supporting recall (start → trained) | SFT / training / eval min | load (start → end) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        recall = (
            f"{pct(r['recall_start'])} → {pct(r['recall_trained'])}" if "recall_start" in r else "–"  # type: ignore[arg-type]
        )
        load = loads.get(str(r["system"]))
        load_text = f"{load['load_start']:.1f} → {load['load_end']:.1f}" if load else "–"
        lines.append(
            f"| {r['system']} | {r['algorithm']} | {r['seed']} | {r['n']} | {r['start']} | "
            f"{pct(r['em_start'])} | "  # type: ignore[arg-type]
            f"{pct(r['em_trained'])} | {pct(r['diff'], signed=True)} [{pct(r['low'])}, {pct(r['high'])}] | "  # type: ignore[arg-type]
            f"{p_value(r['p_greater'], bare=True)} | {recall} | {_minutes(r['sft_s'])} / {_minutes(r['train_s'])} / "  # type: ignore[arg-type]
            f"{_minutes(r['eval_s'])} | {load_text} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/learning", help="one demo folder per system under it")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated demo systems")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of every stage (default: the demo's)")
    ap.add_argument("--read-only", action="store_true", help="only read finished demo folders")
    ap.add_argument("--demo-arg", action="append", default=[], help="an extra argument of harness demo (repeatable)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    loads_file = out / "loads.json"
    loads = json.loads(loads_file.read_text()) if loads_file.exists() else {}
    table = []
    for name in systems:
        if not args.read_only:
            loads[name] = run_system(name, out / name, seeds, args.threads, args.demo_arg)
            out.mkdir(parents=True, exist_ok=True)
            loads_file.write_text(json.dumps(loads, indent=2))
        table += rows(name, out / name, seeds)
    text = markdown(table, loads)
    (out / "learning_table.md").write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
