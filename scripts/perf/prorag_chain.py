"""ProRAG's chain on this CPU: run (or resume) ``configs/train/prorag/cpu_chain.yaml`` and print
how each stage moved the model.

    python scripts/perf/prorag_chain.py [--workdir runs/prorag-cpu] [--data-dir ../shared/data]
        [--summary-only]

The chain (``harness stages run``) is SmolLM2-135M-Instruct on HotpotQA train100: synthesized SFT
warm-up, MCTS on 6 questions, PRM training, K=4 sampling + PRM-filtered RFT, RL with the learned
PRM's step advantages; eval stages measure the untrained, SFT, RFT and RL models greedily on 10
dev_distractor1352 questions. Finished stages are never re-run, so an interrupted run resumes.

Printed per eval stage: EM, F1, the fraction of items that ended with an answer in the dialect's
format, searches and generated tokens per question; then MCTS's step/pair counts, the PRM's pair
accuracy, and what RFT's filter kept. Not a timed test: figures depend on the machine and its
load, so the wall time of every stage is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from harness.textfiles import read_jsonl

CHAIN = "configs/train/prorag/cpu_chain.yaml"
EVALS = ("eval_base", "eval_sft", "eval_rft", "eval_rl")


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def eval_row(run: Path) -> str:
    """One eval stage's figures (a folder of run directories: the method's run is the one inside)."""
    results = sorted(run.glob("**/results.json"))
    if not results:
        return "not run"
    r = json.loads(results[0].read_text())
    n = max(r.get("n", 0), 1)
    answered = r.get("finish_reasons", {}).get("answer", 0) / n
    m = r.get("metrics", {})
    return (
        f"EM {m.get('em', float('nan')):.3f}  F1 {m.get('f1', float('nan')):.3f}  answered-in-format {answered:.2f}  "
        f"searches/q {r.get('mean_searches', 0):.2f}  gen tokens/q {r.get('mean_generated_tokens', 0):.0f}  (n={n})"
    )


def summary(workdir: Path) -> None:
    for name in EVALS:
        print(f"{name:10s} {eval_row(workdir / name)}")
    mcts = workdir / "mcts"
    if (mcts / "steps.jsonl").is_file():
        steps = sum(1 for _ in (mcts / "steps.jsonl").open())
        pairs = sum(1 for _ in (mcts / "pairs.jsonl").open()) if (mcts / "pairs.jsonl").is_file() else 0
        print(f"mcts       {steps} step records, {pairs} contrastive pairs")
    metrics = workdir / "prm" / "metrics.jsonl"
    if metrics.is_file():
        rows = [r for _, r in read_jsonl(metrics, tolerant=True)]  # a run may still be appending

        def last(key: str) -> str:
            vals = [r[key] for r in rows if key in r]
            return f"{vals[-1]:.3f}" if vals else "not logged"

        # held out (prm.val_fraction) and on every pair it trained on, told apart
        print(
            f"prm        {len(rows)} logged steps; pair accuracy held out {last('prm/val_pair_acc')}, "
            f"on all pairs {last('prm/train_pair_acc_all')}"
        )
    rft = _json(workdir / "rft_set" / "rft_summary.json")
    if rft:
        print(f"rft        kept {rft['n_kept']} of {rft['n_in']}; dropped {rft['dropped']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="runs/prorag-cpu")
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--summary-only", action="store_true", help="Print the figures of what has run; run nothing.")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    if not args.summary_only:
        cmd = [sys.executable, "-m", "cli.main", "stages", "run", CHAIN, "--workdir", str(workdir)]
        cmd += ["--set", f"data_dir={args.data_dir}"]
        print("running:", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc != 0:
            print(f"the chain stopped (exit {rc}); figures of the stages that finished:", flush=True)
    summary(workdir)
    subprocess.call([sys.executable, "-m", "cli.main", "stages", "status", CHAIN, "--workdir", str(workdir)])


if __name__ == "__main__":
    main()
