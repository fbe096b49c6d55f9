"""HARR-style retriever RL on HotpotQA (distractor questions over their 13k-paragraph corpus), before/after.

Not a test: a short benchmark run. It trains the MiniLM query tower (documents fixed: the cached
dense index) with GRPO while the generator stays frozen, once per pipeline (FlashRAG ``standard``
RAG and the ``search_r1`` agent dialect), and reports on held-out questions, with greedy top-k
retrieval, answer-recall (a gold answer in any retrieved paragraph) and the pipeline's EM/F1,
before and after training.

Generators:

- ``oracle`` (default, CPU-friendly): a SCRIPTED reader that answers the gold answer exactly when
  a retrieved paragraph contains it (normalised) and "unknown" otherwise. As the agent it
  searches the question, and if the answer is not in the results searches the SAME question
  again (the history-aware state makes the second call differ), then answers. Its EM therefore
  measures retrieval, not reading. Yes/no questions are left out (their answers occur in
  paragraphs by accident).
- ``hf``: a real frozen model (``--model``, default SmolLM2-135M-Instruct) on the HF backend;
  slow on CPU.

Held-out questions are the first ``--heldout`` of ``dev_distractor1352``; training questions the
next ``--train`` (disjoint), optionally filtered HARR's way (``--filter``).

    python scripts/perf/harr_train.py --train 64 --heldout 64 --steps 10 --out /tmp/harr_bench

Measured on the shared 2-core VM, oracle reader, ``--heldout 64 --train 48 --filter --steps 8
--group-size 4 --questions-per-step 8 --epochs 2 --lr 5e-5 --tau 0.05 --n-candidates 50 --topk 3``
(held-out = 64 non-yes/no dev questions; greedy retrieval; EM = F1 = answer-recall for this reader):

- standard: filter kept 14/48; train reward (first 3 → last 3 steps) 0.59 → 0.87; held-out EM
  0.484 → 0.469 (no gain: the tower fit its 14 questions, 25 s/step).
- search_r1 (2 searches of the same question, history-aware state): kept 17/48; train reward
  0.59 → 0.74; held-out EM 0.500 → 0.500 (no gain, 60 s/step).

SmolLM2-135M-Instruct frozen (HF backend, CPU, the shared VM under load ~16-20), ``standard`` only,
a short run: ``--methods standard --generator hf --heldout 16 --train 16 --steps 4 --group-size 4
--questions-per-step 4 --epochs 2 --lr 5e-5`` (GRPO, no filter): train reward per step 0.036,
0.121, 0.079, 0.039 (no trend); held-out EM 0.000 → 0.000, F1 0.109 → 0.119, answer-recall 0.438
→ 0.500 (one question of 16: noise, not a gain). 4-5 min per step (16 generations one at a
time: the baseline runner is sequential), 19 min of training. The 135M reader rarely answers
right even with the gold paragraph, so there is little reward signal to learn from.

Both sets of figures were taken when this script evaluated through the training runner; it now
evaluates through ``simple_evaluate`` (the eval path), where FlashRAG's ``standard`` searches
with the bare query (as ``harness eval --retriever harr`` runs a baseline) instead of the
history-aware state the runner gave it, so its held-out figures may differ when re-measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.build import run_dir_for, simple_evaluate
from harness import safe_delete
from harness.backends import build_backend
from harness.config import from_dict
from harness.eval_config import BackendConfig, EvalConfig
from harness.runlog import RUN_ENTRIES, RunDir
from harness.tokenization import byte_tokenizer
from pipelines.methods import method_kind
from training.config import TrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from benchmarks.datasets import read_examples  # noqa: E402
from benchmarks.metrics import normalize_answer  # noqa: E402
from harness.backends.scripted import ScriptedBackend  # noqa: E402
from harness.types import Example  # noqa: E402

logger = logging.getLogger("harr_bench")
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "hotpotqa"  # ../shared/data from the repo


class OracleReader(ScriptedBackend):
    """Answers a question's gold answer iff it appears in the context outside the question itself."""

    def __init__(self, golds: dict[str, list[str]], agent: bool, model_path: str | None = None) -> None:
        super().__init__(default="unknown", model_path=model_path)
        self.golds = {q: [normalize_answer(a) for a in ans] for q, ans in golds.items()}
        self.agent = agent

    def _pick(self, context: str) -> tuple[str, Any]:
        question = next((q for q in self.golds if q in context), None)
        if question is None:
            return ("<answer>unknown</answer>" if self.agent else "unknown"), None
        # Only what retrieval brought counts: the question (and the agent's own queries of it) is cut out.
        rest = (context.split(question, 1)[1] if self.agent else context).replace(question, " ")
        text = f" {normalize_answer(rest)} "
        hit = next((a for a in self.golds[question] if a and f" {a} " in text), None)
        if not self.agent:
            return (hit or "unknown"), None
        if hit is not None:
            return f"<answer>{hit}</answer>", None
        if context.count(f"<search>{question}</search>") < 2:
            return f"<search>{question}</search>", None
        return "<answer>unknown</answer>", None


