"""Does harness GRPO learn as fast as TRL's ``GRPOTrainer``? Learning curves on one task (issue 32).

The learning mode of ``vs_trl.py``, sharing its set-up (``harness_trainer``, ``TRLSide``,
``trl_reward``): both sides train the same SmolLM2 checkpoint in float32 with AdamW (constant LR,
no weight decay, grad-norm clip 1.0), one optimizer step per step, the same group size, prompts
per step, temperature 1, max new tokens, no KL, clip 0.2, token-mean loss, group mean/std
advantages, and the same registered reward (``--reward``, default ``search_r1_format``:
Search-R1 v0.3's EM with format credit, 0 / 0.1 / 0.2 / 1).

The task is single-turn (the agent with ``max_turns=0``): a demo question (``benchmarks/demo_data``
v2, ``train``) with its two supporting passages already in the prompt, as a Search-R1
``<information>`` block after the question (the ``search_r1_small`` dialect, no chat template).
Both sides get the same prompt strings in the same order per seed: the ``train`` questions
shuffled by ``random.Random(seed)``, written to a question file the harness reads with
``data.shuffle=false`` and given to TRL with ``shuffle_dataset=False``.

Each step appends one JSON line to ``OUT/steps.jsonl`` (a kill keeps what was done): side, seed,
step, mean reward, the fraction of groups whose rewards differ (a signal), mean response tokens,
seconds of the step. Before and after training the policy answers the held-out questions
(``--heldout-split``, default ``val``: never trained on) greedily, with the same code for both
sides, scored by the same reward; per-question scores go to ``OUT/heldout.jsonl``. The "before"
scores are the checkpoint's and are computed once per ``OUT`` (cached in ``heldout_before.json``).

    PYTHONPATH=. .venv/bin/python scripts/perf/vs_trl_learn.py --side harness --seed 0 --steps 30 --out OUT
    PYTHONPATH=. .venv/bin/python scripts/perf/vs_trl_learn.py --report --out OUT --figure docs/img/x.png

``--report`` reads ``OUT`` and prints the table of docs/training.md (held-out before/after per side
with paired bootstrap CIs, steps to half of the final gain, seconds per step) and draws the figure.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datasets import corpus_path, load_examples
from benchmarks.stats import bootstrap_ci, paired_bootstrap
from harness.models import load_tokenizer, resolve_model
from harness.types import Example
from pipelines.dialects import resolve_dialect
from scripts.perf.vs_trl import TRLSide, _versions, harness_step, harness_trainer, trl_reward

# The settings the two sides cannot share (printed first, as vs_trl.py does).
NOT_LIKE_FOR_LIKE = (
    "NOT LIKE-FOR-LIKE: TRL generates with model.generate on the training model (stops only at EOS or "
    "the token limit) while the harness agent generates on its hf backend (stops at </answer> too), "
    "so response lengths differ; the two sides draw different random samples (each its own RNG "
    "stream from the same seed); the harness wraps the optimizer in DeepSpeed (ZeRO 0), TRL in accelerate. "
    "The held-out evaluation is the same code for both (greedy HF generate, cut after </answer>)."
)


def with_passages(question: str, passages: list[tuple[str, str]]) -> str:
    """The question followed by its passages as a Search-R1 ``<information>`` block."""
    docs = "\n".join(f"Doc {i}(Title: {t}) {body}" for i, (t, body) in enumerate(passages, 1))
    return f"{question}\n<information>\n{docs}\n</information>"


def demo_examples(split: str) -> list[Any]:
    """The demo split's questions with their two supporting passages in the question text."""
    corpus: dict[str, tuple[str, str]] = {}
    path = corpus_path("demo", split)
    if path is None:
        raise FileNotFoundError(f"no corpus for demo split {split!r}")
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            title, _, body = row["contents"].partition("\n")
            corpus[row["id"]] = (title, body)
    out = []
    for e in load_examples("demo", split):
        ids = e.metadata.get("supporting_doc_ids") or []
        missing = [i for i in ids if i not in corpus]
        if missing or not ids:
            raise ValueError(f"demo {split} {e.id}: supporting passages {missing or ids} not in {path}")
        out.append(Example(e.id, with_passages(e.question, [corpus[i] for i in ids]), e.answers, dict(e.metadata)))
    return out


