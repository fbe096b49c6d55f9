"""Time and peak memory of ``harness index check``'s corpus scan at several corpus sizes.

The scan (:func:`benchmarks.answerability.scan_corpus`) must stay flat in memory as the corpus
grows, so that it can stream wiki-18 (21M passages). This script looks for the answers of the
given question sets (default: the four multi-hop dev sets, every question) in corpora of
several sizes made from one local corpus: its first half, all of it, and ``--repeat`` copies of
it end to end (a scan does not care that passages repeat; the found set stops growing, the work
per passage does not). Each size is scanned in a fresh process, which reports its peak resident
memory (``ru_maxrss``) before and after the scan, the time, and passages per second; the last
line extrapolates the time to ``--target`` passages (wiki-18: 21,015,324).

    .venv/bin/python scripts/perf/answerability_scan.py [--corpus FILE] [--repeat 4] [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from benchmarks.answerability import SPAN, answer_keys, question_kind, scan_corpus
from benchmarks.datasets import load_examples

DEV_SETS = (("hotpotqa", "dev"), ("2wikimultihopqa", "dev"), ("musique", "dev"), ("bamboogle", "test"))


def answer_set(data_dir: str) -> list[str]:
    keys: set[str] = set()
    for name, split in DEV_SETS:
        for e in load_examples(name, split, data_dir=data_dir):
            ks = answer_keys(e.answers)
            if question_kind(ks) == SPAN:
                keys.update(ks)
    return sorted(keys)


def child(corpus: str, keys_file: str, workers: int, trace: bool) -> None:
    """One scan in this process; prints a JSON line."""
    keys = json.loads(Path(keys_file).read_text())
    if trace:
        tracemalloc.start()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu0, t0 = time.process_time(), time.perf_counter()
    res = scan_corpus(corpus, keys, workers)
    secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    traced = tracemalloc.get_traced_memory()[1] if trace else None  # peak bytes allocated by Python during the scan
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"rows": res.rows, "found": len(res.found), "seconds": secs, "cpu_seconds": cpu + kids.ru_utime,
                      "rss_before_kb": before, "rss_peak_kb": after, "worker_peak_kb": kids.ru_maxrss,
                      "traced_peak_bytes": traced}))  # fmt: skip


def make_sizes(corpus: Path, repeat: int, tmp: Path) -> list[Path]:
    lines = corpus.read_bytes().splitlines(keepends=True)
    half = tmp / "half.jsonl"
    half.write_bytes(b"".join(lines[: len(lines) // 2]))
    out = [half, corpus]
    if repeat > 1:
        big = tmp / f"x{repeat}.jsonl"
        with open(big, "wb") as f:
            for _ in range(repeat):
                f.write(b"".join(lines))
        out.append(big)
    return out


def main() -> None:
    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=str(here.parents[3] / "shared" / "data"))
    p.add_argument("--corpus", default=None, help="Default: DATA/hotpotqa/corpus_distractor1352.jsonl.")
    p.add_argument("--repeat", type=int, default=4, help="Also scan this many copies of the corpus end to end.")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--target", type=int, default=21_015_324, help="Passages to extrapolate to (wiki-18).")
    p.add_argument("--tracemalloc", action="store_true", help="Also trace Python allocations (slower).")
    p.add_argument("--child", nargs=2, metavar=("CORPUS", "KEYS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.workers, args.tracemalloc)
        return
    corpus = Path(args.corpus or Path(args.data_dir) / "hotpotqa" / "corpus_distractor1352.jsonl")
    with tempfile.TemporaryDirectory() as tmp:
        keys_file = Path(tmp) / "keys.json"
        keys = answer_set(args.data_dir)
        keys_file.write_text(json.dumps(keys))
        print(f"{len(keys)} distinct normalised answers ({', '.join(f'{n} {s}' for n, s in DEV_SETS)})")
        cpu_us: list[float] = []
        for path in make_sizes(corpus, args.repeat, Path(tmp)):
            cmd = [sys.executable, __file__, "--child", str(path), str(keys_file), "--workers", str(args.workers)]
            cmd += ["--tracemalloc"] if args.tracemalloc else []
            r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            rate = r["rows"] / r["seconds"]
            cpu_us.append(1e6 * r["cpu_seconds"] / r["rows"])
            peak = max(r["rss_peak_kb"], r["worker_peak_kb"]) / 1024
            traced = f"; traced Python peak {r['traced_peak_bytes'] / 2**20:.2f} MiB" if r["traced_peak_bytes"] else ""
            print(
                f"{path.name:>32} {r['rows']:>8} passages {path.stat().st_size / 2**20:7.1f} MiB: "
                f"{r['seconds']:6.2f} s "
                f"wall ({rate:,.0f} passages/s), {cpu_us[-1]:.0f} us CPU a passage, {r['found']} answers found; "
                f"peak RSS {peak:.1f} MiB (before the scan {r['rss_before_kb'] / 1024:.1f} MiB){traced}"
            )
        cpu_min = args.target * max(cpu_us) / 1e6 / 60
        print(
            f"extrapolated to {args.target:,} passages at the slowest CPU rate: {cpu_min:.0f} CPU-minutes "
            f"(about {cpu_min:.0f} min on one free core, {cpu_min / 16:.0f} min with --workers 16 on 16 free cores)"
        )


if __name__ == "__main__":
    main()
