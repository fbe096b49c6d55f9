"""What running each group's prompt once (``model.share_prompt``) saves in the RL update's forward and
backward, on a real step's rollouts (a benchmark, not a test).

It reads one step of a run's ``rollouts.jsonl`` (the trajectories as the trainer collated them),
loads the policy as the trainer does (fp32, gradient checkpointing as asked), and times the update's
log-prob forward and its backward over the step's rows in one micro-batch, row by row (A) against
each prompt once (B), alternating A B B A for ``--repeats`` rounds. It prints, per side, the
tokens the decoder ran (padding included: the row-by-row micro-batch pads every row to its longest,
the shared one pads the prompts to theirs and the continuations to theirs), the median seconds,
and how far B's log-probs and gradients lie from A's.

    PYTHONPATH=. .venv/bin/python scripts/perf/share_prompt.py --rollouts RUN/rollouts.jsonl \
        --model MODEL [--step 1] [--threads 2] [--repeats 2] [--no-checkpointing] [--only share]

glibc's mmap threshold is fixed at 1 MB first, as every ``harness`` command fixes it
(``harness.memory.tune_allocator``); ``HARNESS_MALLOC=default`` leaves glibc's own, so the
allocator's share of the time can be measured by alternating the two (``--only`` one side keeps
each process short).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from harness.memory import tune_allocator
from harness.models import resolve_model
from harness.textfiles import read_jsonl
from harness.types import Trajectory
from training.batch import collate
from training.logprobs import window_token_stats


def load_step(path: Path, step: int) -> list[Trajectory]:
    """The trajectories of ``step`` in a run's rollouts.jsonl, in the order the trainer logged them."""
    rows = [r for _, r in read_jsonl(path) if r.get("step") == step]
    if not rows:
        raise SystemExit(f"{path}: no rollouts of step {step}")
    return [Trajectory.from_dict(r["trajectory"]) for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", required=True, type=Path, help="a run's rollouts.jsonl")
    p.add_argument("--step", type=int, default=1)
    p.add_argument("--model", default="smollm2-135m-instruct", help="the policy (name or folder)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="A B B A rounds")
    p.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--only", choices=("rows", "share"), help="time one side (no comparison)")
    args = p.parse_args()
    fixed = tune_allocator()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM  # deferred: seconds at import

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model(args.model), dtype=torch.float32, use_safetensors=True, attn_implementation="sdpa"
    )
    model.config.use_cache = False  # as training.engine loads the policy: no KV cache in training
    model.train()
    if args.checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    trajs = load_step(args.rollouts, args.step)
    batch = collate(trajs)
    offset = max(0, int(batch.response_start.min()) - 1)
    ids, attn = batch.input_ids, batch.attention_mask  # [B, L]
    targets, mask = batch.targets[:, offset:], batch.mask[:, offset:]  # [B, W]
    lengths = attn.sum(1)
    b, L = ids.shape
    groups = batch.group_ids
    prompt = torch.stack([batch.response_start[groups == g].min() for g in groups])  # [B] the prompt each row shares
    firsts = sorted({int(g) for g in groups})
    shared_tokens = len(firsts) * max(int(prompt[groups == g][0]) for g in firsts) + b * int((lengths - prompt).max())
    print(
        f"{b} rows in {len(firsts)} groups, {int(lengths.sum())} real tokens, prompts "
        f"{int(prompt.min())}-{int(prompt.max())} tokens ({int(prompt.sum())} of them in the rows); "
        f"decoder tokens with padding: row by row {b * L}, each prompt once {shared_tokens} "
        f"({shared_tokens / (b * L):.2f}x); threads={args.threads} checkpointing={args.checkpointing} "
        f"mmap threshold={'1 MB' if fixed else 'glibc default'}",
        flush=True,
    )

    def run(share: bool) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        share_by = (batch.response_start, groups) if share else None
        st = window_token_stats(model, ids, attn, targets, mask, 1024, False, 1.0, share_by)
        loss = (st.logp * mask).sum() / mask.sum()
        loss.backward()
        dt = time.perf_counter() - t0
        return dt, st.logp.detach(), [q.grad.detach().clone() for q in model.parameters()]

    times: dict[bool, list[float]] = {False: [], True: []}
    out: dict[bool, tuple[torch.Tensor, list[torch.Tensor]]] = {}
    sides = {"rows": (False,), "share": (True,), None: (False, True)}[args.only]
    run(sides[0])  # warm-up (allocator, kernels)
    for r in range(args.repeats):
        for share in sides if r % 2 == 0 else sides[::-1]:
            dt, logp, grads = run(share)
            times[share].append(dt)
            out[share] = (logp, grads)
            print(f"round {r + 1} {'each prompt once' if share else 'row by row':16s} {dt:.2f} s", flush=True)
    if args.only:
        side = times[sides[0]]
        print(f"median forward+backward, {args.only}: {statistics.median(side):.2f} s over {len(side)} runs")
        return
    keep = mask.bool()
    dlogp = float((out[True][0] - out[False][0])[keep].abs().max())
    dgrad = max(
        float((g1 - g0).abs().max() / g0.abs().max().clamp_min(1e-12))
        for g0, g1 in zip(out[False][1], out[True][1], strict=True)
    )
    a, s = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"median forward+backward: row by row {a:.2f} s, each prompt once {s:.2f} s ({a / s:.2f}x); "
        f"max |delta log-prob| {dlogp:.1e}, max gradient difference {dgrad:.1e} of the tensor's largest"
    )


if __name__ == "__main__":
    main()