def seed_order(examples: list[Any], seed: int, n: int) -> list[Any]:
    """The first ``n`` examples of the split shuffled by ``random.Random(seed)`` (both sides' order)."""
    order = list(examples)
    random.Random(seed).shuffle(order)
    return order[:n]


def render(examples: list[Any], model: str, few_shot: bool) -> list[str]:
    """The prompt strings the harness agent renders (search_r1 small, no chat)."""
    tok = load_tokenizer(model)
    d = resolve_dialect("search_r1", "small")
    return [d.render(e.question, tok, chat=False, few_shot=few_shot) for e in examples]


def heldout(
    model: Any, tok: Any, prompts: list[str], answers: list[list[str]], args: argparse.Namespace
) -> list[float]:
    """Per-question reward of the greedy answers (batched HF generate, cut after ``</answer>``)."""
    # deferred: torch costs ~1.4 s at import
    import torch

    score = trl_reward(args.reward, 1, [])
    model.eval()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    out: list[float] = []
    with torch.no_grad():
        for i in range(0, len(prompts), args.eval_batch):
            enc = tok(prompts[i : i + args.eval_batch], return_tensors="pt", padding=True)  # [B, T]
            gen = model.generate(
                **enc, do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id
            )  # [B, T + new]
            texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            texts = [t.split("</answer>")[0] + "</answer>" if "</answer>" in t else t for t in texts]
            out.extend(score(texts, answers[i : i + args.eval_batch]))
    model.train()
    return out


def append(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


def run_side(side: str, seed: int, args: argparse.Namespace, out: Path) -> None:
    """Train one side for ``args.steps`` steps from the checkpoint; log per step and held-out."""
    # deferred: torch costs ~1.4 s at import
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    train = seed_order(demo_examples("train"), seed, args.steps * args.prompts)
    held = demo_examples(args.heldout_split)[: args.heldout_limit]
    held_prompts, held_answers = render(held, args.model, args.few_shot), [list(e.answers) for e in held]
    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))

    before_file = out / "heldout_before.json"
    if not before_file.exists():
        base = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32)
        scores = heldout(base, tok, held_prompts, held_answers, args)
        before_file.write_text(json.dumps({"ids": [e.id for e in held], "scores": scores}))
        del base

    with tempfile.TemporaryDirectory() as tmp:
        qfile = Path(tmp) / "train.jsonl"
        qfile.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in train))
        if side == "harness":
            trainer, clock = harness_trainer(
                args,
                Path(tmp) / "harness",
                (
                    f"data.file={qfile}",
                    "data.shuffle=false",
                    f"trainer.seed={seed}",
                    "data.dataset=demo",
                    *args.harness_set,
                ),
            )

            def step() -> dict[str, float]:
                r = harness_step(trainer, clock)
                m = trainer.last_metrics
                return {"reward": m["reward/mean"], "signal": 1.0 - r["uniform_groups"], "step_s": r["step"]}

            _keep_metrics(trainer)
        else:
            trl = TRLSide(
                args,
                render(train, args.model, args.few_shot),
                [list(e.answers) for e in train],
                Path(tmp) / "trl",
                {"seed": seed, "shuffle_dataset": False},
            )

            def step() -> dict[str, float]:
                r = trl.step()
                return {
                    "reward": statistics.fmean(trl.rewards),
                    "signal": 1.0 - r["uniform_groups"],
                    "step_s": r["step"],
                    "tokens": r["tokens"],
                }

        rows = args.group_size * args.prompts
        t0 = time.perf_counter()
        for i in range(args.steps):
            r = step()
            resp = trainer.last_metrics["response_tokens"] if side == "harness" else r["tokens"] / rows
            row = {
                "side": side,
                "seed": seed,
                "step": i + 1,
                "reward_mean": r["reward"],
                "signal_frac": r["signal"],
                "response_tokens": resp,
                "step_s": r["step_s"],
                "wall_s": time.perf_counter() - t0,
            }
            append(out / "steps.jsonl", row)
            print(json.dumps(row), flush=True)
        if side == "harness":
            policy = trainer.policy
            model = getattr(policy, "module", policy)
        else:
            trl.thread.join(timeout=120)
            model = trl.trainer.model
        scores = heldout(model, tok, held_prompts, held_answers, args)
        append(out / "heldout.jsonl", {"side": side, "seed": seed, "ids": [e.id for e in held], "scores": scores})
        print(f"{side} seed {seed}: held-out mean reward {statistics.fmean(scores):.3f}", flush=True)
        if side == "harness":
            trainer.backend.close()


