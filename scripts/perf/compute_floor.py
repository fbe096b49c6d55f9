"""How close the RL update of SmolLM2-135M runs to this CPU's fp32 matmul speed (issue 45: where
the demo's time goes, and how much software could still take off it). A benchmark, not a test.

It times, on random token ids (the cost does not depend on their values), fp32, no LM head:
1. one matmul of the MLP's shape, [rows x tokens, 576] @ [576, 1536]: the CPU's matmul rate;
2. the model body's forward, and forward + backward with gradient checkpointing off and on
   (A B B A), as the trainer's update runs them,
and prints each pass's FLOPs (counted from the model's own linear layers and attention), seconds
and rate, the share of the matmul rate it reaches, and whether checkpointing changed a gradient
bit. A pass near that rate cannot be made much faster by software; only fewer FLOPs (no
recomputation, fewer tokens) or a faster number format.

    PYTHONPATH=. .venv/bin/python scripts/perf/compute_floor.py [--rows 8] [--tokens 448] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch


def matmul_gflops(n: int, k: int, m: int, repeats: int) -> float:
    """fp32 GFLOP/s of [n, k] @ [k, m] (best of ``repeats`` after one warm-up)."""
    a, b = torch.randn(n, k), torch.randn(k, m)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n * k * m / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def body_flops(model: torch.nn.Module, rows: int, tokens: int) -> float:
    """Forward FLOPs of the decoder body over [rows, tokens]: 2 per weight of every linear layer per
    token, and attention's QK^T and AV over the whole (masked) square, 4 · tokens · head dims each."""
    cfg = model.config
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    attn = 4 * tokens * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    return rows * tokens * (2 * linear + attn * cfg.num_hidden_layers)


def train_pass(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Seconds of one forward + backward of the body (loss: the mean square of the last hidden
    states); the gradients stay in the parameters' ``.grad``."""
    model.train()
    model.zero_grad(set_to_none=True)

    def run() -> None:
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # [rows, tokens, 576]
        hidden.float().pow(2).mean().backward()

    return _timed(run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=448)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    from training.config import ModelConfig
    from training.engine import build_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # The trainer's own loader, once per side: the same weights, checkpointing as a recipe sets it.
    models = {ckpt: build_model(ModelConfig(path=args.model, gradient_checkpointing=ckpt)) for ckpt in (False, True)}
    model = models[False]
    n = args.rows * args.tokens
    peak = matmul_gflops(n, model.config.hidden_size, model.config.intermediate_size, args.repeats)
    fwd = body_flops(model, args.rows, args.tokens)
    ids = torch.randint(0, model.config.vocab_size, (args.rows, args.tokens))
    print(f"{args.model}: {args.rows} rows x {args.tokens} tokens, fp32, {args.threads} thread(s)")
    print(f"matmul [{n}, {model.config.hidden_size}] @ [{model.config.hidden_size}, "
          f"{model.config.intermediate_size}]: {peak:.1f} GFLOP/s")  # fmt: skip
    with torch.no_grad():
        model.eval()
        model.model(input_ids=ids[:1, :16])  # warm-up
        s = min(_timed(lambda: model.model(input_ids=ids, use_cache=False)) for _ in range(args.repeats))
    print(
        f"forward (no grad): {fwd / 1e9:.0f} GFLOP in {s:.2f} s = {fwd / s / 1e9:.1f} GFLOP/s, "
        f"{fwd / s / 1e9 / peak:.0%} of the matmul rate"
    )
    times: dict[bool, list[float]] = {False: [], True: []}
    grads: dict[bool, list[torch.Tensor]] = {}
    for ckpt in (False, True, True, False):  # A B B A
        times[ckpt].append(train_pass(models[ckpt], ids))
        grads.setdefault(ckpt, [p.grad.clone() for p in models[ckpt].parameters() if p.grad is not None])
    same = all(torch.equal(a, b) for a, b in zip(grads[False], grads[True], strict=True))
    print(f"gradients with checkpointing on and off: {'bitwise equal' if same else 'NOT equal'}")
    for ckpt, ts in times.items():
        flops = fwd * (4 if ckpt else 3)  # backward = 2 forwards; checkpointing recomputes one more
        best = min(ts)
        print(
            f"forward + backward, checkpointing {'on ' if ckpt else 'off'}: {flops / 1e9:.0f} GFLOP in "
            f"{' / '.join(f'{t:.2f}' for t in ts)} s = {flops / best / 1e9:.1f} GFLOP/s, "
            f"{flops / best / 1e9 / peak:.0%} of the matmul rate; {best / n * 1e3:.2f} ms a token"
        )


if __name__ == "__main__":
    main()