def tiny_model_dir(out: Path) -> str:
    """A model dir FlashRAG's prompt templates can read (config + the byte tokenizer)."""
    # deferred: transformers costs ~0.8 s at import
    from transformers import LlamaConfig

    d = out / "oracle-model"
    if not (d / "config.json").is_file():
        tok = byte_tokenizer()
        LlamaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2).save_pretrained(d)
        tok.save_pretrained(d)
    return str(d)


def load_questions(path: str, n_heldout: int, n_train: int) -> tuple[list[Example], list[Example]]:
    exs = [e for e in read_examples(path) if normalize_answer(e.answers[0]) not in ("yes", "no")]
    return exs[:n_heldout], exs[n_heldout : n_heldout + n_train]


AGENT_OPTIONS = {
    # max_doc_tokens: the oracle's byte tokenizer counts characters; show whole paragraphs.
    "oracle": {"max_turns": 2, "temperature": 0.0, "max_doc_tokens": 4096, "max_total_tokens": 16384},
    # A real frozen model, greedy and short so the benchmark is fast and repeatable (the shipped
    # recipe, configs/train/harr/minilm_search_r1.yaml, samples as HARR's generator: 0.7, 512 tokens, 5 turns).
    "hf": {
        "max_turns": 2,
        "temperature": 0.0,
        "chat": False,
        "few_shot": True,
        "response_prefix": "<think>",
        "max_new_tokens": 48,
    },
}
BASELINE_OPTIONS = {
    # The byte tokenizer counts characters: room for k HotpotQA paragraphs, none cut off.
    "oracle": {"max_new_tokens": 32, "max_input_len": 16384},
    "hf": {"max_new_tokens": 32},
}


def heldout_eval(method: str, backend: Any, retriever: Any, heldout: list[Example], args: Any, out: Path) -> dict:
    """Greedy (top-k) retrieval through the eval path (``simple_evaluate``, as ``harness eval
    --retriever harr`` runs it): EM, F1 and answer-recall over the held-out questions."""
    # deferred: training.retriever.retriever_loss imports torch (~1.4 s)
    from training.retriever.retriever_loss import answer_recall

    for old in sorted(out.iterdir()) if out.is_dir() else []:  # a run of an older tower must not be resumed
        safe_delete.remove(old, RUN_ENTRIES, kind="eval", why="harr_train")
    retriever.greedy = True  # the trainer's next step samples again
    cfg = from_dict(
        EvalConfig,
        {
            "method": method,
            "dataset": {"name": "hotpotqa"},  # names the run; the questions are ``heldout``
            "retriever": {"kind": "harr", "topk": args.topk},
            "agent": AGENT_OPTIONS[args.generator],
            "baseline": BASELINE_OPTIONS[args.generator],
            "metrics": ["em", "f1"],
            "out": str(out),
        },
    )
    res = simple_evaluate(cfg, backend=backend, retriever=retriever, examples=heldout)
    trajs = RunDir(run_dir_for(cfg)).trajectories()
    recall = sum(answer_recall(t) for t in trajs) / max(len(trajs), 1)
    return {"em": res.metrics["em"], "f1": res.metrics["f1"], "answer_recall": recall, "n": float(res.n)}


