"""TRL's ``GRPOTrainer`` against ``harness train`` GRPO, step by step in one process (a benchmark,
not a test). Needs TRL: ``pip install -e '.[compare]'`` (exits non-zero, saying so, without it).

Both sides train the same model (SmolLM2 by default) in float32 with AdamW (constant LR, no
weight decay, grad-norm clip 1.0), the same group size, prompts per step, temperature and max new
tokens, one optimizer step per step (every row in one micro-batch), no KL, clip 0.2, token-mean
loss (TRL's ``dapo``), group mean/std advantages, and the same registered reward on both sides
(``--reward``, default ``search_r1_format``: Search-R1 v0.3's EM with format credit, 0 / 0.1 /
0.2 / 1, so groups vary even when no answer is exact; with plain ``em`` a small model scores 0
everywhere and no step learns). TRL's side scores each completion through the same reward object
(a trajectory holding the completion as its response). Each step prints the fraction of groups
whose rewards were all equal; the script warns when every group of every timed step was uniform.
The task is one generation per prompt (the agent with ``max_turns=0``: no search), as TRL's
trainer does without tools; both get the same prompt string (the ``search_r1_small`` dialect, no
chat template; ``--few-shot`` adds its one-shot demonstration), for ``--dataset``/``--split``.

    PYTHONPATH=. .venv/bin/python scripts/perf/vs_trl.py --steps 2 --data-dir ../shared/data

The sides alternate step by step (harness, TRL, then TRL, harness: TRL's ``train()`` runs on a worker
thread and waits at each step boundary), and medians over steps after ``--warmup`` are reported.
Per step: generated tokens/s, seconds in generate / score / update / sync, and the overhead
fraction: step time that is neither the engine generating nor the update (forwards, backward,
optimizer). The harness's collation (trajectories to tensors) and its advantage computation are
timed apart and counted as overhead, not update, as TRL's preparation outside its log-prob
forwards is. Generate is the time the engine had at least one request in flight (harness) or in
``model.generate`` (TRL). TRL generates with the training model itself (no separate engine), so
its sync is 0; the harness's ``hf`` rollout backend holds its own copy, which sync refreshes.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import logging
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.datasets import load_examples
from harness.config import compose
from harness.models import load_tokenizer, resolve_model
from harness.types import Trajectory
from pipelines.dialects import resolve_dialect
from training.build import build_trainer
from training.config import TrainConfig
from training.rewards import build_reward

NOT_LIKE_FOR_LIKE = (
    "NOT LIKE-FOR-LIKE: TRL generates with model.generate on the training model (padded static "
    "batch, stops only at EOS or the token limit) while the harness agent generates on its hf "
    "backend (continuous batching, stops at </answer> too), so generated token counts differ: "
    "compare tokens/s, not seconds; the two sides draw their prompts in different orders from the "
    "same split; the harness wraps the optimizer in DeepSpeed (ZeRO 0), TRL in accelerate."
)


def _versions() -> str:
    def v(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "absent"

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return (
        f"trl={v('trl')} transformers={v('transformers')} torch={v('torch')} accelerate={v('accelerate')} "
        f"deepspeed={v('deepspeed')} harness@{commit or '?'}"
    )


class BusyClock:
    """Seconds during which at least one request was in flight (overlapping requests count once)."""

    def __init__(self) -> None:
        self.busy, self.active, self.since = 0.0, 0, 0.0

    def start(self) -> None:
        if self.active == 0:
            self.since = time.perf_counter()
        self.active += 1

    def stop(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.busy += time.perf_counter() - self.since

    def take(self) -> float:
        out, self.busy = self.busy, 0.0
        return out


# ---------------------------------------------------------------------------------------- harness
def harness_trainer(args: argparse.Namespace, out: Path, extra: tuple[str, ...] = ()) -> tuple[Any, BusyClock]:
    """The harness's GRPO trainer with the settings above; ``extra`` overrides come last (they win)."""
    rows = args.group_size * args.prompts
    overrides = [
        f"model.path={args.model}",
        "model.dtype=float32",
        f"data.dataset={args.dataset}",
        f"data.split={args.split}",
        f"data.data_dir={args.data_dir}",
        "data.val_split=null",
        "rollout.method=search_r1",
        f"rollout.n_samples={args.group_size}",
        f"rollout.prompts_per_step={args.prompts}",
        "rollout.sampling.temperature=1.0",
        f"rollout.sampling.max_new_tokens={args.max_new_tokens}",
        f"rollout.backend.max_batch_size={rows}",
        f"rollout.agent={{variant: small, chat: false, few_shot: {str(args.few_shot).lower()}, max_turns: 0, "
        f"max_total_tokens: {args.max_new_tokens}}}",
        "retriever.kind=bm25",
        "algo.advantage=grpo",
        f"algo.reward={args.reward}",
        "algo.loss_agg=token_mean",
        "algo.kl_coef=0.0",
        "algo.ppo_epochs=1",
        f"algo.ppo_mini_batch_size={rows}",
        f"optim.lr={args.lr}",
        f"optim.micro_batch_size={rows}",
        "optim.grad_clip=1.0",
        "optim.weight_decay=0.0",
        f"optim.threads={args.threads}",
        f"trainer.max_steps={args.steps + args.warmup}",
        "trainer.save_every=0",
        "trainer.eval_every=0",
        "trainer.progress=false",
        f"trainer.out={out}",
        *extra,
    ]
    cfg = compose(TrainConfig, [], overrides)
    trainer = build_trainer(cfg, out)
    clock = BusyClock()
    backend = trainer.agent.backend
    inner = backend.agenerate

    async def timed(*a: Any, **kw: Any) -> Any:
        clock.start()
        try:
            return await inner(*a, **kw)
        finally:
            clock.stop()

    backend.agenerate = timed  # instance attribute: instrumentation for this benchmark only
    _time_prep(trainer)
    return trainer, clock


