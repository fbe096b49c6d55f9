"""``harness train --plan``'s estimate against the measured peak of real training micro-steps
(a benchmark, not a test; issue 21). SmolLM2 (the embedded model, ``smollm2-135m-instruct``)
in a DeepSpeed engine (ZeRO-0, our AdamW), a fixed batch of ``--micro-batch`` rows × ``--seq``
tokens, every target a model token, two micro-steps of the RL loss through the chunked
log-prob path, each followed by an optimizer step.

Peak: on CPU the process's peak RSS (``VmHWM``) minus its RSS before the model is built (a
fresh subprocess); on CUDA ``torch.cuda.max_memory_allocated``. fp32 on CPU, bf16 on CUDA.

    .venv/bin/python -m scripts.perf.plan_memory [--micro-batch 2] [--seq 512] [--checkpointing]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from harness.config import compose
from scripts.perf.logprob_memory import proc_status
from training.config import ModelConfig, OptimConfig, TrainConfig
from training.memory_plan import PROMPT_TOKENS, plan

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]  # the repository root


def recipe(micro_batch: int, seq: int, bf16: bool, checkpointing: bool) -> list[str]:
    """Overrides of the SmolLM2 GRPO recipe that make the plan describe exactly the measured step."""
    return [
        "model.path=smollm2-135m-instruct",
        f"model.dtype={'bfloat16' if bf16 else 'float32'}",
        f"model.gradient_checkpointing={str(checkpointing).lower()}",
        f"optim.bf16={str(bf16).lower()}",
        "optim.zero_stage=0",
        f"optim.micro_batch_size={micro_batch}",
        "algo.kl_coef=0.0",
        # The plan's sequence is min(prompt + max_total_tokens, algo.max_len): exactly seq, also
        # under the prompt's PROMPT_TOKENS (the agent's token budget is at least 1).
        f"algo.max_len={seq}",
        f"rollout.agent.max_total_tokens={max(1, seq - PROMPT_TOKENS)}",
    ]


def planned(micro_batch: int, seq: int, bf16: bool, checkpointing: bool) -> float:
    """The plan's per-rank total (bytes) for one GPU."""
    cfg = compose(
        TrainConfig, [ROOT / "configs/train/smollm2_cpu_grpo.yaml"], recipe(micro_batch, seq, bf16, checkpointing)
    )
    return plan(cfg, gpus=1, gpu_mem_gb=1000.0).total


def measure(micro_batch: int, seq: int, checkpointing: bool, device: str) -> float:
    """Peak bytes of two RL micro-steps + optimizer steps (see the module docstring)."""
    # deferred: torch costs ~1.4 s at import
    import torch

    # deferred: training.engine imports torch (~1.4 s)
    from training.engine import build_model, initialize
    from training.logprobs import window_token_stats
    from training.losses import RLLoss

    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = proc_status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
    model = build_model(ModelConfig(dtype="bfloat16" if cuda else "float32", gradient_checkpointing=checkpointing))
    engine = initialize(model, OptimConfig(micro_batch_size=micro_batch, bf16=cuda), 1e-6, micro_batch)
    dev = engine.device
    vocab = model.config.vocab_size
    torch.manual_seed(0)
    for _ in range(2):
        ids = torch.randint(0, vocab, (micro_batch, seq), device=dev)  # [b, L]
        attn = torch.ones_like(ids)
        mask = torch.ones(micro_batch, seq - 1, device=dev)  # [b, T]
        st = window_token_stats(engine, ids, attn, ids[:, 1:], mask, 1024)
        loss, _ = RLLoss()(st.logp, st.logp.detach(), torch.ones_like(mask), mask)
        engine.backward(loss)
        engine.step()
    if cuda:
        return float(torch.cuda.max_memory_allocated() - base)
    return float(proc_status("VmHWM") - base)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    # deferred: torch costs ~1.4 s at import
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.child:
        print(json.dumps({"peak": measure(args.micro_batch, args.seq, args.checkpointing, device)}))
        return
    # a fresh process for a clean peak; a module run from the repository root, like this one, so that
    # ``scripts.perf`` imports without PYTHONPATH
    cmd = [sys.executable, "-m", "scripts.perf.plan_memory", "--child", "--device", device]
    cmd += ["--micro-batch", str(args.micro_batch), "--seq", str(args.seq)]
    cmd += ["--checkpointing"] if args.checkpointing else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    est = planned(args.micro_batch, args.seq, device == "cuda", args.checkpointing)
    print(
        f"SmolLM2 on {device}, micro-batch {args.micro_batch} × {args.seq} tokens, checkpointing "
        f"{args.checkpointing}: measured peak {peak / GiB:.2f} GiB, --plan {est / GiB:.2f} GiB "
        f"(plan / measured = {est / peak:.2f})"
    )


if __name__ == "__main__":
    main()