def _keep_metrics(trainer: Any) -> None:
    """Keep the trainer's last step metrics on the instance (this benchmark reads them)."""
    inner = trainer.step

    def step() -> dict[str, float]:
        m = inner()
        trainer.last_metrics = m
        return m

    trainer.step = step


# ----------------------------------------------------------------------------------------- report
def steps_to_half(curve: list[float], head: int = 3, tail: int = 5, window: int = 3) -> tuple[float, int | None]:
    """(final gain, first step whose trailing ``window``-step mean reaches half of it). Gain: the
    mean of the last ``tail`` steps minus the mean of the first ``head``; None when it is not
    positive or never reached."""
    start, end = statistics.fmean(curve[:head]), statistics.fmean(curve[-tail:])
    gain = end - start
    if gain <= 0:
        return gain, None
    for i in range(len(curve)):
        if statistics.fmean(curve[max(0, i - window + 1) : i + 1]) >= start + gain / 2:
            return gain, i + 1
    return gain, None


def report(out: Path, figure: Path | None) -> None:
    """The table (markdown) and the figure from ``out``'s JSONL files."""

    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]
    held = [json.loads(x) for x in (out / "heldout.jsonl").read_text().splitlines() if x.strip()]
    before = json.loads((out / "heldout_before.json").read_text())
    curves: dict[str, dict[int, list[float]]] = {}
    secs: dict[str, list[float]] = {}
    done = {(h["side"], h["seed"]) for h in held}  # finished runs only (a killed run has no held-out)
    for r in steps:
        if (r["side"], r["seed"]) not in done:
            continue
        curves.setdefault(r["side"], {}).setdefault(r["seed"], []).append(r["reward_mean"])
        secs.setdefault(r["side"], []).append(r["step_s"])
    print(
        "| side | seeds | held-out before | after (95% CI) | after − before [paired 95% CI] "
        "| final reward gain | steps to half of it | s/step (median) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    after_by: dict[str, dict[int, list[float]]] = {}
    for side in ("harness", "trl"):
        rows = [h for h in held if h["side"] == side]
        if not rows:
            continue
        for h in rows:
            assert h["ids"] == before["ids"], "held-out questions differ from the before scores"
            after_by.setdefault(side, {})[h["seed"]] = h["scores"]
        a = [s for h in rows for s in h["scores"]]
        b = before["scores"] * len(rows)  # the same checkpoint before every seed: pairs per question
        d, ci = paired_bootstrap(a, b), bootstrap_ci(a)
        mean_curve = np.mean([c for c in curves[side].values()], axis=0).tolist()
        gain, half = steps_to_half(mean_curve)
        print(
            f"| {side} | {len(rows)} | {100 * statistics.fmean(before['scores']):.1f} | "
            f"{100 * ci.mean:.1f} [{100 * ci.low:.1f}, {100 * ci.high:.1f}] | "
            f"{100 * d.diff:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] (one-sided p={d.p_greater:.3f}) | "
            f"{gain:+.3f} | {half if half is not None else 'not reached'} | {statistics.median(secs[side]):.1f} |"
        )
        for seed, sc in sorted(after_by[side].items()):
            print(f"|   seed {seed} | | | {100 * statistics.fmean(sc):.1f} | | | | |")
    if "harness" in after_by and "trl" in after_by:
        seeds = sorted(set(after_by["harness"]) & set(after_by["trl"]))
        a = [s for k in seeds for s in after_by["harness"][k]]
        b = [s for k in seeds for s in after_by["trl"][k]]
        d = paired_bootstrap(a, b)
        print(
            f"\nharness − TRL after training (seeds {seeds}, paired per question and seed): "
            f"{100 * d.diff:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}]"
        )
    if figure is not None:
        # deferred: matplotlib costs ~0.3 s at import, only for figures
        import matplotlib

        matplotlib.use("Agg")
        # deferred: matplotlib costs ~0.3 s at import, only for figures
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for side, color in (("harness", "tab:blue"), ("trl", "tab:orange")):
            if side not in curves:
                continue
            n = min(len(c) for c in curves[side].values())
            m = np.array([c[:n] for c in curves[side].values()])  # [seeds, steps]
            x = np.arange(1, n + 1)
            ax.plot(x, m.mean(0), color=color, label=f"{side} (mean of {m.shape[0]} seeds)")
            ax.fill_between(x, m.min(0), m.max(0), color=color, alpha=0.2, label=f"{side} min–max over seeds")
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward of the step's rollouts")
        ax.set_title("GRPO on demo questions with passages, SmolLM2-135M")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(figure, dpi=110)
        print(f"figure: {figure}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", choices=("harness", "trl", "both"), default="both")
    p.add_argument("--seed", type=int, action="append", help="repeatable; default 0")
    p.add_argument("--out", required=True, help="results folder (steps.jsonl, heldout.jsonl)")
    p.add_argument("--report", action="store_true", help="print the table from --out and draw --figure")
    p.add_argument("--figure", type=Path)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--reward", default="search_r1_format")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument(
        "--no-few-shot", dest="few_shot", action="store_false", help="without the dialect's one-shot demonstration"
    )
    p.add_argument("--heldout-split", default="val")
    p.add_argument("--heldout-limit", type=int, default=56)
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--harness-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides of the harness side's recipe, last (e.g. model.share_prompt=true)",
    )
    args = p.parse_args()
    out = Path(args.out)
    if args.report:
        report(out, args.figure)
        return
    try:  # deferred: optional extra (harness[compare])
        from trl import GRPOTrainer  # noqa: F401
    except Exception as e:  # any import failure: say so and stop
        print(f"TRL is not usable here ({type(e).__name__}: {e}); install the extra: pip install -e '.[compare]'")
        sys.exit(2)
    # vs_trl's harness_trainer reads these; the task is the demo, single-turn, no shot
    args.dataset, args.split, args.data_dir, args.warmup = "demo", "train", "null", 0
    print(NOT_LIKE_FOR_LIKE, flush=True)
    print(
        f"pinned: {_versions()} model={args.model} group_size={args.group_size} prompts/step={args.prompts} "
        f"max_new_tokens={args.max_new_tokens} few_shot={args.few_shot} lr={args.lr} reward={args.reward} "
        f"steps={args.steps} harness-set={args.harness_set} "
        f"heldout={args.heldout_split}[:{args.heldout_limit}] threads={args.threads} dtype=float32 AdamW",
        flush=True,
    )
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seed or [0]:
        for side in ("harness", "trl") if args.side == "both" else (args.side,):
            run_side(side, seed, args, out)


if __name__ == "__main__":
    main()
