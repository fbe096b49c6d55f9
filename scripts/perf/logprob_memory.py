"""Peak memory and time of one RL micro-step's log-prob path: chunked (``training.logprobs``)
against the full-logits path it replaced (a benchmark, not a test; issue 21).

The model has Qwen2.5's vocabulary (151,936) and a few tiny layers, so the vocabulary projection
and the softmax over it are nearly all the work, as they are for memory at 7B. One micro-step =
forward (one row of ``--tokens`` tokens, every target a model token), RL loss (PPO-clip + k3 KL +
entropy: a term when ``--entropy-coef`` ≠ 0, else a metric as the old trainer computed it every
step) and backward. The full path is the pre-issue-21 code: ``model(...).logits`` [1, T, V],
``token_logprobs`` (fp32 log_softmax) and ``entropy_from_logits``.

Each measurement runs in a fresh subprocess: peak memory = the process's peak RSS (``VmHWM``)
during the first micro-step minus its RSS just before it (tracemalloc does not see torch's
allocations); time = the second micro-step. Paths alternate A B B A per size. A full-path run
whose predicted peak exceeds ``MemAvailable`` is skipped and said so.

    .venv/bin/python scripts/perf/logprob_memory.py [--tokens 2048 4096 8192] [--chunk 1024] [--repeats 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

VOCAB = 151_936  # Qwen2.5's vocabulary (config.json of Qwen/Qwen2.5-7B-Instruct)


def proc_status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def child(path: str, tokens: int, chunk: int, entropy_coef: float, dtype: str, threads: int) -> dict:
    """One measurement in this (fresh) process; returns the figures as a dict."""
    # deferred: torch costs ~1.4 s at import
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # deferred: training.batch imports torch (~1.4 s)
    from training.batch import token_logprobs
    from training.logprobs import window_token_stats
    from training.losses import RLLoss, entropy_from_logits

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=tokens + 1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.train()
    ids = torch.randint(0, VOCAB, (1, tokens + 1))  # [1, L]
    attn = torch.ones_like(ids)
    targets = ids[:, 1:]  # [1, T]
    mask = torch.ones(targets.shape)  # [1, T]
    adv = torch.randn(targets.shape)  # [1, T]
    loss_fn = RLLoss(kl_coef=0.001, entropy_coef=entropy_coef)

    def step() -> None:
        if path == "chunked":
            st = window_token_stats(model, ids, attn, targets, mask, chunk, entropy=True)
            logp, ent = st.logp, st.entropy
        else:  # the pre-issue-21 trainer: full logits, fp32 log_softmax, entropy from the logits
            logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=tokens + 1).logits[:, :-1]  # [1, T, V]
            logp = token_logprobs(logits, targets)  # [1, T]
            with torch.set_grad_enabled(bool(entropy_coef)):
                ent = entropy_from_logits(logits)  # [1, T]
        ref = logp.detach() - 0.01
        loss, _ = loss_fn(logp, logp.detach(), adv, mask, ent, ref)
        loss.backward()
        model.zero_grad(set_to_none=True)

    gc.collect()
    rss0 = proc_status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    peak = proc_status("VmHWM") - rss0
    gc.collect()
    t0 = time.perf_counter()
    step()
    second = time.perf_counter() - t0
    return {"path": path, "tokens": tokens, "peak_bytes": peak, "first_s": first, "time_s": second}


def measure(path: str, args: argparse.Namespace, tokens: int) -> dict:
    cmd = [sys.executable, __file__, "--child", path, "--tokens", str(tokens), "--chunk", str(args.chunk)]
    cmd += ["--entropy-coef", str(args.entropy_coef), "--dtype", args.dtype, "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"path": path, "tokens": tokens, "error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--chunk", type=int, default=1024, help="model.logits_chunk_tokens of the chunked path")
    p.add_argument("--entropy-coef", type=float, default=0.0, help="0: entropy is a metric (no grad), as by default")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1, help="A B B A rounds per size")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tokens[0], args.chunk, args.entropy_coef, args.dtype, args.threads)))
        return
    print(
        f"load average {os.getloadavg()[0]:.2f}; vocab {VOCAB}; dtype {args.dtype}; chunk {args.chunk}; "
        f"entropy_coef {args.entropy_coef}; threads {args.threads}"
    )
    print(f"{'tokens':>6} {'path':>8} {'peak MB':>9} {'time s':>8}")
    results: dict[tuple[int, str], list[dict]] = {}
    per_elem: float | None = None  # full path's peak bytes per (token × vocab), to predict the next size
    for tokens in args.tokens:
        for _ in range(args.repeats):
            for path in ("full", "chunked", "chunked", "full"):
                need = per_elem * tokens * VOCAB if (path == "full" and per_elem) else 0
                if need and need > 0.85 * mem_available():
                    r = {
                        "path": path,
                        "tokens": tokens,
                        "skipped": f"needs ~{need / 2**30:.1f} GiB, MemAvailable {mem_available() / 2**30:.1f} GiB",
                    }
                else:
                    r = measure(path, args, tokens)
                results.setdefault((tokens, path), []).append(r)
                if "peak_bytes" in r:
                    if path == "full":
                        per_elem = max(per_elem or 0.0, r["peak_bytes"] / (tokens * VOCAB))
                    print(f"{tokens:>6} {path:>8} {r['peak_bytes'] / 2**20:>9.0f} {r['time_s']:>8.2f}", flush=True)
                else:
                    print(f"{tokens:>6} {path:>8} {r.get('skipped') or r.get('error')}", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    print("| tokens | full peak MB | chunked peak MB | memory ratio | full s | chunked s | time ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for tokens in args.tokens:
        f = [r for r in results[(tokens, "full")] if "peak_bytes" in r]
        c = [r for r in results[(tokens, "chunked")] if "peak_bytes" in r]
        if not c:
            continue
        cp, ct = min(r["peak_bytes"] for r in c) / 2**20, sorted(r["time_s"] for r in c)[len(c) // 2]
        if f:
            fp, ft = min(r["peak_bytes"] for r in f) / 2**20, sorted(r["time_s"] for r in f)[len(f) // 2]
            print(f"| {tokens} | {fp:.0f} | {cp:.0f} | {fp / cp:.1f}× | {ft:.2f} | {ct:.2f} | {ct / ft:.2f}× |")
        else:
            print(f"| {tokens} | not run (memory) | {cp:.0f} | – | – | {ct:.2f} | – |")


if __name__ == "__main__":
    main()