def run_pipeline(method: str, args: argparse.Namespace, heldout: list[Example], train: list[Example]) -> dict:
    # deferred: training.retriever.retriever_rl imports torch (~1.4 s)
    from training.retriever.retriever_rl import RetrieverRL, build_from_config, filter_examples

    out = Path(args.out) / method
    cfg = from_dict(
        TrainConfig,
        {
            "algo": {"kind": "retriever"},
            "retriever_rl": {
                "method": method,
                "corpus": args.corpus,
                "sampling": {"n_candidates": args.n_candidates, "tau": args.tau, "topk": args.topk},
                "rl": {
                    "algo": args.algo,
                    "group_size": args.group_size,
                    "questions_per_step": args.questions_per_step,
                    "steps": args.steps,
                    "lr": args.lr,
                    "epochs": args.epochs,
                    "kl_coef": args.kl_coef,
                    "reward": "f1",
                },
                "agent": AGENT_OPTIONS[args.generator],
                "baseline": BASELINE_OPTIONS[args.generator],
            },
        },
    )
    agent = method_kind(method) == "agent"
    golds = {e.question: list(e.answers) for e in heldout + train}
    if args.generator == "oracle":
        backend: Any = OracleReader(golds, agent, model_path=None if agent else tiny_model_dir(Path(args.out)))
    else:
        backend = build_backend(BackendConfig(kind="hf", model=args.model))
    retriever, runner = build_from_config(cfg, backend=backend)
    t0 = time.perf_counter()
    before = heldout_eval(method, backend, retriever, heldout, args, out / "eval-before")
    logger.info("%s before: %s (%.0f s)", method, before, time.perf_counter() - t0)
    if args.filter:
        kept, rows = filter_examples(runner, train, args.group_size, metric="f1", threshold=0.5)
        logger.info("%s filter: kept %d/%d training questions", method, len(kept), len(train))
        train = kept or train
    steps: list[dict] = []
    t1 = time.perf_counter()
    RetrieverRL(retriever, runner, cfg.retriever_rl.rl, out).train(train, on_step=lambda r: steps.append(r.metrics))
    train_s = time.perf_counter() - t1
    after = heldout_eval(method, backend, retriever, heldout, args, out / "eval-after")
    logger.info("%s after: %s", method, after)
    return {
        "method": method,
        "train_questions": len(train),
        "before": before,
        "after": after,
        "train_reward_first3": sum(s["reward"] for s in steps[:3]) / max(1, len(steps[:3])),
        "train_reward_last3": sum(s["reward"] for s in steps[-3:]) / max(1, len(steps[-3:])),
        "train_seconds": round(train_s, 1),
        "encoder": str(out / "encoder"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="standard,search_r1")
    p.add_argument("--questions", default=str(DATA / "dev_distractor1352.jsonl"))
    p.add_argument("--corpus", default=str(DATA / "corpus_distractor1352.jsonl"))
    p.add_argument("--generator", choices=("oracle", "hf"), default="oracle")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--heldout", type=int, default=64)
    p.add_argument("--train", type=int, default=64)
    p.add_argument("--filter", action="store_true", help="HARR's filter on the training questions first")
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--questions-per-step", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--kl-coef", type=float, default=0.0)
    p.add_argument("--tau", type=float, default=0.05)
    p.add_argument("--n-candidates", type=int, default=50)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--out", default="/tmp/harr_bench")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    heldout, train = load_questions(args.questions, args.heldout, args.train)
    results = [run_pipeline(m, args, heldout, train) for m in args.methods.split(",")]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