# harness seconds in collation and advantages this step, and the fraction of uniform groups
PREP = {"collate": 0.0, "advantages": 0.0, "uniform": float("nan")}


def _time_prep(trainer: Any) -> None:
    """Time the trainer's collation and advantage computation (overhead, not update): the module's
    ``collate`` and the instance's ``advantages`` are wrapped for this benchmark only."""
    # deferred: training.rl.trainer imports torch (~1.4 s)
    import training.rl.trainer as tt

    def wrap(fn: Any, key: str) -> Any:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                PREP[key] += time.perf_counter() - t0

        return timed

    inner = wrap(tt.collate, "collate")

    def collate(trajs: Any, rewards: Any, group_ids: Any, *a: Any, **kw: Any) -> Any:
        groups: dict[int, list[float]] = {}
        for g, r in zip(group_ids, rewards, strict=True):
            groups.setdefault(int(g), []).append(float(r))
        PREP["uniform"] = sum(1 for v in groups.values() if max(v) == min(v)) / max(1, len(groups))
        return inner(trajs, rewards, group_ids, *a, **kw)

    tt.collate = collate
    trainer.rl_update.advantages = wrap(trainer.rl_update.advantages, "advantages")


def harness_step(trainer: Any, clock: BusyClock) -> dict[str, float]:
    clock.take()
    PREP.update(collate=0.0, advantages=0.0, uniform=1.0)  # no collate: every group was uniform
    m = trainer.step()
    gen = clock.take()
    step = m["time/step_s"]
    prep = PREP["collate"] + PREP["advantages"]
    update = m["time/update_s"] - prep
    return {
        "generate": gen,
        "score": m["time/reward_s"],
        "prep": prep,
        "update": update,
        "sync": m["time/sync_s"],
        "step": step,
        "tokens": m["tokens/generated"],
        "uniform_groups": PREP["uniform"],
        "overhead": (step - gen - update) / step,
    }


def group_uniform_frac(rewards: list[float], group_size: int) -> float:
    """Fraction of consecutive groups of ``group_size`` whose rewards are all equal."""
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    return sum(1 for g in groups if max(g) == min(g)) / max(1, len(groups))


def trl_reward(name: str, group_size: int, sink: list[float]) -> Any:
    """TRL's reward function: the harness's registered reward ``name`` on a trajectory holding the
    completion as its response (the dialect the harness side runs), so both sides score alike.
    Each call's rewards are also appended to ``sink`` (the uniform-group count)."""
    reward = build_reward(name)

    def fn(completions: list[str], answers: list[list[str]], **_: Any) -> list[float]:
        out = []
        for text, golds in zip(completions, answers, strict=True):
            traj = Trajectory(
                example_id="trl",
                question="",
                answers=list(golds),
                method="search_r1",
                response_text=text,
                finish_reason="answer" if "</answer>" in text else "eos_without_answer",
                metadata={"dialect": "search_r1_small"},
            )
            out.append(float(reward(traj)[0]))
        sink.extend(out)
        return out

    fn.__name__ = f"harness_{name}"
    return fn


# -------------------------------------------------------------------------------------------- TRL
class TRLSide:
    """TRL's ``GRPOTrainer.train()`` on a worker thread, released one step at a time."""

    def __init__(
        self,
        args: argparse.Namespace,
        prompts: list[str],
        answers: list[list[str]],
        out: Path,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """``extra``: GRPOConfig fields that replace the defaults below (a seed, the data order)."""
        # deferred: torch costs ~1.4 s at import
        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        torch.set_num_threads(args.threads)
        path = resolve_model(args.model)
        tok = AutoTokenizer.from_pretrained(path)
        tok.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        rows = args.group_size * args.prompts
        self.rewards: list[float] = []
        self.group_size = args.group_size
        em_reward = trl_reward(args.reward, args.group_size, self.rewards)

        cfg = GRPOConfig(
            output_dir=str(out),
            use_cpu=True,
            bf16=False,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            per_device_train_batch_size=rows,
            gradient_accumulation_steps=1,
            num_generations=args.group_size,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            beta=0.0,
            epsilon=0.2,
            num_iterations=1,
            loss_type="dapo",
            scale_rewards="group",
            max_steps=args.steps + args.warmup,
            logging_steps=10**6,
            save_strategy="no",
            report_to=[],
            **({} if extra and "seed" in extra else {"seed": 0}),
            dataloader_num_workers=0,
            disable_tqdm=True,
            **(extra or {}),
        )
        data = Dataset.from_dict({"prompt": prompts, "answers": answers})
        self.trainer = GRPOTrainer(
            model=model, reward_funcs=em_reward, args=cfg, train_dataset=data, processing_class=tok
        )
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.t: dict[str, float] = {}
        self.error: BaseException | None = None
        self._instrument()
        side = self

        class Gate(TrainerCallback):
            def on_step_begin(self, *_: Any, **__: Any) -> None:
                side.go.acquire()
                side.t = {"generate": 0.0, "score": 0.0, "prep": 0.0, "prep_fwd": 0.0, "tokens": 0.0}
                side.rewards.clear()
                side.t["t0"] = time.perf_counter()

            def on_step_end(self, *_: Any, **__: Any) -> None:
                side.t["step"] = time.perf_counter() - side.t["t0"]
                side.done.release()

        self.trainer.add_callback(Gate())
        self.thread = threading.Thread(target=self._train, daemon=True)
        self.thread.start()

    def _instrument(self) -> None:
        """Time TRL's generation, reward and preparation calls on this trainer instance."""
        tr, side = self.trainer, self
        in_prep = threading.local()

        def wrap(name: str, key: str) -> None:
            inner = getattr(tr, name)

            def timed(*a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return inner(*a, **kw)
                finally:
                    if key != "prep_fwd" or getattr(in_prep, "on", False):
                        side.t[key] = side.t.get(key, 0.0) + time.perf_counter() - t0

            setattr(tr, name, timed)

        wrap("_generate_single_turn", "generate")
        wrap("_calculate_rewards", "score")
        wrap("_get_per_token_logps_and_entropies", "prep_fwd")  # old/ref log-prob forwards
        prep = tr._generate_and_score_completions

        def prep_timed(*a: Any, **kw: Any) -> Any:
            t0, in_prep.on = time.perf_counter(), True
            try:
                out = prep(*a, **kw)
                side.t["tokens"] += float(out["completion_mask"].sum())
                return out
            finally:
                in_prep.on = False
                side.t["prep"] += time.perf_counter() - t0

        tr._generate_and_score_completions = prep_timed

    def _train(self) -> None:
        try:
            self.trainer.train()
        except BaseException as e:  # reported by step(), in the main thread
            self.error = e
            self.done.release()

    def step(self) -> dict[str, float]:
        self.go.release()
        self.done.acquire()
        if self.error is not None:
            raise RuntimeError(f"TRL's GRPOTrainer failed: {self.error!r}") from self.error
        t = self.t
        update = t["step"] - t["prep"] + t["prep_fwd"]  # forwards, backward, optimizer
        return {
            "generate": t["generate"],
            "score": t["score"],
            "prep": t["prep"] - t["prep_fwd"] - t["generate"] - t["score"],
            "update": update,
            "sync": 0.0,
            "step": t["step"],
            "tokens": t["tokens"],
            "uniform_groups": group_uniform_frac(self.rewards, self.group_size),
            "overhead": (t["step"] - t["generate"] - update) / t["step"],
        }


def trl_prompts(args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    """The split's questions as the harness agent renders them (same dialect, shot, no chat)."""
    examples = load_examples(args.dataset, args.split, data_dir=args.data_dir)
    tok = load_tokenizer(args.model)
    d = resolve_dialect("search_r1", "small")
    prompts = [d.render(e.question, tok, chat=False, few_shot=args.few_shot) for e in examples]
    return prompts, [list(e.answers) for e in examples]


def summarise(name: str, rows: list[dict[str, float]]) -> dict[str, float]:
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["tokens_per_s"] = statistics.median(r["tokens"] / r["step"] for r in rows)
    med["gen_tokens_per_s"] = statistics.median(r["tokens"] / max(1e-9, r["generate"]) for r in rows)
    print(
        f"{name:8s} median over {len(rows)} steps: step={med['step']:.2f}s generate={med['generate']:.2f}s "
        f"score={med['score']:.3f}s prep={med['prep']:.3f}s update={med['update']:.2f}s sync={med['sync']:.2f}s | "
        f"uniform groups={med['uniform_groups']:.2f} | "
        f"generated tokens/step={med['tokens']:.0f} tokens/s of step={med['tokens_per_s']:.1f} "
        f"tokens/s while generating={med['gen_tokens_per_s']:.1f} | overhead={100 * med['overhead']:.1f}% of step"
    )
    return med


def main() -> None:
    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dataset", default="hotpotqa")
    p.add_argument("--split", default="train100")
    p.add_argument("--data-dir", default=str(here.parents[3] / "shared" / "data"))
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument(
        "--reward",
        default="search_r1_format",
        help="a registered reward (training.rewards.REWARDS), both sides; one that varies within a group",
    )
    p.add_argument("--few-shot", action="store_true", help="the dialect's one-shot demonstration in the prompt")
    p.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    p.add_argument("--steps", type=int, default=2, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=1, help="untimed first steps per side")
    p.add_argument(
        "--harness-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides of the harness side's recipe, last (e.g. model.share_prompt=true: each group's prompt once)",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:  # deferred: optional extra (harness[compare])
        import trl  # noqa: F401
        from trl import GRPOTrainer  # noqa: F401
    except Exception as e:  # any import failure: say so and stop
        print(f"TRL is not usable here ({type(e).__name__}: {e}); install the extra: pip install -e '.[compare]'")
        sys.exit(2)

    print(NOT_LIKE_FOR_LIKE, flush=True)
    print(
        f"pinned: {_versions()} model={args.model} group_size={args.group_size} prompts/step={args.prompts} "
        f"max_new_tokens={args.max_new_tokens} few_shot={args.few_shot} lr={args.lr} reward={args.reward} "
        "dtype=float32 AdamW "
        f"threads={args.threads} "
        f"steps={args.steps} (+{args.warmup} warm-up) harness-set={args.harness_set}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer, clock = harness_trainer(args, Path(tmp) / "harness", tuple(args.harness_set))
        prompts, answers = trl_prompts(args)
        trl_side = TRLSide(args, prompts, answers, Path(tmp) / "trl")
        rows: dict[str, list[dict[str, float]]] = {"harness": [], "trl": []}
        sides = (("harness", lambda: harness_step(trainer, clock)), ("trl", trl_side.step))
        for i in range(args.warmup + args.steps):  # A B, then B A: a load trend hits both sides alike
            for name, fn in sides if i % 2 == 0 else sides[::-1]:
                r = fn()
                tag = "warm-up" if i < args.warmup else "timed"
                print(
                    f"{name:8s} step {i + 1} ({tag}): " + " ".join(f"{k}={v:.2f}" for k, v in r.items()),
                    flush=True,
                )
                if i >= args.warmup:
                    rows[name].append(r)
        med = {name: summarise(name, rs) for name, rs in rows.items()}
        for name, rs in rows.items():
            if rs and all(r["uniform_groups"] == 1.0 for r in rs):
                print(
                    f"WARNING: {name}: every group of every timed step scored uniformly under --reward "
                    f"{args.reward}: no step learned; choose a reward that varies (or more steps/samples)"
                )
        print(
            f"ratio harness/TRL: generated tokens/s of step = "
            f"{med['harness']['tokens_per_s'] / med['trl']['tokens_per_s']:.2f}x, step time = "
            f"{med['harness']['step'] / med['trl']['step']:.2f}x"
        )
        trl_side.thread.join(timeout=60)
        trainer.backend.close()


if __name__ == "__main__":
    main()
